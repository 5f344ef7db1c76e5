"""Training in several processes: torchrun's variables, the process group, each rank's share of a batch.

``torchrun --nproc_per_node N -m capsnet train ...`` starts N processes and
gives each the launcher's variables (``LAUNCHER_VARIABLES``); ``capsnet.train.fit``
reads them (``launcher``), joins the process group (``join``: NCCL on CUDA,
each rank on ``cuda:LOCAL_RANK``, gloo on the CPU) and trains the model
wrapped in PyTorch's ``DistributedDataParallel``, which averages the
gradients. Nothing here talks to another process itself: the collectives are
``torch.distributed``'s.

The batch stays global: every rank draws the same seeded epoch order and
makes the same global batch (same augmentation draws as one process), then
trains on its own contiguous slice of it (``shard``). With the loss a mean
over the batch and DDP's average over ranks, one step is the one-process step
(``share_weight`` keeps this exact when the last batch does not divide evenly).
The weighted cross-entropy's foreground weight is the whole batch's too
(``losses.batch_foreground_weight``). Not exact, as the README says: dropout
and BatchNorm on CPUs (per-process statistics).
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import logging
import os
import signal
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Any, Mapping

import torch
import torch.distributed as dist

from ._signals import handled

__all__ = ["LAUNCHER_VARIABLES", "LAUNCH_HINT", "DistributedError", "Launch", "launcher", "identified", "join", "agree", "leave",
           "shard",
           "share_weight", "backend_for", "rank_device"]

# What torchrun (torch.distributed.run) sets in every process it starts; init_process_group("env://") reads them.
LAUNCHER_VARIABLES = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
LAUNCH_HINT = ("launch with `torchrun --nproc_per_node N -m capsnet train ...` (add --nnodes, --node_rank and "
               "--rdzv-endpoint, or --master_addr, for several machines)")


class DistributedError(ValueError):
    """The launcher's variables are missing, incomplete or wrong, or the devices do not fit the processes."""


class PeerLostError(DistributedError):
    """Another process of the run stopped (its error, a kill) and this one cannot go on without it."""


@dataclass(frozen=True)
class Launch:
    """This process's place among those torchrun started."""

    rank: int  # 0..world_size-1, over every machine
    world_size: int  # processes in all
    local_rank: int  # 0..local_world_size-1 on this machine
    local_world_size: int  # processes on this machine (torchrun's LOCAL_WORLD_SIZE; world_size when absent)
    restart: int = 0  # torchrun's TORCHELASTIC_RESTART_COUNT: 0 at launch, N after its Nth restart (--max-restarts)
    max_restarts: int = 0  # torchrun's TORCHELASTIC_MAX_RESTARTS
    # TORCHELASTIC_USE_AGENT_STORE: torchrun's agent hosts the store at MASTER_ADDR:MASTER_PORT, one store for the
    # whole launch, its restarts included (workers come and go, the agent stays)
    agent_store: bool = False
    launch_id: str | None = None  # this launch's own id, the same in its restarts (``identified``); None: unknown

    @property
    def one_machine(self) -> bool:
        """Every process on this machine (no --nnodes above 1)."""
        return self.world_size == self.local_world_size

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that writes checkpoints, metrics and progress."""
        return self.rank == 0

    @property
    def on_main_machine(self) -> bool:
        """On rank 0's machine, the first (torchrun numbers each machine's processes after the machines before it, so
        rank equals local rank there alone)."""
        return self.rank == self.local_rank


def _integer(env: Mapping[str, str], name: str, minimum: int) -> int:
    text = env[name]
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise DistributedError(f"the launcher variable {name}={text!r} is not an integer >= {minimum}; "
                               f"{LAUNCH_HINT} rather than setting it by hand")
    return value


def launcher(env: Mapping[str, str] | None = None, *, required: bool = False) -> Launch | None:
    """This process's ``Launch`` when torchrun started it, None when none of its variables are set.

    Some variables but not all, values that are not ranks, or ``required``
    with none set: a ``DistributedError`` that names them and how to launch.
    """
    env = os.environ if env is None else env
    present = [v for v in LAUNCHER_VARIABLES if env.get(v, "") != ""]
    if not present:
        if required:
            raise DistributedError(f"--distributed needs the torchrun launcher, but none of its variables "
                                   f"({', '.join(LAUNCHER_VARIABLES)}) are set; {LAUNCH_HINT}")
        return None
    missing = [v for v in LAUNCHER_VARIABLES if v not in present]
    if missing:
        raise DistributedError(f"the torchrun launcher's variables are incomplete: {', '.join(present)} "
                               f"{'is' if len(present) == 1 else 'are'} set but {', '.join(missing)} "
                               f"{'is' if len(missing) == 1 else 'are'} not; {LAUNCH_HINT}, or unset "
                               f"{', '.join(present)} to train in one process")
    world, rank, local_rank = _integer(env, "WORLD_SIZE", 1), _integer(env, "RANK", 0), _integer(env, "LOCAL_RANK", 0)
    local_world = _integer(env, "LOCAL_WORLD_SIZE", 1) if env.get("LOCAL_WORLD_SIZE") else world
    if rank >= world or local_rank >= local_world:
        raise DistributedError(f"RANK={rank} and LOCAL_RANK={local_rank} must be below WORLD_SIZE={world} and "
                               f"LOCAL_WORLD_SIZE={local_world}; {LAUNCH_HINT} rather than setting them by hand")
    if _integer(env, "MASTER_PORT", 1) > 65535:  # torch said "port must have value from 0 to 65535" of no variable
        raise DistributedError(f"the launcher variable MASTER_PORT={env['MASTER_PORT']!r} is not a port (1 to "
                               f"65535); {LAUNCH_HINT} rather than setting it by hand")
    restart, most = (_integer(env, name, 0) if env.get(name) else 0
                     for name in ("TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS"))
    return Launch(rank, world, local_rank, local_world, restart, most,
                  env.get("TORCHELASTIC_USE_AGENT_STORE") == "True")


LAUNCH_ID_KEY = "capsnet/launch_id"  # in torchrun's agent store: the launch's id, drawn by its first process


def _agent_store(launch: Launch) -> dist.TCPStore:
    """A client of the store torchrun's agent hosts for the whole launch (``launch.agent_store``)."""
    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), launch.world_size,
                         is_master=False, timeout=process_group_timeout())


def identified(launch: Launch) -> Launch:
    """``launch`` with its ``launch_id``: a random id the first of its processes puts in torchrun's agent store,
    which outlives the workers, so every process of the launch, and of each of its restarts, reads the same one,
    and another launch (another agent, another store) draws its own, whatever its --rdzv-id. Without an agent
    store (a rendezvous that does not share one), ``launch`` as it is: no id."""
    if not launch.agent_store:
        return launch
    drawn = _agent_store(launch).compare_set(LAUNCH_ID_KEY, "", uuid.uuid4().hex)  # the first one set stays
    return dataclasses.replace(launch, launch_id=drawn.decode())


def backend_for(device: torch.device) -> str:
    """NCCL for CUDA devices, gloo for the CPU."""
    return "nccl" if device.type == "cuda" else "gloo"


def rank_device(device: torch.device, launch: Launch) -> torch.device:
    """The device of this rank: ``cuda:LOCAL_RANK`` when ``device`` is CUDA without an index, else ``device``.

    With one process on the machine, an explicit ``cuda:N`` is that GPU (one
    process per machine across several). With more, an index that is not this
    rank's, or more processes than GPUs, is a ``DistributedError`` (NCCL
    cannot share one GPU between ranks).
    """
    if device.type != "cuda":
        return device
    count = torch.cuda.device_count()
    if launch.local_world_size == 1 and device.index is not None:
        if device.index >= count:
            raise DistributedError(f"--device {device}: this machine has {count} GPU(s), cuda:0 to cuda:{count - 1}")
        return device
    if launch.local_rank >= count:
        raise DistributedError(f"LOCAL_RANK {launch.local_rank} has no GPU: this machine has {count}; start at most "
                               f"{count} processes on it (--nproc_per_node {count}), or train on --device cpu")
    if device.index is not None and device.index != launch.local_rank and launch.local_world_size > 1:
        raise DistributedError(f"--device {device} puts every process on one GPU; use --device cuda (each process "
                               f"takes cuda:LOCAL_RANK)")
    return torch.device("cuda", launch.local_rank)


_joins = 0  # the process groups this process has joined (``join``)


def join(launch: Launch, device: torch.device) -> tuple[torch.device, bool]:
    """Join the process group of ``launch`` on ``device``: (this rank's device, whether this call created the group).

    A group the caller initialised already is used as it is (and is theirs to destroy).
    """
    device = rank_device(device, launch)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if dist.is_initialized():
        if dist.get_world_size() != launch.world_size or dist.get_rank() != launch.rank:
            raise DistributedError(f"the process group already initialised is rank {dist.get_rank()} of "
                                   f"{dist.get_world_size()}, but the launcher says rank {launch.rank} of "
                                   f"{launch.world_size}")
        return device, False
    backend = backend_for(device)
    if backend == "nccl" and not dist.is_nccl_available():
        raise DistributedError("this PyTorch build has no NCCL, which training on several GPUs needs; install a "
                               "CUDA build of PyTorch, or train on --device cpu (gloo)")
    try:
        with _terminable():
            _init_group(launch, backend)
    except dist.DistError as e:  # no peer came (variables set by hand, a process that never started): a traceback
        # of torch's store after the whole timeout (6 hours by default), or C++ frame dumps
        where = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
        said = f"({type(e).__name__}: {str(e).strip().splitlines()[0][:160]})"
        if "EADDRINUSE" in str(e):  # rank 0 could not host the store: not a peer's absence
            raise DistributedError(f"process {launch.rank} of {launch.world_size} could not host the process "
                                   f"group's store at MASTER_ADDR:MASTER_PORT {where}: another program holds that "
                                   f"port; give every process of the run another MASTER_PORT {said}") from None
        within, longer = "", ""
        if not launch.agent_store and _joins == 1:  # _meeting_store's wait
            within = f" within {join_timeout().total_seconds() / 60:g} minutes"
            longer = f" (or set {JOIN_TIMEOUT_ENV} to wait longer for processes started apart)"
        raise DistributedError(f"process {launch.rank} of {launch.world_size} could not form the process group at "
                               f"MASTER_ADDR:MASTER_PORT {where}: the other processes never joined it{within} "
                               f"(started without torchrun's agent, or not started); {LAUNCH_HINT}, every process "
                               f"of the run with the same settings{longer} {said}") from None
    return device, True


def _terminable() -> contextlib.AbstractContextManager[None]:
    """SIGTERM's and Ctrl-C's defaults, the process ended at once, while the process group forms: a handler of
    Python's (capsnet's commands raise KeyboardInterrupt on SIGTERM; Python's on Ctrl-C) runs only once the C++
    wait for the peers returns, so a launch whose other process stopped before joining lasted torchrun's 30 s grace
    until its SIGKILL, and Ctrl-C did nothing for the whole join timeout (15 minutes) in a process started by hand
    (a review, 2026-12-04). Nothing of the run is written while it forms. Off the main thread, or for a signal
    that is ignored, nothing changes."""
    return handled((signal.SIGTERM, signal.SIGINT), signal.SIG_DFL)


def _init_group(launch: Launch, backend: str) -> None:
    """``init_process_group`` for ``launch``: through torchrun's agent store under keys of this group's own where
    the store may hold another group's (``join``), else as torchrun's environment says."""
    global _joins
    _joins += 1
    if launch.agent_store and (_joins > 1 or launch.restart and launch.one_machine):
        # a restart, or a second group in one process (fit called again), joins through the launch's one agent store,
        # which still holds the keys of the group before (the dead processes' addresses, which gloo then dialled:
        # "Connection refused"; or the first group's, where a rank then waited for ever): keys of its own. The
        # attempt on one machine only: over several, each machine's agent counts its restarts apart (one whose
        # processes were well starts them again as restart 0), so the machines would not agree on its keys; every
        # process counts its own joins alike
        attempt = launch.restart if launch.one_machine else 0
        store = dist.PrefixStore(f"capsnet/attempt{attempt}/join{_joins}/", _agent_store(launch))
        dist.init_process_group(backend, store=store, rank=launch.rank, world_size=launch.world_size,
                                timeout=process_group_timeout())
    elif launch.agent_store:  # torchrun's agent met its peers before it started this process
        dist.init_process_group(backend, init_method="env://", rank=launch.rank, world_size=launch.world_size,
                                timeout=process_group_timeout())
    else:  # started without an agent (by hand, a scheduler's script): the peers may never come
        # keys of this join's own: a store rank 0 hosts again in one process may be the same server (multi_tenant)
        store = dist.PrefixStore(f"capsnet/join{_joins}/default_pg", _meeting_store(launch))
        dist.init_process_group(backend, store=store, rank=launch.rank, world_size=launch.world_size,
                                timeout=process_group_timeout())


def _meeting_store(launch: Launch) -> dist.TCPStore:
    """The store env:// would make (rank 0 hosts it at MASTER_ADDR:MASTER_PORT; libuv's unless USE_LIBUV=0), but
    waiting only ``CAPSNET_DIST_JOIN_TIMEOUT_MIN`` minutes for the processes to meet in it at the launch's first
    group (rank 0 for every other, the others for rank 0), then the collectives' timeout: env:// waited the
    collectives' (6 hours by default) before saying that a peer never came. A later group in the same processes (fit
    called again) waits the collectives' timeout: rank 0 may have worked alone in between.

    Rank 0 marks its store with the number of the join once every process has come. Another rank that reaches a
    store marked with an earlier join (rank 0's store of the group before, not yet closed when this rank left that
    group and came back) lets it go and dials again, as it does when that store closes under it: it would have read
    the earlier group's addresses there and formed no group with rank 0, which then waited for it the whole timeout (a
    flaky test under load, 2026-12-04). A store not marked yet is this join's: a failure while waiting in it is rank
    0's, raised at once."""
    wait = join_timeout() if _joins == 1 else process_group_timeout()
    deadline = time.monotonic() + wait.total_seconds()
    mine = str(_joins).encode()
    while True:
        left = datetime.timedelta(seconds=max(deadline - time.monotonic(), 1.0))
        try:
            store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), launch.world_size,
                                  is_master=launch.rank == 0, timeout=left, multi_tenant=True,
                                  use_libuv=os.environ.get("USE_LIBUV", "1") != "0")
        except dist.DistNetworkError:  # an earlier group's store closing while this rank counted itself in it
            if launch.rank == 0 or time.monotonic() > deadline:
                raise
            time.sleep(0.05)
            continue
        if launch.rank == 0:
            store.set(_JOIN_KEY, mine)
            break
        try:
            marked = store.check([_JOIN_KEY])
            seen = store.get(_JOIN_KEY) if marked else None
        except dist.DistError:  # an earlier group's store closed under this read
            marked, seen = True, None
        if not marked:  # this join's store: wait for rank 0 to mark it (a failure here is rank 0's: raised)
            seen = store.get(_JOIN_KEY)
        if seen == mine:
            break
        if seen is not None and (not marked or int(seen) > _joins):
            raise dist.DistStoreError(f"process 0 hosts its join {int(seen)} of a process group in this run, this "
                                      f"process its join {_joins}: every process of the run must join as often")
        del store  # an earlier join's: dial again
        if time.monotonic() > deadline:
            raise dist.DistStoreError(f"found only the store of an earlier group at MASTER_ADDR:MASTER_PORT, not "
                                      f"that of join {_joins}")
        time.sleep(0.05)
    store.set_timeout(process_group_timeout())
    return store


_JOIN_KEY = "capsnet/join"  # in the meeting store: the number of rank 0's join that hosts it


TIMEOUT_ENV = "CAPSNET_DIST_TIMEOUT_MIN"
DEFAULT_TIMEOUT_MIN = 6 * 60  # rank 0 scores the held-out set alone: EM on smallNORB takes hours on one CPU thread
JOIN_TIMEOUT_ENV = "CAPSNET_DIST_JOIN_TIMEOUT_MIN"
DEFAULT_JOIN_TIMEOUT_MIN = 15  # torchrun's own rendezvous waits 900 s for its peers


def process_group_timeout() -> datetime.timedelta:
    """How long a rank waits in a collective for the others: ``CAPSNET_DIST_TIMEOUT_MIN`` minutes, 6 hours by
    default. Rank 0 evaluates (and downloads) alone while the others wait; torch's default (30 minutes for gloo, 10
    for NCCL) ended runs whose evaluation took longer, after their first epoch."""
    return _minutes(TIMEOUT_ENV, DEFAULT_TIMEOUT_MIN, 1, "a process waits for the others")


def join_timeout() -> datetime.timedelta:
    """How long a process started without torchrun's agent waits for the others to join the process group:
    ``CAPSNET_DIST_JOIN_TIMEOUT_MIN`` minutes, 15 by default."""
    return _minutes(JOIN_TIMEOUT_ENV, DEFAULT_JOIN_TIMEOUT_MIN, 0.01, "a process waits for the others to start")


def _minutes(name: str, default: float, least: float, what: str) -> datetime.timedelta:
    """The environment variable ``name`` as minutes from ``least`` to 1,000,000 (``default`` when unset), or a
    DistributedError naming it."""
    text = os.environ.get(name, "").strip()
    if not text:
        return datetime.timedelta(minutes=default)
    try:
        minutes = float(text)
    except ValueError:
        minutes = float("nan")
    if not least <= minutes <= 10 ** 6:
        raise DistributedError(f"{name}={text!r}: give the minutes {what}, a number from {least:g} to 1,000,000 "
                               f"(default {default:g})")
    return datetime.timedelta(minutes=minutes)


def agree(fingerprint: dict[str, Any], launch: Launch) -> None:
    """Every rank's ``fingerprint`` (flat: a name for each setting, data count and digest, the resumed point)
    gathered and compared with rank 0's; a ``DistributedError`` on every rank, naming what differs and where, when
    one differs. Ranks started with other settings or data (another --seed, another --train-size, another data
    folder or a stale --out on one machine) trained silently on mixed data, or hung in a collective one of them
    never reached."""
    gathered: list[Any] = [None] * launch.world_size
    dist.all_gather_object(gathered, fingerprint)
    first = gathered[0]
    for rank, theirs in enumerate(gathered[1:], start=1):
        differ = [k for k in first if theirs.get(k) != first[k]] + [k for k in theirs if k not in first]
        if differ:
            shown = "; ".join(f"{k}: {theirs.get(k)!r} where process 0 has {first.get(k)!r}" for k in differ[:4])
            more = f" (and {len(differ) - 4} more)" if len(differ) > 4 else ""
            raise DistributedError(f"the processes of this run disagree, process {rank} against process 0: "
                                   f"{shown}{more}; start every process with the same command, on the same data "
                                   f"and the same --out (a folder every machine reads alike)")


def barrier(device: torch.device) -> None:
    """Wait for every rank (NCCL: on this rank's GPU)."""
    dist.barrier(device_ids=[device.index]) if device.type == "cuda" else dist.barrier()


# True once this process destroyed a process group it created: ``python -m capsnet`` then ends with os._exit, past
# the interpreter's teardown, where gloo's threads abort a finished CPU run now and then (SIGABRT, "terminate called
# without an active exception": seen in about a quarter of 2-process runs, and in a 10-line gloo script of torch's
# own calls), and torchrun reports the whole run failed though every rank finished and rank 0 saved.
LEFT_A_GROUP = False


def exit_process(code: int) -> None:
    """End the process with ``code``: after a process group was left (``LEFT_A_GROUP``) by os._exit, with stdout,
    stderr and logging flushed first, before gloo's teardown at interpreter exit can abort the finished run; else by
    sys.exit. ``python -m capsnet`` ends here, and so must any script that runs ``capsnet.cli.main`` under torchrun
    (atexit handlers do not run after os._exit: do their work first)."""
    if LEFT_A_GROUP:
        sys.stdout.flush()
        sys.stderr.flush()
        logging.shutdown()
        os._exit(code)
    sys.exit(code)


def leave(created: bool, device: torch.device | None = None) -> None:
    """Destroy the process group if ``join`` created it. ``device``: the ranks ended together (no error), so they
    first meet at a barrier on it and tear their connections down together, with nothing of any rank's still in
    flight; None (a rank failed, the others may be gone): destroyed at once."""
    global LEFT_A_GROUP
    if created and dist.is_initialized():
        if device is not None:
            barrier(device)
        dist.destroy_process_group()
        LEFT_A_GROUP = True


def shard(n: int, rank: int, world_size: int) -> tuple[int, int]:
    """Rank ``rank``'s slice [start, stop) of a batch of ``n``: contiguous, disjoint, covering 0..n between them.

    Sizes differ by at most one, the larger first, so rank 0 always has an
    example when ``n >= 1``; ranks past ``n`` get an empty slice.
    """
    return -(-rank * n // world_size), -(-(rank + 1) * n // world_size)


def share_weight(start: int, stop: int, n: int, world_size: int) -> float:
    """The factor on a rank's mean loss that makes DDP's average of gradients the gradient of the batch mean.

    DDP averages over ranks: (1/W) sum_r grad(w_r * mean_r) equals
    grad(mean over n) when w_r = n_r * W / n. It is exactly 1.0 when the
    batch divides evenly; 0 for a rank with no examples.
    """
    return (stop - start) * world_size / n

"""Probe: does channels-last, or another way of forming the votes, speed up the paper's CapsNet training step?

    PYTHONPATH=src python3 benchmarks/speed_variants.py --device cuda --batch-size 128 512 \
        --compile reduce-overhead --dtype bf16 --repeats 30 --json out.json

The leads from the H100 profile (benchmarks/results/gpu-h100-2026-11-25/extra/): at batch 512 cuDNN convolutions
take about 40% of the GPU time and a legacy cuBLAS batched product 13%, plausibly the votes' ``bmm`` (1,152 products
of inner size 8). Variants, each the same maths as the shipped model (checked below against it before timing):

- ``base``: the shipped model.
- ``channels-last``: model and images in channels-last memory format (NHWC convolutions).
- ``mulsum``: votes as a broadcast product summed over the 8 input dimensions, which Inductor can generate as one
  reduction kernel instead of calling cuBLAS.
- ``channels-last+mulsum``: both.
- ``cudnn-benchmark``: ``torch.backends.cudnn.benchmark`` on while the variant is built, compiled and run, so cuDNN
  times its algorithms for these convolution shapes (9x9 kernels) and keeps the fastest, instead of its heuristic's.

- ``whole-step-graph`` (CUDA only): the whole training step, forward, loss, backward and Adam (capturable), captured
  in one CUDA graph with ``torch.cuda.graph`` and replayed; the model inside compiled with Inductor's default mode
  (``--compile none``: eager). CUDA graphs through ``--compile reduce-overhead`` graph the model's forward and backward
  but leave the loss, the autograd engine between them and Adam to launch kernel by kernel: at batch 128 the H100's
  compiled step was 2.3 ms of GPU work in a 6.1 ms step.

- ``gemm-primary``: the primary capsules' 9x9 stride-2 convolution as one matrix product over the unfolded
  windows (``F.unfold``, then (B, 36, 20736) @ (20736, 256)), its output already in capsule order. On an H200 the
  bench's conv floor (the two convolutions alone) trains at 49,900 images/s at batch 128, a few percent of the card's
  bf16 rate: the convolutions, not the capsules, bound that batch size.
- ``gemm-convs``: both convolutions (Conv1 and the primary capsules') as matrix products over unfolded windows
  (``gemm_conv2d`` in place of ``nn.Conv2d.forward``).

(H200, 2026-11-25: channels-last within 0.4% of base at batch 128 and 512; the mulsum rows of that run timed the
base's graph, since the variant was then a method patched on the class, which compiled code does not see. 2026-11-26,
batch 128: cudnn-benchmark 1.02x, whole-step-graph 1.16x; gemm-primary and gemm-convs came after.)
Each variant's maths lives in classes of its own, given to its model's modules (``apply_variant``).
A variant that fails to build is reported as failed and left out; the others are still timed.

All variants of one batch size are timed in one process, taking turns (``capsnet.bench.alternate``), so their
ratios are paired; the step is `capsnet bench`'s training step (margin + reconstruction loss, fused Adam on CUDA).
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
import statistics
import sys
import time
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from capsnet.bench import _Runner, alternate
from capsnet.layers.dense import DenseCaps
from capsnet.layers.primary import PrimaryCaps
from capsnet.ops import squash
from capsnet.models.capsnet import CapsNet, CapsNetConfig, capsnet_loss
from capsnet.runtime import COMPILE_MODES, compile_model

VARIANTS = ("base", "channels-last", "mulsum", "channels-last+mulsum", "cudnn-benchmark", "whole-step-graph",
            "gemm-primary", "gemm-convs")


def mulsum_votes(self: DenseCaps, u: torch.Tensor) -> torch.Tensor:
    """``DenseCaps.votes`` as a broadcast product summed over Din: (B, I, Din, 1) * (I, Din, J*Dout) -> (B, I, J, Dout)."""
    self._check(u)
    B, I, Din = u.shape
    W = self.weight.reshape(Din, I, -1).transpose(0, 1)  # (I, Din, J*Dout)
    u_hat = (u.unsqueeze(-1) * W).sum(dim=2)  # (B, I, J*Dout)
    return u_hat.view(B, I, self.out_caps, self.out_dim)


def gemm_primary(self: PrimaryCaps, x: torch.Tensor) -> torch.Tensor:
    """``PrimaryCaps.forward`` with its convolution as one matrix product over the unfolded windows:
    (B, L, C*k*k) @ (C*k*k, types*D) -> (B, L, types*D), already capsule-minor (no permute of the output). On an H200
    the 9x9 stride-2 convolution's cuDNN kernels run at a few percent of the card's bf16 rate (the bench's conv floor):
    as a plain GEMM of (B*36) x 20736 x 256 the same work may run nearer cuBLAS's rate."""
    conv = self.conv
    k, st = conv.kernel_size, conv.stride
    cols = F.unfold(x, k, stride=st)  # (B, C*k*k, L)
    B, _, L = cols.shape
    y = F.linear(cols.transpose(1, 2), conv.weight.flatten(1), conv.bias)  # (B, L, types*D), bias in its dtype
    y = y.view(B, L, self.types, self.dim).transpose(1, 2)  # (B, types, L, D): (type, row, column) order
    return squash(y.reshape(B, self.types * L, self.dim))


def gemm_conv2d(self: torch.nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    """``nn.Conv2d.forward`` as one matrix product over the unfolded windows (zero padding, groups 1; any other
    convolution runs as before): (B, L, C*k*k) @ (C*k*k, O) -> (B, O, H', W'). For Conv1 (1 -> 256 channels, 9x9) cuDNN
    has a single input channel to put on its tensor cores; as a GEMM the 81 taps are the inner dimension."""
    if self.groups != 1 or self.padding_mode != "zeros" or isinstance(self.padding, str):
        return torch.nn.Conv2d.forward(self, x)
    k, st, pad, dil = self.kernel_size, self.stride, self.padding, self.dilation
    cols = F.unfold(x, k, dilation=dil, padding=pad, stride=st)  # (B, C*k*k, L)
    H = (x.shape[2] + 2 * pad[0] - dil[0] * (k[0] - 1) - 1) // st[0] + 1
    W = (x.shape[3] + 2 * pad[1] - dil[1] * (k[1] - 1) - 1) // st[1] + 1
    y = F.linear(cols.transpose(1, 2), self.weight.flatten(1), self.bias)  # (B, L, O), bias in the product's dtype
    return y.transpose(1, 2).reshape(x.shape[0], -1, H, W)


class _MulsumDenseCaps(DenseCaps):
    votes = mulsum_votes


class _GemmPrimaryCaps(PrimaryCaps):
    forward = gemm_primary


class _GemmConv2d(torch.nn.Conv2d):
    forward = gemm_conv2d


def apply_variant(model: CapsNet, variant: str) -> CapsNet:
    """The variant's maths on ``model``'s own modules, by giving them a subclass (weights untouched).

    A class of their own, not a method patched on the shared class: Dynamo keeps its graphs per code object
    (``CapsNet.forward``), guards on the modules' types but not on a patched method, and shares graphs between instances
    of the same classes, so until 2026-11-26 the compiled mulsum variant (and any other patched one) ran the base's
    graph: the H200 rows of 2026-11-25 for mulsum timed the shipped model twice.
    """
    if "mulsum" in variant:
        for m in model.modules():
            if type(m) is DenseCaps:
                m.__class__ = _MulsumDenseCaps
    if variant == "gemm-primary":
        for m in model.modules():
            if type(m) is PrimaryCaps:
                m.__class__ = _GemmPrimaryCaps
    if variant == "gemm-convs":
        for m in model.modules():
            if type(m) is torch.nn.Conv2d:
                m.__class__ = _GemmConv2d
    return model


@contextlib.contextmanager
def settings_of(variant: str) -> Iterator[None]:
    """The variant's global settings in place while it is built, compiled and run: cuDNN's algorithm search."""
    benchmark = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = variant == "cudnn-benchmark"
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = benchmark


class WholeStepGraph:
    """One training step (forward, margin + reconstruction loss, backward, Adam) captured in one CUDA graph.

    The images, labels, weights, gradients and Adam's state are the graph's own tensors; ``time_step`` replays it.
    Adam is capturable (its step count on the device) and fused where torch allows both, else multi-tensor.
    """

    def __init__(self, model: CapsNet, images: torch.Tensor, labels: torch.Tensor, lr: float, bf16: bool,
                 compile: str, steps: int) -> None:
        self.model, self.images, self.labels, self.bf16, self.steps = model, images, labels, bf16, steps
        self.taken = 0  # training steps the model has had: the reference in update_agreement takes as many
        self.device = images.device
        model.train()
        self.call = model if compile == "none" else compile_model(model, "default")  # no CUDA graphs of its own
        self.opt = torch.optim.Adam(model.parameters(), lr=lr, fused=True, capturable=True)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):  # compile, and allocate Adam's state, outside the capture
            for _ in range(3):
                self.opt.zero_grad(set_to_none=True)
                self._step()
                self.taken += 1
        torch.cuda.current_stream(self.device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        self.opt.zero_grad(set_to_none=True)  # the captured backward writes the gradients afresh at every replay
        # a recompile inside the capture would run host work the graph cannot hold: fail with its reason instead
        with torch._dynamo.config.patch(error_on_recompile=True), torch.cuda.graph(self.graph):
            self._step()

    def update_agreement(self, lr: float, replays: int = 2) -> float:
        """Cosine similarity between the weights' change over every step taken so far (the 3 warm-up steps, any timed
        replays) plus ``replays`` more and that of as many steps taken eagerly (same start, data, Adam and autocast;
        not compiled, not captured): near 1 when the captured step trains as the plain one does. (Until 2026-11-26
        the reference took 3 + ``replays`` steps whatever the graph had replayed: the H200's 0.7186 compared 35 steps
        with 5.)"""
        torch.manual_seed(0)
        ref = CapsNet(CapsNetConfig()).to(self.device).train()
        first = {n: p.detach().clone() for n, p in ref.named_parameters()}
        opt = torch.optim.Adam(ref.parameters(), lr=lr)
        for _ in range(self.taken + replays):
            opt.zero_grad(set_to_none=True)
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
                loss = capsnet_loss(ref, self.images, self.labels)[0]
            loss.backward()
            opt.step()
        for _ in range(replays):
            self.graph.replay()
        self.taken += replays
        torch.cuda.synchronize(self.device)
        ours = torch.cat([(p.detach() - first[n]).flatten() for n, p in self.model.named_parameters()])
        theirs = torch.cat([(p.detach() - first[n]).flatten() for n, p in ref.named_parameters()])
        return torch.nn.functional.cosine_similarity(ours.double(), theirs.double(), dim=0).item()

    def _step(self) -> None:
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16, cache_enabled=False):
            loss = capsnet_loss(self.call, self.images, self.labels)[0]  # capsnet train's: no sync, none to capture
        loss.backward()
        self.opt.step()

    def time_step(self) -> float:
        torch.cuda.synchronize(self.device)
        start = time.perf_counter()
        for _ in range(self.steps):
            self.graph.replay()
        torch.cuda.synchronize(self.device)
        self.taken += self.steps
        return (time.perf_counter() - start) / self.steps



def build(variant: str, batch: int, device: torch.device, compile: str, bf16: bool, steps: int) -> _Runner:
    torch.manual_seed(0)
    model = apply_variant(CapsNet(CapsNetConfig()).to(device), variant)
    images = torch.rand(batch, 1, 28, 28, device=device)
    labels = torch.randint(0, 10, (batch,), device=device)
    if variant == "whole-step-graph":
        return WholeStepGraph(model, images, labels, 1e-3, bf16, compile, steps)  # type: ignore[return-value]
    if "channels-last" in variant:
        model = model.to(memory_format=torch.channels_last)
        images = images.contiguous(memory_format=torch.channels_last)
    # compiled as capsnet train compiles (static shapes), each variant to a graph of its own (apply_variant)
    return _Runner(model, "train", images, labels, 1e-3, bf16=bf16, fused=device.type == "cuda", steps=steps,
                   compile=False if compile == "none" else compile)


def check_same_maths(device: torch.device, variants: list[str]) -> None:
    """Each variant's plain (votes) forward equals the base model's, in fp32, before anything is timed (for
    cudnn-benchmark and whole-step-graph, whose model is the base's, see ``WholeStepGraph.update_agreement``)."""
    from capsnet.routing import plain_routing
    torch.manual_seed(0)
    model = CapsNet(CapsNetConfig()).to(device).eval()
    x = torch.rand(4, 1, 28, 28, device=device)
    with torch.no_grad(), plain_routing():
        ref = model(x).lengths
        for variant in [v for v in variants if v != "base"]:
            m = apply_variant(copy.deepcopy(model), variant)
            xi = x
            if "channels-last" in variant:
                m, xi = m.to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last)
            with settings_of(variant):
                got = m(xi).lengths
            if not torch.allclose(got, ref, atol=1e-5, rtol=1e-4):
                sys.exit(f"{variant}: lengths differ from the base model by {(got - ref).abs().max().item():.2e}")


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value


def _memory_mark(device: torch.device) -> int:
    """Bytes allocated now, the peak counter restarted (CUDA; 0 elsewhere)."""
    if device.type != "cuda":
        return 0
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_allocated(device)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--batch-size", type=_positive, nargs="+", default=[128, 512])
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    p.add_argument("--compile", choices=("none", *COMPILE_MODES), default="reduce-overhead")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="bf16")
    p.add_argument("--repeats", type=_positive, default=30)
    p.add_argument("--steps-per-timing", type=_positive, default=1,
                   help="steps back to back in each timing (capsnet bench's default on CUDA is 10: throughput)")
    p.add_argument("--json", help="write the rows here (after every batch size)")
    args = p.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda but no CUDA device")
    check_same_maths(device, args.variants)
    rows: list[dict] = []

    def write() -> None:
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"torch": torch.__version__, "compile": args.compile, "dtype": args.dtype,
                           "repeats": args.repeats, "steps_per_timing": args.steps_per_timing,
                           "rows": rows}, f, indent=1)

    print(f"device {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}, torch {torch.__version__}, "
          f"compile {args.compile}, {args.dtype}, {args.repeats} paired repeats of {args.steps_per_timing} steps; "
          f"MB: on CUDA what the variant allocated from its start through compiling and recording (its weights, "
          f"Adam, graphs and peak), on the CPU one step's peak", flush=True)
    print("| batch | variant | images/s, median | x base | MB | note |\n| ---: | --- | ---: | ---: | ---: | --- |",
          flush=True)
    for batch in args.batch_size:
        runners, memory, notes = {}, {}, {}
        for variant in args.variants:
            if variant == "whole-step-graph" and device.type != "cuda":
                print(f"| {batch} | {variant} | | | | needs CUDA: left out |", flush=True)
                continue
            try:
                mark = _memory_mark(device)
                with settings_of(variant):
                    runner = build(variant, batch, device, args.compile, args.dtype == "bf16", args.steps_per_timing)
                    if not isinstance(runner, WholeStepGraph):  # that one compiled and recorded in build
                        for _ in range(3):  # compile and record the graphs with this variant's votes in place
                            runner.time_step()
                if device.type == "cuda":
                    memory[variant] = (torch.cuda.max_memory_allocated(device) - mark) / 2**20
                else:
                    memory[variant] = runner.peak_bytes() / 2**20
                if isinstance(runner, WholeStepGraph):  # before any timing: few steps to repeat eagerly
                    notes[variant] = f"update cosine vs eager {runner.update_agreement(1e-3):.4f}"
            except Exception as e:  # a probe: report it, time the rest
                reason = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
                print(f"| {batch} | {variant} | | | | failed: {reason} |", flush=True)
                rows.append({"batch": batch, "variant": variant, "failed": f"{type(e).__name__}: {e}"})
                continue
            runners[variant] = runner
        timed_variants = [v for v in args.variants if v in runners]
        if not timed_variants:
            write()
            continue

        def timed(variant: str) -> float:
            with settings_of(variant):
                return runners[variant].time_step()

        times = alternate({v: (lambda v=v: timed(v)) for v in timed_variants}, args.repeats, warmup=2)
        reference = "base" if "base" in times else timed_variants[0]
        why = "base failed" if "base" in args.variants else "base not run"
        for variant in timed_variants:
            med = statistics.median(times[variant])
            # the median of the paired ratios (each repeat's two steps ran back to back), as the docstring says and
            # capsnet bench does; not the ratio of the two medians
            ratio = statistics.median(b / t for b, t in zip(times[reference], times[variant]))
            note = "; ".join(x for x in (notes.get(variant, ""),
                                         "" if reference == "base" else f"ratios to {reference}, {why}") if x)
            rows.append({"batch": batch, "variant": variant, "images_per_s": batch / med, "x_base": ratio,
                         "relative_to": reference, "mb": memory[variant], "note": note, "times_s": times[variant]})
            print(f"| {batch} | {variant} | {batch / med:,.0f} | {ratio:.2f} | {memory[variant]:.0f} | {note} |",
                  flush=True)
        runners.clear()  # the graphs and their buffers go before the next batch size's are made
        if device.type == "cuda":
            torch.cuda.empty_cache()
        write()


if __name__ == "__main__":
    main()

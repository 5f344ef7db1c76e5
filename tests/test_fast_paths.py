"""The GPU speed paths, checked on the CPU against the plain fp32 eager path.

bf16 autocast (``TrainConfig.amp``), ``torch.compile`` of the model
(``fit(compile=...)``, ``capsnet train --compile``), fused Adam (CUDA) and
the loop's device-side running sums must train the same model as the plain
path: same outputs and gradients within tolerance, no recompiles as the
learning rate decays, checkpoints that load anywhere.
"""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from capsnet import cli
from capsnet import train as train_mod
from capsnet.checkpoint import CheckpointError, load_checkpoint
from capsnet.data import load_dataset
from capsnet.losses import margin_loss, reconstruction_loss
from capsnet.evaluate import load_model
from capsnet.models import MODELS, BaselineCNN, BaselineCNNConfig, CapsNet, CapsNetConfig
from capsnet.runtime import compile_model
from capsnet.train import TrainConfig, _load_optimizer_state, fit

TINY = CapsNetConfig(conv1_channels=8, primary_types=2, decoder_hidden=(32, 64))
CFG = TrainConfig(dataset="mnist-sample", epochs=2, batch_size=32, train_size=160, test_size=64, seed=3)


@pytest.fixture(scope="module")
def batch():
    ds = load_dataset("mnist-sample", "train").subset(range(16))
    return ds.images.float() / 255, ds.labels.long()


def _loss_and_grads(model, images, labels, bf16=False):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        out = model(images, labels)
        loss = margin_loss(out.lengths, labels) + reconstruction_loss(out.reconstructions, images)
    loss.backward()
    params = getattr(model, "_orig_mod", model).named_parameters()  # a compiled model wraps the module
    return loss.detach().float(), {n: p.grad.detach().clone() for n, p in params}


def _cosine(a, b):
    return torch.nn.functional.cosine_similarity(a.flatten().double(), b.flatten().double(), dim=0).item()


def test_bf16_autocast_step_is_finite_and_close_to_fp32(batch):
    torch.manual_seed(0)
    model = CapsNet(TINY)
    loss32, g32 = _loss_and_grads(model, *batch)
    loss16, g16 = _loss_and_grads(model, *batch, bf16=True)
    assert torch.isfinite(loss16) and abs(loss16 - loss32) / loss32 < 0.02
    for name in g32:
        assert torch.isfinite(g16[name]).all(), name
        assert _cosine(g16[name], g32[name]) > 0.98, name


def test_bf16_autocast_keeps_squash_and_routing_finite_at_zero_input():
    torch.manual_seed(0)
    model = CapsNet(TINY)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()  # every pre-squash vector is exactly zero: the squash's worst case
    images = torch.zeros(4, 1, 28, 28)
    labels = torch.arange(4)
    loss, grads = _loss_and_grads(model, images, labels, bf16=True)
    assert torch.isfinite(loss)
    assert all(torch.isfinite(g).all() for g in grads.values())


def test_fit_with_amp_bf16_trains_records_and_guards_the_setting(tmp_path):
    cfg = dataclasses.replace(CFG, epochs=1, amp="bf16")
    final = fit(TINY, cfg, tmp_path, device="cpu", progress=False)
    assert all(torch.isfinite(torch.tensor(v)) for k, v in final.items() if isinstance(v, float))
    assert 0.0 <= final["test_accuracy"] <= 1.0
    assert load_checkpoint(tmp_path, "last").train_config["amp"] == "bf16"
    with pytest.raises(CheckpointError, match="amp: saved 'bf16', now 'none'"):
        fit(TINY, dataclasses.replace(cfg, epochs=2, amp="none"), tmp_path, device="cpu", progress=False, resume=True)


def test_unknown_amp_is_refused():
    with pytest.raises(ValueError, match="unknown amp 'fp8'; valid values are none, bf16, fp16"):
        TrainConfig(amp="fp8")


def test_compiled_fit_matches_eager_and_never_recompiles(tmp_path):
    # 160 examples in batches of 32: every step has the same shapes, while the
    # learning rate changes every step. The optimizer is not compiled, so
    # nothing in the graph changes and a recompile is an error here.
    torch._dynamo.reset()
    with torch._dynamo.config.patch(error_on_recompile=True):
        compiled = fit(TINY, CFG, tmp_path / "compiled", device="cpu", progress=False, compile="aot_eager")
    eager = fit(TINY, CFG, tmp_path / "eager", device="cpu", progress=False)
    a, b = (load_checkpoint(tmp_path / d, "last").model_state for d in ("compiled", "eager"))
    assert a.keys() == b.keys() and not any("_orig_mod" in k for k in a)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5, msg=k)
    assert compiled["test_accuracy"] == pytest.approx(eager["test_accuracy"], abs=1 / 64)
    model, _ = load_model(tmp_path / "compiled", which="last")  # loads into a plain, uncompiled model
    assert isinstance(model, CapsNet)


@pytest.mark.slow  # Inductor compiles C++ kernels: about 40 s on a 2-core machine with a cold cache
def test_inductor_compiled_model_matches_eager_outputs_and_gradients(batch):
    torch.manual_seed(0)
    model = CapsNet(TINY)
    images, labels = batch
    loss_e, g_e = _loss_and_grads(model, images, labels)
    out_e = model(images, labels)
    torch._dynamo.reset()
    compiled = compile_model(model, True)
    loss_c, g_c = _loss_and_grads(compiled, images, labels)
    out_c = compiled(images, labels)
    torch.testing.assert_close(out_c.poses, out_e.poses, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out_c.coupling, out_e.coupling, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out_c.reconstructions, out_e.reconstructions, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(loss_c, loss_e, rtol=1e-5, atol=1e-6)
    for name in g_e:
        torch.testing.assert_close(g_c[name], g_e[name], rtol=1e-3, atol=1e-5, msg=name)


def test_compiled_baseline_still_takes_the_cross_entropy_path(batch):
    # The loss comes from the registry by name; a compiled module wraps the
    # model and its loss must still be the CNN's cross-entropy.
    torch.manual_seed(0)
    cnn = BaselineCNN(BaselineCNNConfig(channels=(4, 4, 4), hidden=(8, 8)))
    images, labels = batch
    loss = MODELS["baseline"].loss
    eager_loss, eager_scores = loss(cnn.eval(), images, labels, recon_weight=0.0005)
    compiled_loss, compiled_scores = loss(compile_model(cnn, "eager"), images, labels, recon_weight=0.0005)
    torch.testing.assert_close(compiled_loss, eager_loss)
    torch.testing.assert_close(compiled_scores.sum(1), torch.ones(len(labels)))


def test_compile_modes_map_onto_torch_compile(monkeypatch):
    calls = []
    monkeypatch.setattr(torch, "compile", lambda model, **kw: calls.append(kw) or model)
    model = torch.nn.Linear(2, 2)
    assert compile_model(model, False) is model and calls == []
    for arg in (True, "default", "reduce-overhead", "max-autotune", "aot_eager"):
        compile_model(model, arg)
    static = {"dynamic": False}
    assert calls == [static, static, {"mode": "reduce-overhead", **static}, {"mode": "max-autotune", **static},
                     {"backend": "aot_eager", **static}]


_PROFILED = """
import logging
import sys
import torch
from torch._logging import warning_once
from capsnet.runtime import compile_model

class Profiled(torch.nn.Module):  # DistributedDataParallel's forward is a record_function like this
    def forward(self, x):
        with torch.autograd.profiler.record_function("Profiled.forward"):
            return x * 2

print(compile_model(Profiled(), "eager")(torch.ones(3)).sum().item())
# then torch's own compile in the same process, as a fresh one would run it: compile_model's filter taken off the
# logger (it stays for the rest of a process) and torch's warn-once memory of the notice cleared
print("-- torch.compile --", file=sys.stderr, flush=True)
logging.getLogger("torch._dynamo.variables.ctx_manager").filters.clear()
warning_once.cache_clear()
print(torch.compile(Profiled(), backend="eager")(torch.ones(3)).sum().item())
"""


@pytest.mark.e2e
def test_a_compiled_record_function_prints_no_profiler_notice():
    """torchrun with --compile printed Dynamo's "Profiler record function ... will be ignored" on every rank
    (DistributedDataParallel's forward is one; stop 94's note); compile_model drops that notice alone. One process
    (its start is most of the test's time) compiles through compile_model, then through torch.compile alone."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _PROFILED], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.split() == ["6.0", "6.0"], done.stderr[-2000:]
    ours, plain = done.stderr.split("-- torch.compile --\n")
    assert "Profiler record function" not in ours, ours[-2000:]
    assert "Profiler record function" in plain  # the notice this test looks for is torch's, as worded


def test_full_batches_after_a_smaller_last_batch_keep_their_static_graph():
    # torch's automatic dynamic shapes would answer the smaller batch with a graph for any batch size and run every
    # later full batch through it (Dynamo tries its newest graph first); compile_model keeps one graph per size
    used: list[int] = []  # the graph each call ran
    symbolic: list[bool] = []  # whether each graph was compiled for a symbolic (any) batch size

    def backend(gm, example_inputs):
        number = len(symbolic)
        symbolic.append(any(isinstance(t, torch.SymInt) for t in example_inputs)
                        or any(isinstance(d, torch.SymInt) for t in example_inputs if isinstance(t, torch.Tensor)
                               for d in t.shape))

        def run(*args):
            used.append(number)
            return gm.forward(*args)
        return run

    torch._dynamo.reset()
    try:
        compiled = compile_model(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(6, 2)), backend)
        for b in (8, 8, 5, 8, 5, 8):  # two epochs of 21 examples in batches of 8
            out = compiled(torch.randn(b, 3, 2))
            assert out.shape == (b, 2)
        assert used == [0, 0, 1, 0, 1, 0]
        assert symbolic == [False, False]  # both graphs specialised to their batch size
    finally:
        torch._dynamo.reset()


def test_many_runs_in_one_process_stay_compiled():
    # graphs are kept per code object and shared by every model of a class: runs with ten different last-batch
    # sizes in one process (more than torch's default limit of 8 graphs) must all run compiled
    calls: list[int] = []

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(3, 2)

        def forward(self, x):
            return self.fc(x)

    def backend(gm, example_inputs):
        def run(*args):
            calls.append(1)
            return gm.forward(*args)
        return run

    torch._dynamo.reset()
    try:
        for b in range(1, 11):
            compile_model(Net(), backend)(torch.randn(b, 3))
        assert len(calls) == 10
    finally:
        torch._dynamo.reset()


def test_a_fused_adam_state_resumes_on_a_device_without_it():
    # A run trained on CUDA saves Adam's groups with fused=True; resuming it
    # here must keep this device's (unfused) implementation and the moments.
    p = torch.nn.Parameter(torch.arange(4.0))
    fused = torch.optim.Adam([p], lr=0.1, fused=True)
    p.grad = torch.ones(4)
    fused.step()
    saved = fused.state_dict()
    assert saved["param_groups"][0]["fused"] is True
    q = torch.nn.Parameter(p.detach().clone())
    plain = torch.optim.Adam([q], lr=0.1)
    _load_optimizer_state(plain, saved)
    assert not plain.param_groups[0]["fused"]
    torch.testing.assert_close(plain.state[q]["exp_avg"], fused.state[p]["exp_avg"])
    q.grad = torch.ones(4)
    plain.step()  # runs with the loaded moments
    assert plain.state[q]["step"].item() == 2


def test_make_optimizer_fuses_where_torch_can(monkeypatch):
    """Fused on the CPU too where this torch has the kernel there (2.4 on; PyTorch's default, a loop over the
    tensors, was 4-5x slower: a review, 2026-12-02, benchmarks/README.md "Fused Adam on the CPU"); a torch without
    it keeps its default rather than failing."""
    from capsnet import runtime

    model = torch.nn.Linear(2, 2)
    opt = train_mod.make_optimizer(model, CFG, torch.device("cpu"))
    assert opt.param_groups[0]["fused"] and opt.param_groups[0]["lr"] == CFG.lr
    assert runtime.fuses_adam("cuda") and not runtime.fuses_adam("mps")
    adam = torch.optim.Adam

    def before_2_4(params, **kw):  # torch 2.1-2.3 on the CPU
        if kw.get("fused"):
            raise RuntimeError("`fused=True` requires all the params to be floating point Tensors of supported "
                               "devices: ['cuda', 'xpu', 'privateuseone'].")
        return adam(params, **kw)

    monkeypatch.setattr(torch.optim, "Adam", before_2_4)
    runtime.fuses_adam.cache_clear()
    try:
        assert not runtime.fuses_adam("cpu")
        assert not train_mod.make_optimizer(model, CFG, torch.device("cpu")).param_groups[0]["fused"]
    finally:
        runtime.fuses_adam.cache_clear()  # the next caller asks the real torch again


def test_train_flags_reach_fit(tmp_path, monkeypatch):
    seen = {}
    monkeypatch.setattr(train_mod, "fit", lambda model_cfg, cfg, out, **kw: seen.update(cfg=cfg, **kw) or {})
    assert cli.main(["train", "--dataset", "mnist-sample", "--amp", "bf16", "--compile", "--out", str(tmp_path / "a"),
                     "--no-progress"]) == 0
    assert seen["cfg"].amp == "bf16" and seen["compile"] == "default"
    assert cli.main(["train", "--dataset", "mnist-sample", "--compile", "reduce-overhead", "--out", str(tmp_path / "b"),
                     "--no-progress"]) == 0
    assert seen["cfg"].amp == "none" and seen["compile"] == "reduce-overhead"
    assert cli.main(["train", "--dataset", "mnist-sample", "--out", str(tmp_path / "c"), "--no-progress"]) == 0
    assert seen["compile"] is False


def test_bad_compile_and_amp_flags_exit_2(capsys):
    for argv, fragment in ((["train", "--compile", "turbo"], "invalid choice: 'turbo'"),
                           (["train", "--amp", "fp8"], "invalid choice: 'fp8'")):
        with pytest.raises(SystemExit) as e:
            cli.main(argv)
        assert e.value.code == 2 and fragment in capsys.readouterr().err


def test_cli_choices_come_from_the_registries():
    import argparse

    from capsnet.data.tasks import TASKS
    from capsnet.runtime import AMP_MODES, COMPILE_MODES

    commands = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    train = {a.dest: a.choices for a in commands["train"]._actions if a.choices is not None}  # noqa: SLF001
    assert tuple(train["amp"]) == AMP_MODES
    for command in ("train", "bench"):  # --compile's type takes every mode, and none (off: over --preset fast's)
        compile_flag = next(a for a in commands[command]._actions if a.dest == "compile")  # noqa: SLF001
        assert [compile_flag.type(m) for m in COMPILE_MODES] == list(COMPILE_MODES)
        assert compile_flag.type("none") is False and all(m in compile_flag.help for m in COMPILE_MODES)
        with pytest.raises(argparse.ArgumentTypeError, match="invalid choice: 'fast'"):
            compile_flag.type("fast")
    assert list(train["model"]) == list(MODELS)
    dataset = next(a for a in commands["train"]._actions if a.dest == "dataset")  # noqa: SLF001
    assert all(dataset.type(name) == name for name in TASKS)  # every task, and folder:DIR (checked when read)
    assert dataset.metavar == "{" + ",".join(TASKS) + ",folder:DIR,pairs:DIR,classes:DIR}"
    with pytest.raises(argparse.ArgumentTypeError, match="invalid choice: 'mnits'"):
        dataset.type("mnits")


def test_compiled_training_through_the_cli_end_to_end(tmp_path, capsys):
    out, eager = tmp_path / "run", tmp_path / "eager"
    flags = ["train", "--dataset", "mnist-sample", "--epochs", "1", "--batch-size", "32", "--train-size", "96",
             "--test-size", "64", "--conv1-channels", "8", "--primary-types", "2", "--no-progress"]
    assert cli.main([*flags, "--compile", "aot_eager", "--out", str(out)]) == 0
    assert cli.main([*flags, "--out", str(eager)]) == 0  # the same run, eager
    record, alone = (json.loads((d / "metrics.jsonl").read_text().splitlines()[-1]) for d in (out, eager))
    assert record["epoch"] == 1 and record["test_accuracy"] == pytest.approx(alone["test_accuracy"], abs=1 / 64)
    assert record["train_loss"] == pytest.approx(alone["train_loss"], rel=1e-4)
    compiled = load_checkpoint(out, "last")
    assert "compile" not in compiled.train_config  # not part of the run's configuration
    for name, t in load_checkpoint(eager, "last").model_state.items():  # 3 steps: the compiled graph's weights
        torch.testing.assert_close(compiled.model_state[name], t, rtol=1e-4, atol=1e-5, msg=name)


def test_the_whole_capsnet_compiles_as_one_graph():
    # A graph break would leave part of the step to run eagerly, between compiled pieces, on every step. Under
    # torch.compile the routing is traced as plain autograd (the hand-written function is the eager path's).
    torch._dynamo.reset()
    model = CapsNet(TINY)
    images, labels = torch.rand(4, 1, 28, 28), torch.randint(0, 10, (4,))
    report = torch._dynamo.explain(model)(images, labels)
    assert (report.graph_count, report.graph_break_count) == (1, 0), [str(b.reason)[:200] for b in report.break_reasons]


def test_a_compiled_capsnet_routes_in_fp32_inside_a_bf16_step(monkeypatch):
    """--amp bf16 --compile (the fast preset): the compiled graph takes the plain routing path, which routed in bf16
    under autocast where the eager fast path routes in fp32 (README: "the routing runs in fp32 inside"). Found by a
    review (2026-11-29); the plain path now turns autocast off around the votes and the routing, as the fast path."""
    from capsnet.routing import dynamic

    seen = []
    forward = dynamic.DynamicRouting.forward

    def spy(self, votes, *args, **kwargs):
        seen.append(votes.dtype)
        return forward(self, votes, *args, **kwargs)
    monkeypatch.setattr(dynamic.DynamicRouting, "forward", spy)
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = CapsNet(TINY)
    images, labels = torch.rand(4, 1, 28, 28), torch.randint(0, 10, (4,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        eager_out = model(images, labels)
        compiled_out = torch.compile(model, backend="eager", fullgraph=True)(images, labels)
    assert seen == [torch.float32]  # the compiled trace's routing (the eager call took the fast path)
    assert compiled_out.poses.dtype == eager_out.poses.dtype == torch.float32
    torch.testing.assert_close(compiled_out.lengths, eager_out.lengths, rtol=1e-5, atol=1e-6)
    torch._dynamo.reset()


def test_an_unfused_state_loads_into_a_fused_optimizer_with_its_flags():
    # A run saved on CPU (unfused) and resumed where Adam is fused: the saved
    # groups' flags are replaced before loading, since they decide where the
    # step counters go.
    p = torch.nn.Parameter(torch.arange(4.0))
    plain = torch.optim.Adam([p], lr=0.1)
    p.grad = torch.ones(4)
    plain.step()
    q = torch.nn.Parameter(p.detach().clone())
    fused = torch.optim.Adam([q], lr=0.1, fused=True)
    _load_optimizer_state(fused, plain.state_dict())
    assert fused.param_groups[0]["fused"] is True and fused.param_groups[0]["lr"] == 0.1
    q.grad = torch.ones(4)
    fused.step()
    assert fused.state[q]["step"].item() == 2


@pytest.mark.requires_cuda
def test_a_cpu_run_resumes_fused_on_cuda(tmp_path):
    fit(TINY, dataclasses.replace(CFG, epochs=1), tmp_path / "run", device="cpu", progress=False)
    final = fit(TINY, CFG, tmp_path / "run", device="cuda", progress=False, resume=True)
    straight = fit(TINY, CFG, tmp_path / "cpu", device="cpu", progress=False)  # the same run, on the CPU throughout
    assert final["epoch"] == 2 and final["step"] == straight["step"]
    # the same steps from the same state: CUDA's convolutions (TF32 by default) round differently, no more
    assert final["train_loss"] == pytest.approx(straight["train_loss"], rel=2e-2)
    saved = load_checkpoint(tmp_path / "run", "last").optimizer_state
    assert all(group.get("fused") for group in saved["param_groups"])  # resumed into the fused Adam of CUDA


@pytest.mark.requires_cuda
def test_cuda_graphs_train_as_the_default_compile_does(tmp_path):
    # --preset fast compiles with mode="reduce-overhead" (CUDA graphs): the same arithmetic, replayed. A graph's
    # outputs are overwritten by its next replay, so a loop that kept one (a loss summed on the device without a
    # copy) would log a wrong figure: the two runs' logged losses and final weights must agree.
    cfg = dataclasses.replace(CFG, amp="bf16", epochs=1)
    a = fit(TINY, cfg, tmp_path / "a", device="cuda", progress=False, compile="default")
    b = fit(TINY, cfg, tmp_path / "b", device="cuda", progress=False, compile="reduce-overhead")
    assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-3)
    assert b["test_loss"] == pytest.approx(a["test_loss"], rel=1e-3)
    wa, wb = (load_checkpoint(tmp_path / r, "last").model_state for r in ("a", "b"))
    for k in wa:
        torch.testing.assert_close(wb[k].float(), wa[k].float(), rtol=1e-3, atol=1e-4)


def test_margin_loss_can_skip_its_range_check():
    lengths = torch.full((2, 10), 0.5)
    with pytest.raises(ValueError, match="class indices must lie in"):
        margin_loss(lengths, torch.tensor([0, 10]))
    # unchecked, a valid batch gives the same value as checked
    good = torch.tensor([1, 9])
    assert margin_loss(lengths, good, validate=False) == margin_loss(lengths, good)


def test_experiment_flags_reach_every_run(tmp_path, monkeypatch, capsys):
    from capsnet import experiments as ex

    seen = []

    def fake_fit(model_cfg, cfg, run_dir, **kw):
        seen.append((cfg.amp, kw["compile"]))
        return {"epoch": cfg.epochs, "step": 4, "test_accuracy": 0.5, "test_error": 0.5, "test_loss": 1.0,
                "train_loss": 1.0, "train_accuracy": 0.5}

    monkeypatch.setattr(ex, "fit", fake_fit)
    assert cli.main(["experiment", "less-data", "--sizes", "500", "1000", "--steps", "4", "--amp", "bf16",
                     "--compile", "max-autotune", "--out", str(tmp_path / "x"), "--no-progress"]) == 0
    assert seen == [("bf16", "max-autotune")] * 4  # two sizes x two models


def test_a_cuda_device_past_the_last_one_is_refused_with_the_count(monkeypatch):
    """--device cuda:7 on a machine of one GPU passed resolve_device and failed at the first tensor moved there, a
    traceback ('invalid device ordinal'); said now with the devices there are (CUDA stood in for: this CPU has
    none)."""
    from capsnet.runtime import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for count, said in ((1, r"has 1 CUDA device \(cuda:0\); use one of those, or 'cuda' \(--device cuda\)"),
                        (2, r"has 2 CUDA devices \(cuda:0 to cuda:1\)")):
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        with pytest.raises(ValueError, match=rf"device 'cuda:7' asked for, but this machine {said}"):
            resolve_device("cuda:7")
        assert resolve_device(f"cuda:{count - 1}") == torch.device("cuda", count - 1)
        assert resolve_device("cuda") == torch.device("cuda")


def test_evaluating_blocks_on_one_model_in_two_threads_share_the_switch():
    """Each block restored the mode it found: thread B, entering after A had switched a training model to eval,
    restored eval, and A's exit put the model back in training while B still scored (dropout on, batch norm's
    statistics moved)."""
    import threading

    from capsnet.runtime import evaluating

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.5)).train()
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def a():
        with evaluating(model):
            a_in.set()
            b_in.wait(10)
        a_out.set()

    def b():
        a_in.wait(10)
        with evaluating(model):
            b_in.set()
            a_out.wait(10)
            seen["b, after a left"] = model.training
        seen["after both"] = model.training
    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == {"b, after a left": False, "after both": True}
    with evaluating(model):  # one block, as ever; a model in eval mode stays so
        assert not model.training
    assert model.training and not model.eval().training

    class Unhashable(torch.nn.Module):  # __eq__ alone makes a class unhashable: the table cannot hold it
        def __eq__(self, other):
            return self is other
    odd = Unhashable().train()
    with evaluating(odd):
        assert not odd.training
    assert odd.training

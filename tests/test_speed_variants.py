"""benchmarks/speed_variants.py's variants are the shipped model's maths: checked here on the CPU, since the script
itself only checks the forward before it times on a GPU."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from capsnet.layers.primary import PrimaryCaps

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def variants():
    spec = importlib.util.spec_from_file_location("speed_variants", ROOT / "benchmarks" / "speed_variants.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["speed_variants"] = module  # Dynamo looks the variants' classes up by their module's name
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules["speed_variants"]


@pytest.mark.parametrize("in_channels,size,kernel,stride", [(256, 20, 9, 2), (3, 11, 3, 1), (5, 12, 4, 3)])
def test_gemm_primary_matches_the_convolution_values_and_gradients(variants, in_channels, size, kernel, stride):
    torch.manual_seed(0)
    layer = PrimaryCaps(in_channels, types=4, dim=8, kernel_size=kernel, stride=stride).double()
    x = torch.randn(3, in_channels, size, size, dtype=torch.float64, requires_grad=True)
    ref = layer(x)
    g = torch.randn_like(ref)
    ref_grads = torch.autograd.grad(ref, [x, layer.conv.weight, layer.conv.bias], g)
    got = variants.gemm_primary(layer, x)
    got_grads = torch.autograd.grad(got, [x, layer.conv.weight, layer.conv.bias], g)
    assert got.shape == ref.shape
    torch.testing.assert_close(got, ref)
    for a, b in zip(got_grads, ref_grads):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("kw", [dict(kernel_size=9), dict(kernel_size=9, stride=2), dict(kernel_size=3, padding=2),
                                dict(kernel_size=(3, 5), stride=(2, 1), padding=(1, 2), dilation=(1, 2)),
                                dict(kernel_size=3, bias=False)])
def test_gemm_conv2d_matches_the_convolution_values_and_gradients(variants, kw):
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 5, **kw).double()
    x = torch.randn(2, 3, 13, 12, dtype=torch.float64, requires_grad=True)
    params = [x] + list(conv.parameters())
    ref = conv(x)
    g = torch.randn_like(ref)
    ref_grads = torch.autograd.grad(ref, params, g)
    got = variants.gemm_conv2d(conv, x)
    got_grads = torch.autograd.grad(got, params, g)
    torch.testing.assert_close(got, ref)
    for a, b in zip(got_grads, ref_grads):
        torch.testing.assert_close(a, b)


def test_gemm_conv2d_leaves_grouped_and_same_padded_convolutions_to_torch(variants):
    torch.manual_seed(0)
    x = torch.randn(1, 4, 8, 8)
    for conv in (torch.nn.Conv2d(4, 4, 3, groups=2), torch.nn.Conv2d(4, 4, 3, padding="same")):
        torch.testing.assert_close(variants.gemm_conv2d(conv, x), conv(x))


@pytest.mark.parametrize("variant", ["mulsum", "gemm-primary", "gemm-convs"])
def test_a_variant_is_the_same_maths_on_its_own_modules(variants, variant):
    from capsnet.models.capsnet import CapsNet, CapsNetConfig
    from capsnet.routing import plain_routing

    torch.manual_seed(0)
    base = CapsNet(CapsNetConfig(conv1_channels=16, primary_types=4)).eval()
    other = variants.apply_variant(CapsNet(CapsNetConfig(conv1_channels=16, primary_types=4)).eval(), variant)
    other.load_state_dict(base.state_dict())
    assert {type(m) for m in other.modules()} != {type(m) for m in base.modules()}  # its own classes
    assert all(type(m).__module__.startswith("torch") or type(m).__module__.startswith("capsnet")
               for m in base.modules())  # the base model's untouched
    x = torch.rand(3, 1, 28, 28)
    with torch.no_grad(), plain_routing():
        torch.testing.assert_close(other(x).lengths, base(x).lengths, atol=1e-5, rtol=1e-4)


def test_compiled_variants_run_graphs_of_their_own(variants):
    # Dynamo shares graphs between instances of the same classes and does not see a patched method: each variant
    # must reach the backend as a graph of its own, not run the base's
    from capsnet.models.capsnet import CapsNet, CapsNetConfig

    graphs: list[set[str]] = []

    def backend(gm, example_inputs):
        graphs.append({str(n.target) for n in gm.graph.nodes if n.op == "call_function"})
        return gm.forward

    torch._dynamo.reset()
    try:
        x = torch.rand(2, 1, 28, 28)
        for variant in ("base", "gemm-convs"):
            torch.manual_seed(0)
            model = variants.apply_variant(CapsNet(CapsNetConfig(conv1_channels=8, primary_types=2)), variant)
            torch.compile(model, backend=backend, dynamic=False)(x)
        assert len(graphs) == 2
        assert any("conv2d" in t for t in graphs[0]) and not any("conv2d" in t for t in graphs[1])
        assert any("unfold" in t or "im2col" in t for t in graphs[1])
    finally:
        torch._dynamo.reset()


def test_the_table_takes_the_median_of_paired_ratios_and_says_why_base_is_missing(variants, monkeypatch, capsys):
    """Without base asked for, every row said "base failed"; and "x base" was the ratio of two medians where the
    docstring promises the paired ratios' median. Timings stand in for the steps here (the maths is tested above)."""
    class Runner:
        def time_step(self):
            return 1.0

        def peak_bytes(self):
            return 2**20

    times = {"mulsum": [1.0, 2.0, 4.0], "channels-last": [2.0, 1.0, 2.0]}  # paired ratios 0.5, 2, 2: median 2
    monkeypatch.setattr(variants, "build", lambda *a, **k: Runner())
    monkeypatch.setattr(variants, "check_same_maths", lambda *a: None)
    monkeypatch.setattr(variants, "alternate", lambda steps, repeats, warmup: {v: times[v] for v in steps})
    monkeypatch.setattr(sys, "argv", ["speed_variants.py", "--device", "cpu", "--compile", "none", "--batch-size", "4",
                                      "--variants", "mulsum", "channels-last"])
    variants.main()
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 4 |")]
    assert rows == ["| 4 | mulsum | 2 | 1.00 | 1 | ratios to mulsum, base not run |",
                    "| 4 | channels-last | 2 | 2.00 | 1 | ratios to mulsum, base not run |"]  # medians' ratio: 1.00

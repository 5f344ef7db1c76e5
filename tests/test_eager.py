"""capsnet._eager: the eager-mode check and the block copy of permuted tensors, against PyTorch's own."""
from __future__ import annotations

import pytest
import torch

from capsnet._eager import eager, permute_contiguous


@pytest.mark.parametrize("dtype,blocked", [(torch.float32, True), (torch.bfloat16, True), (torch.float16, True),
                                           (torch.float64, False)])
def test_permute_contiguous_equals_permute_and_copy_bitwise_with_its_gradient(dtype, blocked):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 3, 4, 6, 4, generator=g).to(dtype)
    x[0, 0, 0, 0] = torch.tensor([float("nan"), -0.0, float("inf"), 1e-40]).to(dtype)  # moved bit for bit
    x.requires_grad_(True)
    dims = (1, 3, 0, 2, 4)
    y = permute_contiguous(x, dims)
    assert (type(y.grad_fn).__name__ == "_BlockPermuteBackward") == blocked
    want = x.detach().permute(dims).contiguous()
    assert y.is_contiguous() and y.shape == want.shape and y.dtype == dtype
    bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[dtype.itemsize]
    assert torch.equal(y.detach().view(bits), want.view(bits))
    w = torch.randn(want.shape, generator=g).to(dtype)
    plain = x.detach().clone().requires_grad_(True)  # PyTorch's own permute and copy, and its gradient
    grad, = torch.autograd.grad((y * w).sum(), x)
    assert torch.equal(grad, torch.autograd.grad((plain.permute(dims).contiguous() * w).sum(), plain)[0])


def test_permute_contiguous_takes_the_plain_copy_where_the_last_dimension_moves_or_is_not_8_or_16_bytes():
    x = torch.randn(3, 4, 4, requires_grad=True)
    for dims, t in (((2, 1, 0), x), ((1, 0, 2), torch.randn(3, 4, 3, requires_grad=True))):
        y = permute_contiguous(t, dims)
        assert type(y.grad_fn).__name__ != "_BlockPermuteBackward"
        assert torch.equal(y, t.permute(dims).contiguous())
    y = permute_contiguous(x.transpose(0, 1), (1, 0, -1))  # a non-contiguous input, a negative dim
    assert type(y.grad_fn).__name__ == "_BlockPermuteBackward" and torch.equal(y, x)


def test_eager_is_false_under_vmap_tracing_and_forward_ad_and_the_copy_still_works_there():
    assert eager()
    seen = []
    x = torch.randn(2, 3, 5, 4)

    def f(t):
        seen.append(eager())
        return permute_contiguous(t, (1, 0, 2))

    torch.testing.assert_close(torch.vmap(f)(x), x.permute(0, 2, 1, 3))
    torch.jit.trace(f, (x[0],), check_trace=False)
    with torch.autograd.forward_ad.dual_level():
        dual = torch.autograd.forward_ad.make_dual(x[0], torch.ones_like(x[0]))
        f(dual)
    assert seen == [False, False, False]


def test_permute_contiguous_of_slices_odd_strides_and_scalars_and_its_gradient_of_a_slice():
    """Blocks that do not line up with the storage (a slice at an odd offset, a size-1 dimension's odd stride)
    are copied into a fresh tensor first; a 0-d tensor takes the plain path."""
    g = torch.Generator().manual_seed(1)
    base = torch.randn(61, generator=g)
    for x in (base[1:61].view(5, 3, 4), base[:20].as_strided((5, 1, 4), (4, 3, 1)),
              base[1:41].view(2, 5, 4).to(torch.bfloat16)):
        assert torch.equal(permute_contiguous(x, (1, 0, 2)), x.permute(1, 0, 2).contiguous())
    scalar = torch.tensor(3.0)
    assert torch.equal(permute_contiguous(scalar, ()), scalar)
    x = torch.randn(5, 3, 4, generator=g, requires_grad=True)
    y = permute_contiguous(x, (1, 0, 2))
    # the gradient reaching y is a slice of a bigger one, at an offset that is not a whole block
    grad, = torch.autograd.grad(torch.cat([x.new_ones(1), y.flatten()]).pow(2).sum(), x)
    torch.testing.assert_close(grad, 2 * x.detach())


def test_double_backward_through_permute_contiguous():
    """A gradient penalty through the block copy (as through the matrix capsule layers' votes) equals PyTorch's."""
    g = torch.Generator().manual_seed(2)
    w = torch.randn(3, 5, 4, generator=g)
    results = []
    for permute in (permute_contiguous, lambda t, d: t.permute(d).contiguous()):
        x = torch.randn(5, 3, 4, generator=torch.Generator().manual_seed(3), requires_grad=True)
        y = permute(x.pow(3), (1, 0, 2))
        first, = torch.autograd.grad((y.pow(2) * w).sum(), x, create_graph=True)  # its gradient depends on x
        results.append(torch.autograd.grad(first.pow(2).sum(), x)[0])
    torch.testing.assert_close(results[0], results[1])


def test_eager_is_false_while_dynamo_compiles_on_a_torch_without_torch_compiler_is_compiling(monkeypatch):
    """torch 2.1 and 2.2 have no torch.compiler.is_compiling: eager() said True while Dynamo traced (a review of
    the declared floors); torch._dynamo.is_compiling is asked there."""
    import types

    import torch

    from capsnet._eager import eager

    monkeypatch.setattr(torch, "compiler", types.SimpleNamespace())  # a torch.compiler without is_compiling
    monkeypatch.setattr(torch._dynamo, "is_compiling", lambda: True)
    assert eager() is False
    monkeypatch.setattr(torch._dynamo, "is_compiling", lambda: False)
    assert eager() is True


def test_permute_contiguous_of_an_empty_strided_tensor_is_the_plain_copy():
    """An empty tensor keeps its strides through contiguous(), so its 8-byte blocks could not be viewed:
    "self.stride(-1) must be 1 to view Float as ComplexDouble" (a review of the fast paths at edge shapes,
    2026-12-02)."""
    for x in (torch.randn(0, 3, 8)[..., ::2], torch.randn(3, 0, 4).double()[..., ::2], torch.tensor(2.0)):
        dims = tuple(range(x.dim()))[::-1][1:] + ((x.dim() - 1,) if x.dim() else ())
        got = permute_contiguous(x, dims)
        want = x.permute(dims).contiguous()
        assert got.shape == want.shape and torch.equal(got, want)

"""Eager-mode fast paths: the check that nothing traces or transforms the code, and a faster permuted copy.

Both are for plain eager PyTorch only; a traced, exported or compiled graph,
a torch.func transform or forward-mode AD takes the plain operations.
"""
from __future__ import annotations

import contextlib

import torch

__all__ = ["eager", "autocast_on", "autocast_off", "promoted", "permute_contiguous"]


def eager() -> bool:
    """Plain eager autograd: nothing is tracing, exporting or compiling, and no torch.func transform (vmap,
    grad, jacrev) or forward-mode AD is active (neither has a rule for a custom autograd Function, nor
    for writes into a buffer)."""
    if torch.jit.is_tracing():
        return False
    compiler = getattr(torch, "compiler", None)
    if compiler is not None and hasattr(compiler, "is_compiling"):
        if compiler.is_compiling():
            return False
    elif getattr(getattr(torch, "_dynamo", None), "is_compiling", lambda: False)():  # torch before 2.3, which has
        return False  # no torch.compiler.is_compiling
    transforms = getattr(torch._C, "_are_functorch_transforms_active", None)
    if transforms is not None and transforms():
        return False
    forward_ad = getattr(torch.autograd, "forward_ad", None)
    return getattr(forward_ad, "_current_level", -1) < 0


def autocast_on(device_type: str) -> bool:
    """Whether autocast is on for ``device_type`` (False for a device type autocast does not know): where the
    routings turn it off around their float32 work."""
    try:
        return torch.is_autocast_enabled(device_type)
    except TypeError:  # torch before 2.4 takes no device type here
        return torch.is_autocast_enabled() if device_type == "cuda" else torch.is_autocast_cpu_enabled()
    except RuntimeError:  # a device type without autocast
        return False


def autocast_off(device_type: str) -> contextlib.AbstractContextManager:
    """Autocast turned off for a block; no context at all where it is not on, so an exported graph
    (``torch.export``, ONNX) holds no autocast wrapper around the routing, and a device type autocast does not know
    (``meta``: shape inference) is not refused."""
    return torch.autocast(device_type, enabled=False) if autocast_on(device_type) else contextlib.nullcontext()


def promoted(x: torch.Tensor, *others: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
    """``x`` and ``others`` (a layer's weights; None passes through) in the one dtype they promote to, for a product
    torch takes in one dtype: float64 capsules into a float32 layer give float64, bfloat16 ones float32 (torch refused
    the pairs: "expected scalar type Float but found Double"). Under autocast, which casts a product's inputs itself,
    all are left as they are, except where they promote to float64, which autocast leaves alone: then all widen."""
    dtype = x.dtype
    for t in others:
        if t is not None:
            dtype = torch.promote_types(dtype, t.dtype)
    if dtype != torch.float64 and autocast_on(x.device.type):
        return (x, *others)
    return tuple(None if t is None else t.to(dtype) for t in (x, *others))


# a block of the last dimension moved as one element: its size in bytes -> a dtype of that size
_BLOCKS = {8: torch.int64, 16: torch.complex128}


def permute_contiguous(x: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    """``x.permute(dims).contiguous()``, faster on a CPU when the last dimension stays last and holds 8 or
    16 bytes (4 float32 entries: a row of a 4x4 pose).

    PyTorch's CPU copy moves a permuted tensor one entry at a time, at a
    fraction of memory speed when the contiguous runs are short; moving each
    last-dimension row as one 8- or 16-byte element does the same bitwise
    copy about 3x faster (benchmarks/README.md, "Inverted dot-product
    attention's fused backward"). Differentiable; elsewhere (other devices,
    shapes or a traced graph) the plain permute and copy.
    """
    # (an empty tensor keeps its strides through contiguous(), so its blocks cannot be viewed: the plain copy)
    if x.dim() and x.numel() and x.device.type == "cpu" and x.shape[-1] * x.element_size() in _BLOCKS \
            and not x.is_complex():
        dims = tuple(d % x.dim() for d in dims)
        if dims[-1] == x.dim() - 1 and eager():
            return _BlockPermute.apply(x, dims)
    return x.permute(dims).contiguous()


def _block_permute(x: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    block = _BLOCKS[x.shape[-1] * x.element_size()]
    n = x.shape[-1]  # entries per block
    x = x.contiguous()
    if x.storage_offset() % n or any(s % n for s in x.stride()[:-1]):  # a slice, or odd strides of size-1 dims:
        x = x.clone(memory_format=torch.contiguous_format)  # a fresh tensor, whose blocks line up
    return x.view(block).permute(dims).contiguous().view(x.dtype)


class _BlockPermute(torch.autograd.Function):
    """``_block_permute`` with its gradient, itself a block permute (so double backward works too)."""

    @staticmethod
    def forward(ctx, x, dims):
        ctx.inverse = tuple(sorted(range(len(dims)), key=dims.__getitem__))
        return _block_permute(x, dims)

    @staticmethod
    def backward(ctx, grad):
        return _BlockPermute.apply(grad, ctx.inverse), None

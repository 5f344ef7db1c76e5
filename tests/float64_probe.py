"""Which of capsnet's own lines make float64 tensors: the tests of the running sums on a device without float64
(Apple's MPS) run on the CPU with ``sum_dtype`` answering as for MPS, and ask this of the loops' files."""
from __future__ import annotations

import traceback

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class Float64Made(TorchDispatchMode):
    """While active, ``lines`` collects "FILE:LINE" of each float64 tensor made where the innermost capsnet frame is
    in one of ``files`` (names such as "train.py")."""

    def __init__(self, *files: str) -> None:
        super().__init__()
        self.files = tuple(f"capsnet/{f}" for f in files)
        self.lines: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if any(isinstance(o, torch.Tensor) and o.dtype == torch.float64 for o in
               (out if isinstance(out, (tuple, list)) else [out])):
            ours = [f for f in traceback.extract_stack() if "/capsnet/" in f.filename]
            if ours and ours[-1].filename.endswith(self.files):
                self.lines.append(f"{ours[-1].filename.rsplit('/', 1)[-1]}:{ours[-1].lineno}")
        return out

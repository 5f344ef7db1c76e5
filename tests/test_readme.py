"""The README's Python snippets: every one compiles, and those that need no run directory or extra package run and
give the shapes their comments state (the ConvCaps2d one used an `x` it never made)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
NEEDS_FILES = ("runs/", "onnxruntime")  # a trained run directory, an optional package


def test_every_python_snippet_compiles():
    assert len(BLOCKS) >= 4
    for block in BLOCKS:
        compile(block, "README.md", "exec")


@pytest.mark.parametrize("index", [i for i, b in enumerate(BLOCKS) if not any(n in b for n in NEEDS_FILES)])
def test_a_self_contained_snippet_runs_and_its_shapes_are_as_commented(index, capsys):
    namespace: dict = {}
    exec(compile(BLOCKS[index], "README.md", "exec"), namespace)
    if "ConvCaps2d(" in BLOCKS[index]:
        assert tuple(namespace["parents"].shape) == (2, 8, 32, 6, 6)  # (B, 8, 32, H/2, W/2)
        assert tuple(namespace["result"].rounds.shape) == (2 * 6 * 6, 3, 4, 8)  # (B*H/2*W/2, R, 4, 8)
        assert tuple(namespace["up"](namespace["parents"]).shape) == tuple(namespace["x"].shape)  # (B, 4, 16, H, W)
    if "CapsNet(CapsNetConfig" in BLOCKS[index]:
        out = namespace["out"]
        assert tuple(out.poses.shape) == (32, 10, 16) and tuple(out.lengths.shape) == (32, 10)
        assert tuple(out.coupling.shape) == (32, 1152, 10)

"""capsnet.memory: glibc keeps freed blocks, so a repeated allocation stops faulting pages in."""
import json
import platform
import subprocess
import sys

import pytest

from capsnet.memory import keep_freed_memory

glibc_only = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                                reason="the allocator tuning applies to glibc only")

# Three steps of a conv layer's forward and backward (activations of 52 MB, past glibc's largest mmap threshold of
# 32 MiB; a 1x1 kernel, as the allocator sees the same blocks as a 9x9 one's at 1/81 of the arithmetic), after two
# warm-up steps, with glibc's defaults; then keep_freed_memory() and the same again: prints the minor page faults of
# each three. One process measures both (the defaults first, untouched), so the probe pays torch's import once.
_PROBE = r"""
import json, resource
import torch
from capsnet.memory import keep_freed_memory
torch.manual_seed(0)
torch.set_num_threads(1)
conv = torch.nn.Conv2d(1, 256, 1)
x = torch.rand(128, 1, 20, 20)
def step():
    h = torch.relu(conv(x))  # (128, 256, 20, 20)
    (h * h).sum().backward()
def faults():
    for _ in range(2):
        step()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(3):
        step()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
default = {"applied": False, "faults": faults()}
applied = keep_freed_memory()
print(json.dumps([default, {"applied": applied, "faults": faults()}]))
"""


def _probe() -> tuple[dict, dict]:
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True)
    default, keep = json.loads(out.stdout.strip().splitlines()[-1])
    return default, keep


@pytest.mark.e2e
@glibc_only
def test_kept_memory_is_reused_without_page_faults():
    default, keep = _probe()
    assert keep["applied"] is True and default["applied"] is False
    pages = 3 * (128 * 256 * 20 * 20 * 4) // 4096  # one activation's pages per step
    assert default["faults"] > pages, default  # glibc maps the large blocks afresh every step
    assert keep["faults"] < default["faults"] / 4, (keep, default)  # measured 8-24x fewer


def test_negative_settings_are_refused():
    with pytest.raises(ValueError, match="trim_threshold must be an integer >= 0 \\(bytes\\), got -1"):
        keep_freed_memory(trim_threshold=-1)
    with pytest.raises(ValueError, match="top_pad must be an integer >= 0"):
        keep_freed_memory(top_pad=-5)
    # a float failed inside ctypes after the first mallopt had been applied: refused before any of them now
    for bad in (1.5, True, "8"):
        with pytest.raises(ValueError, match="trim_threshold must be an integer >= 0"):
            keep_freed_memory(trim_threshold=bad)

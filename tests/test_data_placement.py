"""Placement statistics on hand-made canvases whose ink boxes are known."""
from __future__ import annotations

import pytest
import torch

from capsnet.data.placement import placement


def test_placement_counts_border_ink_and_pools_row_and_column_centres():
    x = torch.zeros(4, 1, 10, 10)
    x[0, 0, 0, 5] = 1.0  # on the top border: centre (0, 5)
    x[1, 0, 4:7, 3:8] = 0.5  # rows 4..6, columns 3..7: centre (5, 5)
    x[2, 0, 2:4, 9] = 0.2  # on the right border: centre (2.5, 9)
    # x[3] is blank: left out
    p = placement(x)
    assert p.images == 3 and p.border_share == pytest.approx(2 / 3)
    centres = torch.tensor([0.0, 5.0, 2.5, 5.0, 5.0, 9.0], dtype=torch.float64)  # rows, then columns
    assert p.centre_std == pytest.approx(centres.std().item())
    assert (p.centre_min, p.centre_max) == (0.0, 9.0)
    assert placement(x, threshold=0.3).images == 2  # the faint digit is no ink above 0.3
    assert set(p.to_dict()) == {"border_share", "centre_std", "centre_min", "centre_max", "images"}


def test_placement_refuses_blank_or_misshapen_input():
    with pytest.raises(ValueError, match="every image is blank"):
        placement(torch.zeros(2, 1, 8, 8))
    with pytest.raises(ValueError, match=r"need images \(N, C, H, W\)"):
        placement(torch.zeros(8, 8))

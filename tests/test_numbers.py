"""The shared tests of numbers (capsnet._numbers) and the messages built on them."""
from __future__ import annotations

import math
import sys

import pytest
import torch

from capsnet._numbers import is_count, is_finite, is_int, is_real, number_repr
from capsnet.image_metrics import ssim
from capsnet.models import SegCapsConfig


def test_a_bool_is_never_an_int_count_or_number():
    for test in (is_int, is_count, is_real, is_finite):
        assert not test(True) and not test(False)
    assert is_int(0) and is_int(-3) and not is_int(2.0) and not is_int("2") and not is_int(None)
    assert is_count(1) and not is_count(0) and is_count(0, 0) and not is_count(-1, 0) and is_count(2, 2)
    assert not is_count(1.0) and not is_count(3, 4)
    assert is_real(2.5) and is_real(math.nan) and is_real(7) and not is_real("7") and not is_real(1j)


def test_is_finite_takes_ints_within_floats_range_and_no_overflow():
    assert is_finite(0) and is_finite(1.5) and is_finite(-(10**308))
    assert not is_finite(math.inf) and not is_finite(math.nan) and not is_finite(-math.inf)
    assert not is_finite(10**400) and not is_finite(-(10**400))  # math.isfinite(10**400) raises OverflowError
    assert is_finite(int(sys.float_info.max)) and not is_finite(int(sys.float_info.max) * 2)


def test_number_repr_shortens_long_integers_only():
    assert number_repr(5) == "5" and number_repr(2.5) == "2.5" and number_repr(True) == "True"
    assert number_repr("x") == "'x'" and number_repr([1, 2]) == "[1, 2]"
    assert number_repr(10**12 - 1) == "999999999999" and number_repr(10**12) == "1e+12"
    assert number_repr(-3 * 10**20) == "-3e+20"
    assert number_repr(10**400) == "100000000000... (401 digits)"
    assert number_repr(-(10**400)) == "-100000000000... (401 digits)"
    assert number_repr(10**5000) == "an integer past 10**4000"  # str() refuses past 4,300 digits


def test_a_huge_positive_factor_is_refused_by_name_not_by_an_overflow():
    """check_positive (a routing's, layer's or metric's scale) ran math.isfinite on an int past float's range and
    ended in OverflowError; now it is the named ValueError, its value shortened."""
    x = torch.rand(1, 1, 16, 16)
    with pytest.raises(ValueError, match=r"^data_range must be a positive finite number \(1 for images in \[0, 1\]\), "
                                         r"got 100000000000\.\.\. \(401 digits\)$"):
        ssim(x, x, data_range=10**400)
    with pytest.raises(ValueError, match=r"got True$"):
        ssim(x, x, data_range=True)


def test_a_field_out_of_range_far_past_10_to_4000_is_named():
    """check_range printed str(value), which Python refuses past 4,300 digits (a ValueError of its own, not naming
    the field)."""
    with pytest.raises(ValueError, match=r"SegCapsConfig.routing_iterations must be in 1..100, got an integer past "
                                         r"10\*\*4000"):
        SegCapsConfig(routing_iterations=10**5000)

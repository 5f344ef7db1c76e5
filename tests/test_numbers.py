"""The shared tests of numbers (capsnet._numbers) and the messages built on them."""
from __future__ import annotations

import math
import re
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
    assert number_repr(10**3900) == "100000000000... (3901 digits)"
    assert number_repr(10**5000) == "an integer of about 5,000 digits"  # str() refuses past 4,300 digits
    assert number_repr(-(10**5000)) == "-an integer of about 5,000 digits"
    assert number_repr([1, 10**400, "a"]) == "[1, 100000000000... (401 digits), 'a']" == number_repr((1, 10**400, "a"))


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
    with pytest.raises(ValueError, match=r"SegCapsConfig.routing_iterations must be in 1..100, got an integer of "
                                         r"about 5,000 digits"):
        SegCapsConfig(routing_iterations=10**5000)
    with pytest.raises(ValueError, match=r"SegCapsConfig.level_widths must be in 0.25..8, got \[1, 1, 0.1, 1\] "
                                         r"\(entry 2, 0.1\)$"):  # which of the list's entries
        SegCapsConfig(level_widths=(1, 1, 0.1, 1))
    from capsnet.models import CapsNetConfig
    with pytest.raises(ValueError, match=r"decoder_hidden must be in 1..65,536, got \[512, 1e\+20\] \(entry 1, "
                                         r"1e\+20\)$"):
        CapsNetConfig(decoder_hidden=(512, 10**20))


def test_a_field_of_the_wrong_type_holding_a_huge_int_is_named():
    """check_types printed repr(value): past 4,300 digits Python's own ValueError, not naming the field."""
    with pytest.raises(ValueError, match=r"SegCapsConfig.level_widths must be a list of finite numbers, got \[1, 1, "
                                         r"an integer of about 5,000 digits, 1\]"):
        SegCapsConfig(level_widths=[1, 1, 10**5000, 1])


def test_a_comma_list_given_as_a_string_gets_a_json_hint_only_where_it_is_one():
    """The hint gives the JSON list to type: decimals only for a list of numbers, not for a list of integers."""
    from capsnet.models import CapsNetConfig
    with pytest.raises(ValueError, match=r"give a JSON list, e\.g\. level_widths=\[1,2\.5,1,1\]$"):
        SegCapsConfig(level_widths="1, 2.5,1,1")
    with pytest.raises(ValueError, match=r"decoder_hidden must be a list of integers, got '512,1024'; give a JSON "
                                         r"list, e\.g\. decoder_hidden=\[512,1024\]$"):
        CapsNetConfig(decoder_hidden="512,1024")
    for no_hint in ("512.5,1024", ".,."):
        with pytest.raises(ValueError, match=rf"got '{re.escape(no_hint)}'$"):
            CapsNetConfig(decoder_hidden=no_hint)
    with pytest.raises(ValueError, match=r"got '\.,\.'$"):
        SegCapsConfig(level_widths=".,.")

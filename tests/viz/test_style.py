"""The viewer's stylesheet: colours that carry meaning stand out from what they sit on (WCAG 2.1, 1.4.11)."""
from __future__ import annotations

import re
from importlib import resources


def css_rule(css: str, selector: str) -> str:
    match = re.search(re.escape(selector) + r"\s*\{([^}]*)\}", css)
    assert match, f"no rule for {selector}"
    return match.group(1)


def colour(rule: str, prop: str = "background") -> str:
    match = re.search(rf"(?:^|;)\s*{prop}\s*:\s*#([0-9a-fA-F]{{6}}|[0-9a-fA-F]{{3}})\b", rule)
    assert match, f"no {prop} colour in {rule!r}"
    hex_ = match.group(1)
    return hex_ if len(hex_) == 6 else "".join(c * 2 for c in hex_)  # #eee is #eeeeee


def luminance(hex6: str) -> float:  # WCAG 2.1 relative luminance, from its definition
    def linear(c: float) -> float:
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4
    r, g, b = (linear(int(hex6[i:i + 2], 16) / 255) for i in (0, 2, 4))
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(a: str, b: str) -> float:
    hi, lo = sorted((luminance(a), luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def test_contrast_helper_matches_wcag_examples():
    assert round(contrast("000000", "ffffff"), 1) == 21.0 and contrast("777777", "777777") == 1.0
    assert round(contrast("767676", "ffffff"), 2) == 4.54  # the usual grey on white at the 4.5:1 line


def test_the_capsule_bars_stand_out_from_their_track_by_three_to_one():
    """A class capsule's bar (its length) against the grey track it grows in: #8aa8d0 was 2.1:1."""
    css = resources.files("capsnet.viz").joinpath("static/style.css").read_text()
    track = colour(css_rule(css, "#lengths .bar .track"))
    for selector in ("#lengths .bar .fill", "#lengths .bar.predicted .fill"):
        assert contrast(colour(css_rule(css, selector)), track) >= 3.0, selector
    assert colour(css_rule(css, "#lengths .bar .fill")) != colour(css_rule(css, "#lengths .bar.predicted .fill"))

"""capsnet._text: the pieces of messages written once."""
from capsnet._text import some_of


def test_some_of_names_the_first_few_and_counts_the_rest():
    assert some_of([]) == ""
    assert some_of(["a.png"]) == "a.png"
    assert some_of("abcde") == "a, b, c, d, e"  # exactly as many as shown: no "and 0 more"
    assert some_of("abcdef") == "a, b, c, d, e and 1 more"
    assert some_of(range(12), 8) == "0, 1, 2, 3, 4, 5, 6, 7 and 4 more"
    assert some_of((p for p in ["x", "y", "z"]), 2) == "x, y and 1 more"  # any iterable, read once

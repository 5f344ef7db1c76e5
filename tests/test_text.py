"""capsnet._text: the pieces of messages written once."""
from capsnet._text import some_of, told_apart


def test_some_of_names_the_first_few_and_counts_the_rest():
    assert some_of([]) == ""
    assert some_of(["a.png"]) == "a.png"
    assert some_of("abcde") == "a, b, c, d, e"  # exactly as many as shown: no "and 0 more"
    assert some_of("abcdef") == "a, b, c, d, e and 1 more"
    assert some_of(range(12), 8) == "0, 1, 2, 3, 4, 5, 6, 7 and 4 more"
    assert some_of((p for p in ["x", "y", "z"]), 2) == "x, y and 1 more"  # any iterable, read once


def test_names_holding_a_comma_or_an_edge_space_are_quoted_all_alike():
    assert told_apart(["cat", "dog"]) == ["cat", "dog"]
    assert ", ".join(told_apart(["cat", "dog, big"])) == '"cat", "dog, big"'  # one name, not two
    assert told_apart(["a ", "b"]) == ['"a "', '"b"'] and told_apart(["café"]) == ["café"]
    assert told_apart([]) == [] and told_apart(["dog"], among=["dog, big"]) == ['"dog"']  # listed beside it

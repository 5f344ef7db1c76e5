"""capsnet.routing.catalog and `capsnet routings`: what each registered routing takes, read from its code."""
from __future__ import annotations

import inspect
import re
import json

import pytest
import torch

from capsnet.routing import ROUTINGS, EMRouting, list_routings
from capsnet.routing.catalog import _arg_notes, describe_routing, format_routing, format_routings, routing_catalog
from routing_names import CAPSNET, SHIPPED, STACK
from cli_helpers import in_process


def test_every_registered_routing_has_a_row_with_what_the_registry_reads():
    rows = {r["name"]: r for r in routing_catalog()}
    assert sorted(rows) == list_routings()
    assert rows["dynamic"] | {"summary": ""} == {"name": "dynamic", "class": "DynamicRouting", "summary": "",
                                                 "iterates": True, "pose_bias": True, "probabilities": True,
                                                 "length_activations": True, "layer_sizes": []}
    assert (rows["em"]["pose_bias"], rows["em"]["layer_sizes"]) == (False, ["out_caps"])
    # EM's activations come from its cost; the others' are their poses' lengths (what export names them by)
    assert {n: rows[n]["length_activations"] for n in SHIPPED} == {n: n != "em" for n in SHIPPED}
    assert (rows["inverted"]["probabilities"], rows["inverted"]["layer_sizes"]) == (False, ["dim"])
    assert (rows["self-attention"]["iterates"], rows["self-attention"]["layer_sizes"]) == (False, ["in_caps", "out_caps"])
    assert rows["dynamic"]["summary"].startswith("Routing by agreement (Sabour et al. 2017, Procedure 1).")


@pytest.mark.parametrize("name", sorted(ROUTINGS))
def test_a_routings_options_are_its_constructors_parameters_with_their_defaults_and_notes(name):
    _check_options(name)


def test_a_routing_without_a_constructor_of_its_own_has_no_options_and_says_so(monkeypatch):
    """The registry takes a routing with no __init__ (nn.Module's *args, **kwargs pass nothing on), and the test
    above failed it ([] against ['args', 'kwargs']); its `capsnet routings NAME` printed a table of no rows (an
    extensibility review, 2026-12-03)."""
    from capsnet import routing as routing_module

    class Uniform(torch.nn.Module):
        """Uniform coupling: every child's vote counts alike."""

        def forward(self, votes, activations=None, bias=None, *, record=False):
            raise NotImplementedError

    monkeypatch.setitem(routing_module.ROUTINGS, "toy-uniform", Uniform)
    _check_options("toy-uniform")
    assert format_routing("toy-uniform") == ("toy-uniform: Uniform. Uniform coupling: every child's vote counts "
                                             "alike.\n\nIt takes no options.")


def _check_options(name):
    options = describe_routing(name)["options"]
    cls = ROUTINGS[name]  # a routing without a constructor of its own has none (nn.Module's *args, **kwargs)
    parameters = {} if cls.__init__ is torch.nn.Module.__init__ else inspect.signature(cls).parameters
    assert [o["name"] for o in options] == list(parameters)
    for o in options:
        p = parameters[o["name"]]
        assert o["default"] == (None if p.default is p.empty else p.default)
        assert o["note"], f"{name}'s {o['name']} has no entry under Args: in {ROUTINGS[name].__name__}'s docstring"
    assert {o["name"] for o in options if o["set_by_layer"]} <= {"in_caps", "out_caps", "dim", "iterations"}


def test_the_notes_are_read_from_the_args_block_with_continuations_and_shared_entries():
    class Documented:
        """A routing.

        Args:
            a, b: two sizes,
                continued.
            c: the third.

        Returns nothing.
        """

        def __init__(self, a, b, c=1):
            pass

    assert _arg_notes(Documented) == {"a": "two sizes, continued.", "b": "two sizes, continued.", "c": "the third."}
    notes = _arg_notes(EMRouting)
    assert notes["final_lambda"].startswith("the inverse temperature's scale (official code: 0.01;")
    assert notes["var_floor"] == "added to every variance (official code: 5e-4)."


def test_capsnet_routings_prints_the_table_and_a_routings_options_with_how_capsnet_takes_them(capsys):
    r = in_process(capsys, "routings")
    assert r.returncode == 0 and "| em | EMRouting | yes | no | yes | no | out_caps |" in r.stdout
    assert re.search(f"`capsnet train --routing NAME` takes {CAPSNET} ", r.stdout)
    assert re.search(f"`capsnet train --model segcaps --routing NAME` \\(or --model capspix2pix\\) takes {STACK} \\(",
                     r.stdout)
    r = in_process(capsys, "routings", "em")
    assert "| final_lambda | 0.01 | the inverse temperature's scale" in r.stdout
    assert "| out_caps | set by the layer |" in r.stdout
    assert "CapsNet starts it from beta_a_init=-25.0 and the digit capsules' W at N(0, 0.3^2)" in r.stdout
    r = in_process(capsys, "routings", "dynamic")
    assert "`--routing-option KEY=VALUE` (softmax, squash)" in r.stdout  # leaky and detach_agreement have flags
    r = in_process(capsys, "routings", "inverted")
    assert "CapsNet's --routing does not take it" in r.stdout
    r = in_process(capsys, "routings", "self-attention", "--json")
    assert json.loads(r.stdout) == describe_routing("self-attention")
    r = in_process(capsys, "routings", "nope")
    assert r.returncode == 2 and "invalid choice: 'nope'" in r.stderr
    assert format_routings().count("\n") == len(ROUTINGS) + 1 and format_routing("em").startswith("em: EMRouting.")


@pytest.mark.parametrize("name", list_routings())
def test_a_non_finite_vote_spoils_its_own_example_alone(name):
    """README: no routing checks its votes' values; a NaN or infinite vote makes that example's outputs NaN and
    leaves its batch-mates' as they were (a review asked for the behaviour to be said, 2026-11-30)."""
    import torch

    from capsnet.routing import create_routing

    torch.manual_seed(0)
    routing = create_routing(name, in_caps=6, out_caps=3, dim=4).eval()
    votes, act = torch.randn(3, 6, 3, 4), torch.rand(3, 6)
    alone = routing(votes[2:], act[2:])
    for bad in (float("nan"), float("inf")):
        spoilt = votes.clone()
        spoilt[0, 1, 2, 3] = bad
        out = routing(spoilt, act)
        assert not torch.isfinite(out.poses[0]).all()
        torch.testing.assert_close(out.poses[2:], alone.poses)
        assert torch.isfinite(out.poses[1:]).all()


@pytest.mark.e2e
def test_the_catalogs_keep_their_notes_under_python_OO_which_strips_docstrings(capsys):
    """`python -OO` strips docstrings: `capsnet routings dynamic` listed every option with no note and `capsnet
    models capsnet` lost its summary (carried from a review of 2026-11-30). The notes are read from the source."""
    import subprocess
    import sys

    commands = [["routings", "dynamic"], ["models", "capsnet"]]
    script = "import sys\nfrom capsnet.cli import main\nfor c in %r:\n    main(c)\n    print('=' * 9)" % commands
    stripped = subprocess.run([sys.executable, "-OO", "-c", script], capture_output=True, text=True, timeout=120)
    assert stripped.returncode == 0, stripped.stderr
    plain = ""
    for command in commands:
        r = in_process(capsys, *command)
        assert r.returncode == 0
        plain += r.stdout + "=" * 9 + "\n"
    assert "| routing rounds r (the paper uses 3). |" in stripped.stdout
    assert "Every size of the network; the defaults are the paper's MNIST" in stripped.stdout
    assert stripped.stdout == plain

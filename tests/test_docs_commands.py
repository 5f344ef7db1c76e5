"""The docs' `capsnet` command lines against the real command line: in README.md, docs/ and benchmarks/, every command
and flag one that exists; every whole command in a code block parsed by `capsnet`'s own parser; and every whole
`capsnet train` command taken through all of `capsnet train`'s checks (the model against the data set, the flags
against the model, each --model-option against the model's fields, the schedule and rounds rules) up to the point
where it would start training. A flag renamed, a model option dropped or a rule tightened then names the page and
the command a reader would copy, instead of the reader finding it."""
from __future__ import annotations

import argparse
import contextlib
import functools
import io
import re
import shlex
from pathlib import Path

import pytest

from capsnet import cli

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "benchmarks").rglob("*.md"))]
IDS = [str(p.relative_to(ROOT)) for p in PAGES]
# a word the reader fills in (S, NAME, RUN_DIR), a shell variable left unexpanded, an elision, [optional] or a|b
PLACEHOLDER = re.compile(r"^[A-Z][A-Z_0-9]*$|\$|\.\.\.|[\[\]|<>]")
WRAPPERS = {"nohup", "time", "env", "exec"}


def _words(text: str) -> list[str] | None:
    try:
        return shlex.split(text)
    except ValueError:  # an unclosed quote: prose, not a command
        return None


def _after_capsnet(words: list[str]) -> list[str] | None:
    """The arguments after `capsnet` (or `python -m capsnet`, `torchrun ... -m capsnet`), past environment settings
    and `nohup`/`nice -n N`; None for a line that runs something else (`python benchmarks/x.py capsnet ...`)."""
    while words and (re.match(r"^\w+=", words[0]) or words[0] in WRAPPERS or words[0] == "nice"):
        words = words[3:] if words[:2] == ["nice", "-n"] else words[1:]
    if words[:1] == ["capsnet"]:
        return words[1:]
    if words[:1] and words[0] in ("python", "python3", "torchrun") and "-m" in words:
        at = words.index("-m")
        return words[at + 2:] if words[at + 1:at + 2] == ["capsnet"] else None
    return None


def block_commands(text: str) -> list[list[str]]:
    """The `capsnet` commands of the fenced code blocks: continued lines joined, a variable the block sets
    (`common="..."`, or a `for x in a b` loop's first value) expanded, comments and redirections dropped, each
    command of a `&&`, `;` or `|` chain on its own."""
    found = []
    for block in re.findall(r"```[\w-]*\n(.*?)```", text, re.S):
        block = block.replace("\\\n", " ")
        values = dict(re.findall(r"^\s*(?:export\s+)?(\w+)=[\"']([^\"']*)[\"']", block, re.M))
        for name, first in re.findall(r"\bfor (\w+) in ([^\s;]+)", block):
            values.setdefault(name, first)
        for name, value in sorted(values.items(), key=lambda kv: -len(kv[0])):  # $common before $c
            block = block.replace("${%s}" % name, value).replace("$" + name, value)
        for line in block.splitlines():
            line = re.sub(r"(^|\s)#.*$", "", line)
            for part in re.split(r"&&|\|\||;|\||[()]|\s&(?:\s|$)", line):
                words = _words(re.sub(r"\s\d?>>?\s*\S+|\s2>&1", " ", part))
                args = _after_capsnet(words) if words else None
                if args:
                    found.append(args)
    return found


def inline_commands(text: str) -> list[list[str]]:
    """The `capsnet ...` spans of the prose (outside code blocks): often a fragment, `capsnet eval --truncation T`."""
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    spans = [_words(s.replace("\\|", "|")) for s in re.findall(r"`capsnet ([^`\n]+)`", prose)]
    return [s for s in spans if s]


@functools.cache
def _parsers() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    top = cli.build_parser()
    commands = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    return top, dict(commands.choices)


def unknown_words(args: list[str]) -> list[str]:
    """The command or flags of ``args`` (a fragment may hold placeholders) that `capsnet` does not have."""
    top, commands = _parsers()
    own = {o for a in top._actions for o in a.option_strings}
    while args and args[0] in own:  # `capsnet -v train ...`
        args = args[1:]
    if not args or PLACEHOLDER.search(args[0]):  # `capsnet COMMAND --help`
        return []
    if args[0] not in commands:
        return [args[0]]
    flags = {o for a in commands[args[0]]._actions for o in a.option_strings} | own
    return [w.split("=")[0] for w in args[1:] if w.startswith("-") and not re.match(r"^-\d", w)
            and w.split("=")[0] not in flags]


def parse_error(args: list[str]) -> str | None:
    """What `capsnet`'s parser says of a whole command; None if it takes it."""
    top, _ = _parsers()
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said), contextlib.redirect_stdout(io.StringIO()):
            _, unknown = top.parse_known_args(args)
    except SystemExit as e:
        return None if not e.code else " ".join(line for line in said.getvalue().splitlines() if "error:" in line)
    return f"unrecognized arguments: {' '.join(unknown)}" if unknown else None


def whole(args: list[str]) -> bool:
    return not any(PLACEHOLDER.search(a) for a in args)


@functools.cache
def page_commands(page: Path) -> tuple[list[list[str]], list[list[str]]]:
    text = page.read_text(encoding="utf-8")
    return block_commands(text), inline_commands(text)


def test_the_reader_finds_commands_and_the_checks_catch_a_wrong_one():
    text = ("```bash\ncommon=\"--epochs 2 --seed 0\"\nfor m in pix2pix capspix2pix; do\n"
            "  OMP_NUM_THREADS=1 nohup nice -n 5 capsnet train --model $m $common \\\n    --out runs/x > log 2>&1 &\n"
            "done\npython benchmarks/speed.py capsnet baseline  # a model's name, not the command\n"
            "capsnet eval --checkpoint runs/x | head  # and another\n```\nProse: `capsnet eval --truncation T`.\n")
    assert block_commands(text) == [["train", "--model", "pix2pix", "--epochs", "2", "--seed", "0", "--out", "runs/x"],
                                    ["eval", "--checkpoint", "runs/x"]]
    assert inline_commands(text) == [["eval", "--truncation", "T"]]
    assert unknown_words(["eval", "--truncation", "T"]) == []
    assert unknown_words(["train", "--epoch", "3", "--model-option", "x=1"]) == ["--epoch"]
    assert unknown_words(["evaluate", "--checkpoint", "r"]) == ["evaluate"]
    assert parse_error(["train", "--epochs", "3"]) is None
    assert "invalid choice: 'fp8'" in parse_error(["bench", "--dtype", "fp8"])
    assert sum(len(b) + len(i) for b, i in map(page_commands, PAGES)) >= 300  # the reader found the docs' commands
    assert sum(len(list(filter(_trainable, page_commands(p)[0]))) for p in PAGES) >= 50  # 77 on 2026-11-29


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_every_command_and_flag_in_the_docs_exists(page):
    blocks, inline = page_commands(page)
    wrong = [f"capsnet {shlex.join(a)}: {', '.join(bad)}" for a in blocks + inline if (bad := unknown_words(a))]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_every_whole_command_in_a_code_block_parses(page):
    wrong = [f"capsnet {shlex.join(a)}: {why}" for a in page_commands(page)[0]
             if whole(a) and (why := parse_error(a))]
    assert not wrong, "\n".join(wrong)


class _Training(Exception):
    """Raised where `capsnet train` would start training: every check before it passed."""


def _trainable(args: list[str]) -> bool:
    """A whole `capsnet train` command that needs nothing but this checkout: not a resume (its run directory),
    not torchrun's (its processes), not the user's own folder."""
    return (args[:1] == ["train"] and whole(args) and not {"--resume", "--distributed"} & set(args)
            and not any(a.startswith(("folder:", "pairs:", "classes:")) for a in args))


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_every_whole_train_command_passes_the_train_checks(page, monkeypatch, tmp_path):
    from capsnet import gan, synthesis, train

    def training(*args, **kwargs):
        raise _Training

    monkeypatch.setattr(train, "fit", training)
    monkeypatch.setattr(gan, "fit_gan", training)
    monkeypatch.setattr(synthesis, "judge_for", lambda *args, **kwargs: None)  # reads the judge's weights
    monkeypatch.chdir(tmp_path)  # the default --out of a command without one: runs/... here, never made
    wrong = []
    for args in filter(_trainable, page_commands(page)[0]):
        said = io.StringIO()
        try:
            with contextlib.redirect_stderr(said), contextlib.redirect_stdout(io.StringIO()):
                code = cli.main(args)
            wrong.append(f"capsnet {shlex.join(args)}: returned {code}: {said.getvalue().strip()[-300:]}")
        except _Training:
            pass
        except SystemExit as e:
            why = " ".join(line for line in said.getvalue().splitlines() if "error:" in line)
            wrong.append(f"capsnet {shlex.join(args)}: {why or f'exit {e.code}'}")
    assert not wrong, "\n".join(wrong)
    assert not any(tmp_path.iterdir())  # nothing written before training


def command_rows(text: str) -> dict[str, set[str]]:
    """The README's command table: for each command, the flags its rows name (`--x`, `--x N`, `--x a\\|b`), its
    own row and torchrun's row for it together."""
    rows: dict[str, set[str]] = {}
    for line in text.splitlines():
        if m := re.match(r"\| `(?:torchrun [^`]*-m )?capsnet (\w+)[^`]*` \|", line):
            spans = re.findall(r"`([^`]+)`", line)
            rows.setdefault(m.group(1), set()).update(
                w.split("=")[0] for s in spans for w in s.replace("\\|", " ").split() if w.startswith("--"))
    return rows


def test_the_readmes_command_table_names_every_flag_of_every_command():
    rows = command_rows((ROOT / "README.md").read_text(encoding="utf-8"))
    _, commands = _parsers()
    assert set(rows) == set(commands)  # a row for each command
    missing = {name: sorted(flags - rows[name]) for name, parser in commands.items()
               if (flags := {o for a in parser._actions for o in a.option_strings if o.startswith("--")} - {"--help"})
               - rows[name]}
    assert not missing, f"flags the README's command table does not name: {missing}"


def test_the_table_reader_sees_a_flag_left_out():
    rows = command_rows("| `capsnet eval --checkpoint RUN_DIR` | `--which best\\|last`, `--json FILE` |\n"
                        "| `torchrun --nproc_per_node N -m capsnet train ...` | `--distributed` refuses |\n")
    assert rows == {"eval": {"--checkpoint", "--which", "--json"}, "train": {"--nproc_per_node", "--distributed"}}

"""The ``capsnet`` command: parse, call the library, print. Nothing imports this.

Each command has one function that adds its arguments and one handler that
builds the configs, calls the library and prints. Choices come from the
registries (models, tasks, speed settings); flags that set a config field
default to "not given" (``argparse.SUPPRESS``), so a handler knows what was
typed, and the help shows the config's own default.
"""
from __future__ import annotations

import argparse
import contextlib
import contextvars
import dataclasses
import difflib
import json
import logging
import os
import re
import shlex
import sys
import threading
import warnings
from pathlib import Path
from typing import Any, Iterator, Sequence

from . import __version__
from ._config import json_value
from ._progress import one_line_warnings
from ._text import some_of
from .average import WEIGHTS
from .bench import DTYPES
from .checkpoint import FolderInTheWay, RunLock, check_out_dir
from .data.augment import AUGMENTATIONS
from .data.tasks import (CLASSES_PREFIX, FOLDER_PREFIX, PAIRS_PREFIX, TASKS, absolute_dataset, dataset_stem,
                         input_shape, task, task_kind, user_folder)
from .experiments import COMPARED, DEFAULT_MODELS, EXPERIMENTS, LESS_DATA_SIZES, planned_models
from .export import FORMATS, MIN_OPSET
from .figures.report import MISCLASSIFIED
from .predict import PREDICTIONS_FILE
from .memory import ALLOCATORS
from .models import (MODELS, BaselineCNNConfig, CapsNetConfig, default_routing, model_name, model_spec,
                     train_defaults)
from .models.rounds import ROUNDS, unused_rounds
from .models.capsnet import unused_switches
from .models.catalog import DATASET_FIELDS
from .models.segcaps import stack_routings
from .routing import list_routings
from .runtime import AMP_MODES, COMPILE_MODES, parse_device, require_compiler, resolve_device
from .train import LR_SCHEDULES, SAVE_EVERY_S, TrainConfig, saved_configs, strict_json

__all__ = ["main", "build_parser"]


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each default, except None: the help text itself says what an absent value means; a list default as it
    is typed (128 256, not [128, 256]); lines never broken inside a flag or a value (--lr-decay-/steps could not be
    copied as printed)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default is None:
            return action.help or ""
        default = action.default
        if isinstance(default, (list, tuple)) and action.help and "%(default)" not in action.help:
            typed = " ".join(map(str, default)) or "none"
            return f"{action.help} (default: {typed.replace('%', '%%')})"
        return super()._get_help_string(action)

    def _split_lines(self, text: str, width: int) -> list[str]:
        import textwrap

        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)

    def _fill_text(self, text: str, width: int, indent: str) -> str:  # a description or epilog
        import textwrap

        return textwrap.fill(" ".join(text.split()), width, initial_indent=indent, subsequent_indent=indent,
                             break_on_hyphens=False)


class _Parser(argparse.ArgumentParser):
    """Errors in two lines: the message, with what a misspelt choice or option most likely meant, and where the help
    is; not argparse's whole usage first (25 lines for `capsnet train`, above the line that matters).
    ``before_command``: the options of `capsnet` itself, which a command's parser points back to."""

    before_command: tuple[str, ...] = ()
    argv: list[str] = []  # the command line being parsed (set by main): what a hint may quote back

    def error(self, message: str):  # type: ignore[override]
        # under torchrun every process meets the same error: each says which it is, as for the other errors
        self.exit(2, f"{self.prog}{_rank_tag()}: error: {message}{_hint(message, self)}\n(`{self.prog} --help` "
                     f"lists the options)\n")


def _action(parser: argparse.ArgumentParser, name: str) -> argparse.Action | None:
    """The argument argparse's message calls ``name`` (its option strings joined by '/', a metavar or a positional's
    name)."""
    return next((a for a in parser._actions if a.option_strings and name == "/".join(a.option_strings)
                 or not a.option_strings and name in (a.metavar, a.dest)), None)


def _shipped_model_hint(value: str, command: str) -> str:
    """For a shipped trained model's name given where a registered model is asked for (``command``'s --model or
    NAME): what it is and where it goes; else ''."""
    from . import pretrained

    name = value[len(pretrained.PREFIX):] if pretrained.is_shipped(value) else value
    if name not in pretrained.names():
        return ""
    from .checkpoint import load_checkpoint

    model = load_checkpoint(pretrained.PREFIX + name).model_name
    use = (f"`--model {model}` trains a new one" if command == "train" else
           f"`--models {model}` trains new ones" if command == "experiment" else
           f"`capsnet models {model}` lists its fields")
    makes = "generate" if MODELS[model].kind == "synthesis" else "predict"  # predict refuses a synthesis model
    return (f"; {pretrained.PREFIX}{name} is a trained model shipped with capsnet, not a model's name: its "
            f"architecture is {model} ({use}); eval, viz, figures, export and {makes} take it as --checkpoint "
            f"{pretrained.PREFIX}{name}")


def _hint(message: str, parser: _Parser) -> str:
    """What to add to argparse's ``message``: the nearest choice to an invalid one (or, for an invalid command,
    that a command's options typed before it go after it), the nearest option to each unrecognized one (or that an
    option of `capsnet` itself goes before the command), a missing positional's choices; else ''."""
    import re

    choice = re.match(r"argument (\S+): invalid choice: (['\"])(.*?)\2", message)
    if choice:  # the choices from the parser, not the message (whose quoting differs between Python versions)
        action = _action(parser, choice[1])
        if isinstance(action, argparse._SubParsersAction) and (early := _before_the_command(parser, action)):
            return early
        command = parser.prog.split()[-1]
        shipped = _shipped_model_hint(choice[3], command) if choice[1] == "--model" or (
            choice[1] == "NAME" and command == "models") else ""  # (not `capsnet routings NAME`)
        if shipped:  # a name from `capsnet models`' shipped table, where an architecture was asked for
            return shipped
        close = difflib.get_close_matches(choice[3], [str(c) for c in (action and action.choices) or ()], n=1,
                                          cutoff=0.6)
        return f"; did you mean {close[0]!r}?" if close else ""
    if message.startswith("unrecognized arguments: "):
        known = [o for o in parser._option_string_actions if o.startswith("--")]
        guesses, misplaced, early, past_dashes, routed = [], [], [], False, False
        said, command = "", parser.prog.split()[-1]
        for token in message[len("unrecognized arguments: "):].split():
            flag = token.split("=")[0]
            if token == "--":  # what follows is positional to argparse, however it is spelt
                past_dashes = True
            elif not flag.startswith("-") or past_dashes:
                continue
            elif command == "experiment" and flag in ("--routing", "--routing-option"):  # not --routing-iterations
                routed = True
            elif flag in parser.before_command:
                misplaced.append(flag)
            elif flag.startswith("--") and len(owners := [o for o in parser.before_command if o.startswith(flag)]) == 1:
                misplaced.append(owners[0])  # an abbreviation, which argparse takes before the command
            elif flag in parser._option_string_actions:  # the command's own option, typed before the command
                early.append(flag)
            elif flag.startswith("--") and len(whole := [o for o in known if o.startswith(flag)]) == 1:
                guesses.append((whole[0], flag))  # the one option it begins (--rep: --repeats, not --help)
            elif close := difflib.get_close_matches(flag, known, n=1, cutoff=0.7):
                guesses.append((close[0], flag))
        if routed:
            said = ("; capsnet experiment routes a model by another algorithm as --models NAME:ROUTING (--models "
                    "capsnet:em)")
        if len(guesses) == 1:
            said += f"; did you mean {guesses[0][0]}?"
        elif guesses:
            said += "; did you mean " + ", ".join(f"{g} (for {t})" for g, t in guesses) + "?"
        for flags, owner, where, example in ((misplaced, "capsnet itself", "before", f"{' '.join(misplaced)} {command}"),
                                             (early, f"capsnet {command}", "after", f"{command} {' '.join(early)}")):
            if flags:
                one = len(flags) == 1
                said += (f"; {', '.join(flags)} {'is an option' if one else 'are options'} of {owner}: put "
                         f"{'it' if one else 'them'} {where} the command (capsnet {example} ...)")
        if past_dashes:
            said += _past_dashes(command)
        return said
    missing = re.match(r"the following arguments are required: (.*)", message)
    if missing:
        listed = [(name, _action(parser, name)) for name in missing[1].split(", ")]
        return "".join(f"; {name} is one of {', '.join(map(str, action.choices))}" for name, action in listed
                       if action is not None and action.choices and not action.option_strings) + _stray_values(
            parser, [name for name, action in listed if action is not None and action.option_strings])
    return ""


def _past_dashes(command: str) -> str:
    return f"; everything after -- is read as positional (capsnet {command} takes none there): drop the --"


def _stray_values(parser: _Parser, missing: list[str]) -> str:
    """For a command that takes no positional arguments and misses the options ``missing``: the values on its command
    line that no option comes before (`capsnet generate labels/ ...`), and which option they were likely meant for;
    else ''."""
    command = parser.prog.split()[-1]
    if not missing or command not in parser.argv or any(
            not a.option_strings for a in parser._actions if not isinstance(a, argparse._SubParsersAction)):
        return ""
    tokens, strays, at, dashed = parser.argv[parser.argv.index(command) + 1:], [], 0, False
    while at < len(tokens):
        token, at = tokens[at], at + 1
        if token == "--":  # argparse reads everything after it as values, flags included
            strays, dashed = strays + tokens[at:], any(t.startswith("-") and len(t) > 1 for t in tokens[at:])
            break
        if not token.startswith("-") or len(token) == 1:
            strays.append(token)
            continue
        if "=" in token:  # a flag and its value in one
            continue
        action = parser._option_string_actions.get(token)  # whole flags only (allow_abbrev=False)
        takes = 1 if action is None else action.nargs if action.nargs is not None else 1  # an unknown flag's value
        if takes in ("+", "*", "?"):  # as many values as follow (one at most for "?")
            while at < len(tokens) and not tokens[at].startswith("-"):
                at += 1
                if takes == "?":
                    break
        elif isinstance(takes, int):
            at += takes
    if dashed:  # `capsnet generate --out o -- --labels l`: the flags were there, made values by the --
        return _past_dashes(command)
    if not strays:
        return ""
    one, shown = len(strays) == 1, " ".join(strays)
    said = (f"; {shown} {'has' if one else 'have'} no option before {'it' if one else 'them'} (capsnet {command} "
            f"takes only options)")
    if one and len(missing) == 1:
        return f"{said}: did you mean {missing[0]} {strays[0]}?"
    return f"{said}: name the option {'it is' if one else 'each is'} for ({', '.join(missing)})"


def _before_the_command(parser: _Parser, commands: argparse._SubParsersAction) -> str:
    """A command's options typed before it (`capsnet --epochs 3 train`: argparse reads the 3 as the command): say
    whose they are and where they go; '' when the command line names no command or holds no such option."""
    argv = parser.argv
    at = next((i for i, token in enumerate(argv) if token in commands.choices), None)
    if at is None:
        return ""
    command, own = argv[at], set(parser._option_string_actions)
    ahead = [t for t in argv[:at] if t.split("=")[0] not in own]
    theirs = commands.choices[command]._option_string_actions
    flags = [t.split("=")[0] for t in ahead if t.split("=")[0] in theirs]
    if not flags:
        return ""
    one = len(flags) == 1
    kept = [t for t in argv[:at] if t not in ahead]
    example = shlex.join(["capsnet", *kept, command, *ahead])
    return (f"; {', '.join(flags)} {'is an option' if one else 'are options'} of capsnet {command}, not of capsnet "
            f"itself: put {'it' if one else 'them'} after the command ({example} ...)")


def _number(kind: type, *, minimum: float, strict: bool = False, maximum: int | None = None):
    """An argparse type: a finite ``kind`` that is >= minimum (or > it when strict), and <= ``maximum`` if given."""
    what = "an integer" if kind is int else "a number"
    bound = f"{'>' if strict else '>='} {minimum:g}" + (f" and <= {maximum:,}" if maximum is not None else "")

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what} {bound}, got {text!r}") from None
        if not (value > minimum if strict else value >= minimum) or value == float("inf") or \
                (maximum is not None and value > maximum):
            raise argparse.ArgumentTypeError(f"must be {'an integer' if kind is int else 'a finite number'} {bound}, got {text}")
        return value
    return parse


def _device(text: str) -> str:
    """An argparse type: auto, or a device name torch knows (cpu, cuda, cuda:1, mps, ...); kept as typed."""
    if text != "auto":
        try:
            parse_device(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return text


_positive_int = _number(int, minimum=1, maximum=2 ** 31 - 1)  # counts and sizes (2^70 reached torch as a traceback)
_nonneg_int = _number(int, minimum=0)
_positive_float = _number(float, minimum=0, strict=True)
_nonneg_float = _number(float, minimum=0)


def _allowed_host(text: str) -> str:
    """An argparse type: a host name for ``capsnet viz --allow-host`` (a URL or a wildcard refused, naming the fix),
    checked before the model loads."""
    from .viz.server import checked_host_name

    try:
        return checked_host_name(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--allow-host takes ")) from None


def _unit_float(text: str) -> float:
    """An argparse type: a number in [0, 1)."""
    value = _nonneg_float(text)
    if value >= 1:
        raise argparse.ArgumentTypeError(f"must be a number in [0, 1) (e.g. 0.999), got {text}")
    return value


EMA_HELP = ("evaluate and save an exponential moving average of the weights (synthesis models: the generator's) "
            "with this decay, e.g. 0.999 (TensorFlow's warm-up: at most (1 + t) / (10 + t) after step t); training "
            "itself is unchanged, and a resume continues both (0: the last weights)")
GRAD_CLIP_HELP = ("clip the gradient's global norm to NORM before each optimizer step (0: no clipping); each "
                  "evaluated epoch's metrics then hold grad_norm, the mean norm before clipping, and clipped, the "
                  "share of steps it cut (not for synthesis models)")


def _seed(value: str) -> int:
    """A seed: an integer in 0 .. 2**63 - 1 (torch's generators take no larger one)."""
    n = _nonneg_int(value)
    if n >= 2**63:
        raise argparse.ArgumentTypeError(f"must be below 2**63 (9223372036854775808), got {value}")
    return n


def _dataset(value: str) -> str:
    """A registered data set's name, or folder:DIR, pairs:DIR or classes:DIR (checked when it is read; TrainConfig
    makes a run's DIR absolute)."""
    folder = user_folder(value)
    if value in TASKS or (folder and folder[1]):  # folder:DIR with a DIR
        return value
    close = difflib.get_close_matches(value, list(TASKS), n=1, cutoff=0.6)
    raise argparse.ArgumentTypeError(f"invalid choice: {value!r} (choose from {', '.join(TASKS)}, or "
                                     f"{FOLDER_PREFIX}DIR for your own images and masks, or {PAIRS_PREFIX}DIR for "
                                     f"your own label maps and images, or {CLASSES_PREFIX}DIR for your own images "
                                     f"in a folder per class)" + (f"; did you mean {close[0]!r}?" if close
                                                                           else ""))


# the metavar of every --dataset
_DATASETS = "{" + ",".join(TASKS) + f",{FOLDER_PREFIX}DIR,{PAIRS_PREFIX}DIR,{CLASSES_PREFIX}DIR}}"
_DEFAULT_MODEL = {"classification": "capsnet", "segmentation": "segcaps", "synthesis": "capspix2pix"}


def _field_flag(parser: argparse.ArgumentParser, flag: str, config: type, field: str, help: str, *,
                show_default: bool = True, **kw: Any) -> None:
    """A flag that sets ``config.field``: absent from the namespace unless typed; its help shows the config's default
    (``show_default=False``: a help that states its own)."""
    default = next(f.default for f in dataclasses.fields(config) if f.name == field)
    shown = " ".join(map(str, default)) if isinstance(default, tuple) else default
    if kw.get("action") not in ("store_const", "store_true"):
        help = f"{help} (default: {shown})" if show_default else help
        if "choices" not in kw:
            kw.setdefault("metavar", flag.lstrip("-").upper().replace("-", "_"))
    parser.add_argument(flag, dest=field, default=argparse.SUPPRESS, help=help, **kw)


def _typed(args: argparse.Namespace, fields: Sequence[str]) -> dict[str, Any]:
    return {f: getattr(args, f) for f in fields if hasattr(args, f)}


def _flag(field: str) -> str:
    return {"decoder": "--no-decoder", "routing_bias": "--no-routing-bias", "channels": "--cnn-channels",
            "hidden": "--cnn-hidden", "pool": "--cnn-pool",
            "routing_options": "--routing-option"}.get(field, "--" + field.replace("_", "-"))


def _opened_by_flag(e: ValueError, given: dict[str, Any], options: dict[str, Any]) -> ValueError:
    """A config's refusal of a value the user typed, opened by the flag as typed ("--dropout 1.5: BaselineCNNConfig.
    dropout must be in [0, 1), got 1.5"): the config names its field, which a command line never showed. Another
    refusal as it is. A refusal that opens with another field but names a typed one ("primary_caps * primary_dim
    must be ..." for a typed primary_dim) is opened by the typed ones its subject names (not a field's name used as a
    word in the rest: "... lower its channel, capsule or decoder sizes" was opened by --no-decoder)."""
    for field, value in given.items():
        if re.match(rf"(\w+\.)?{field}\b", str(e)):
            said = str(e)
            if field == "routing_options":  # the config's whole dict, a routing's start included, was never typed
                said = re.sub(r"^(\w+\.)?routing_options \{.*?\}: ", "", said)
            return type(e)(f"{_as_typed(field, value, field in options)}: {said}")
    subject = re.split(r" must |[:;,]", str(e), maxsplit=1)[0]  # what is refused, not the words of its fix
    named = [_as_typed(field, value, field in options) for field, value in given.items()
             if re.search(rf"(?<![\w-]){field}(?![\w-])", subject)]
    return type(e)(f"{', '.join(named)}: {e}") if named else e


@contextlib.contextmanager
def _sizes_by_flag(typed: dict[str, Any]) -> Iterator[None]:
    """The data's refusal of a size the user typed ("train_size 70000 exceeds the 60000 ..."), said with its flag
    ("--train-size 70000 exceeds ..."): the field's name was never on the command line. Other errors pass as they
    are."""
    try:
        yield
    except ValueError as e:
        found = re.match(r"(train|test)_size (\d+) exceeds ", str(e))
        if type(e) is not ValueError or found is None or typed.get(f"{found[1]}_size") != int(found[2]):
            raise
        raise ValueError(f"--{found[1]}-size{str(e)[len(found[1]) + 5:]}") from None


def _as_typed(field: str, value: Any, option: bool = False) -> str:
    """``field`` set to ``value`` as a command line types it: "--seed 3", "--no-decoder", "--model-option depth=3"."""
    if option:
        return f"--model-option {field}={json.dumps(list(value) if isinstance(value, tuple) else value)}"
    if field == "model":
        return f"--model {value}"
    flag = _flag(field)
    if isinstance(value, dict):  # --routing-option KEY=VALUE, once a key
        return " ".join(f"{flag} {k}={json.dumps(v)}" for k, v in value.items()) or f"no {flag}"
    if isinstance(value, bool):  # a switch (--no-decoder: decoder false); the value it does not set, as a field's
        return flag if flag.startswith("--no-") != value else f"{field}={json.dumps(value)}"
    return f"{flag} {' '.join(map(str, value)) if isinstance(value, (tuple, list)) else value}"


# What a --resume may set anew: how long and how often (the run's TrainConfig.epochs, eval_every), and the flags no
# checkpoint keeps.
_RESUME_MAY_CHANGE = ("A resume may change --epochs and --eval-every, and the flags a checkpoint does not keep: "
                      "--data-dir, --device, --compile, --save-every, --tensorboard, --allocator")


def _counted(n: int, one: str) -> str:
    """``n`` and its noun: "1 epoch", "3 epochs"."""
    return f"{n} {one}{'' if n == 1 else 's'}"


def _listed(flags: list[str], one: str, many: str) -> str:
    """'--a sets' or '--a, --b set': the flags with the verb that agrees with them."""
    return f"{', '.join(flags)} {one if len(flags) == 1 else many}"


def _either(names: list[str]) -> str:
    """'a', 'a or b', 'a, b or c'."""
    return f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else names[0]


def _owners(field: str, kind: str) -> list[str]:
    """The registered models whose config has ``field``: those of the task ``kind`` where any has it, else all."""
    having = [name for name in MODELS if field in _fields(name)]
    return [name for name in having if MODELS[name].kind == kind] or having


# ------------------------------------------------------------------------------------------ arguments

# Model config fields with a flag of their own (_flag(field)); a flag applies to every model whose config has the
# field, and --model-option KEY=VALUE sets any field of the chosen model.
_MODEL_FIELDS = ("routing_iterations", "routing", "routing_options", "conv1_channels", "primary_types", "decoder",
                 "routing_bias", "leaky_routing", "detach_agreement", "dropout", "channels", "hidden", "pool")


def _fields(model: str) -> set[str]:
    return {f.name for f in dataclasses.fields(MODELS[model].config)}


class _KeyValues(argparse.Action):
    """KEY=VALUE pairs (parsed by ``type``) gathered into one dict, a later KEY over an earlier one."""

    def __call__(self, parser, namespace, values, option_string=None):
        key, value = values
        setattr(namespace, self.dest, {**getattr(namespace, self.dest, {}), key: value})


def _routing_option(text: str) -> tuple[str, Any]:
    """--routing-option KEY=VALUE, VALUE as JSON (else a string)."""
    try:
        return _model_option(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE (e.g. final_lambda=0.02), got {text!r}") from None


def _model_option(text: str) -> tuple[str, Any]:
    """KEY=VALUE with VALUE as JSON (3, 0.5, true, [64, 128]), else as a string."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE (e.g. caps1_types=16), got {text!r}")
    return key.strip(), json_value(value)


_TRAIN_FIELDS = ("dataset", "epochs", "batch_size", "lr", "lr_decay", "lr_decay_steps", "lr_schedule", "warmup_steps",
                 "lr_min",
                 "recon_weight", "shift", "augment", "val_size", "train_size", "test_size", "eval_every", "seed", "amp",
                 "ema_decay", "grad_clip", "adam_beta1")

# capsnet train --preset NAME: the flags it stands for (by their parsed names), each applied unless typed, and
# --eval-every the run's --epochs (one evaluation and checkpoint, after the last epoch) unless typed. "fast" aims at
# <= 0.33% final MNIST test error in <= 20 s of training on one H100 (issue 16): bf16, compiled with CUDA graphs
# ("reduce-overhead"), 25 epochs of batch 512, a linear warm-up over 235 steps (2 epochs, 8% of the run) to 4e-3 and a
# linear decay to 0. Measured on an H100 (2026-11-25, benchmarks/results/gpu-h100-2026-11-25): final test error
# 0.33/0.37/0.33% for seeds 0/1/2 with 22.7 s of training after the first (compiling) epoch, 27 s with it. The first
# recipe tried there (batch 256, lr 2e-3, compile "default") gave 0.39/0.38/0.37% in 34-45 s: at batch 128-256 the
# compiled step waits on the CPU's kernel launches (its GPU time is a third of its wall time), which CUDA graphs remove.
# lr 4e-3 is the authors' 1e-3 at batch 128 scaled linearly to batch 512 (Goyal et al. 2017).
_PRESETS: dict[str, dict[str, Any]] = {
    "fast": {"dataset": "mnist", "model": "capsnet", "epochs": 25, "batch_size": 512, "lr": 4e-3,
             "lr_schedule": "linear", "warmup_steps": 235, "amp": "bf16", "compile": "reduce-overhead", "val_size": 0},
}


def _routing_name(value: str) -> str:
    """--routing's value: a registered routing; an unknown one is refused naming those CapsNet takes (argparse's
    choices listed inverted too, which the config then refuses)."""
    if value not in list_routings():
        raise argparse.ArgumentTypeError(f"unknown routing {value!r}; CapsNet's digit capsules take "
                                         f"{_either(CapsNetConfig.probability_routings())} (`capsnet routings` lists "
                                         f"every registered routing)")
    return value


def _capsnet_arguments(p: argparse.ArgumentParser, *, all_flags: bool) -> None:
    # these set the other capsule models' fields of the same names, whose defaults differ (inverted-capsnet: 2
    # rounds; em-capsnet-small: 64 channels, 8 types): the help names the model's own default, not CapsNet's
    own = "default: the model's own; `capsnet models NAME` lists it"
    _field_flag(p, "--routing-iterations", CapsNetConfig, "routing_iterations",
                f"rounds of routing by agreement (paper: 3; {own})", type=_positive_int, show_default=False)
    _field_flag(p, "--conv1-channels", CapsNetConfig, "conv1_channels",
                f"channels of Conv1 (paper: 256; fewer train faster; {own})", type=_positive_int, show_default=False)
    _field_flag(p, "--primary-types", CapsNetConfig, "primary_types", f"primary capsule types (paper: 32; {own})",
                type=_positive_int, show_default=False)
    if all_flags:
        _field_flag(p, "--routing", CapsNetConfig, "routing", "the routing algorithm (capsnet.routing) of CapsNet's "
                    "digit capsules, the rest of the network and its loss the paper's; for segcaps and capspix2pix, "
                    f"of every capsule layer ({' or '.join(stack_routings())})",
                    # every registered routing, so that one CapsNet cannot take (inverted) is refused with its reason
                    # by the config, not by argparse's bare "invalid choice"; the help lists those it takes
                    type=_routing_name, metavar="{" + ",".join(CapsNetConfig.probability_routings()) + "}")
        p.add_argument("--routing-option", type=_routing_option, action=_KeyValues, dest="routing_options",
                       default=argparse.SUPPRESS, metavar="KEY=VALUE",
                       help="an option of the --routing algorithm (VALUE as JSON), e.g. final_lambda=0.02 for em; "
                            "repeat for several (`capsnet routings NAME` lists a routing's options)")
        _field_flag(p, "--no-decoder", CapsNetConfig, "decoder", "train without the reconstruction decoder",
                    action="store_const", const=False)
        _field_flag(p, "--no-routing-bias", CapsNetConfig, "routing_bias",
                    "leave out the learned bias on s_j (the paper's 8,215,568 weights)", action="store_const", const=False)
        _field_flag(p, "--leaky-routing", CapsNetConfig, "leaky_routing",
                    "add the authors' zero 'orphan' logit to the routing softmax", action="store_const", const=True)
        _field_flag(p, "--detach-agreement", CapsNetConfig, "detach_agreement",
                    "no gradient through the routing rounds before the last", action="store_const", const=True)


def _baseline_arguments(p: argparse.ArgumentParser) -> None:
    _field_flag(p, "--dropout", BaselineCNNConfig, "dropout", "dropout before the CNN baseline's last layer "
                "(--model baseline; default: 0.5); a synthesis generator's dropout (default: its own, 0.5 for "
                "capspix2pix and pix2pix, 0 for capspix2pix-deep)", type=_nonneg_float, show_default=False)
    _field_flag(p, "--cnn-channels", BaselineCNNConfig, "channels", "channels of the CNN baseline's 5x5 "
                "convolutions (paper: 256 256 128)", type=_positive_int, nargs="+")
    _field_flag(p, "--cnn-hidden", BaselineCNNConfig, "hidden", "sizes of the CNN baseline's fully connected layers "
                "(paper: 328 192)", type=_positive_int, nargs="+")
    _field_flag(p, "--cnn-pool", BaselineCNNConfig, "pool", "a 2x2 max-pool after each of the CNN baseline's "
                "convolutions (section 5's has none; with --cnn-channels 512 256 --cnn-hidden 1024 it is the authors' "
                "MultiMNIST baseline, 24.5M weights at 36x36)", action="store_const", const=True)


def _compile_mode(text: str) -> str | bool:
    """An argparse type: a --compile MODE of ``COMPILE_MODES``, or "none" (False: not compiled), which a preset that
    compiles has no other way to be told."""
    if text == "none":
        return False
    if text not in COMPILE_MODES:
        raise argparse.ArgumentTypeError(f"invalid choice: {text!r} (choose from none, {', '.join(COMPILE_MODES)})")
    return text


def _speed_arguments(p: argparse.ArgumentParser, what: str, preset: bool = True) -> None:
    _field_flag(p, "--amp", TrainConfig, "amp", f"bf16: {what} under bfloat16 autocast, weights and Adam in fp32 (for "
                "GPUs; a CPU without bfloat16 units runs it far slower); fp16: under float16 autocast with a "
                "gradient scaler, steps whose gradient is not finite skipped (for GPUs without bfloat16: T4, V100); "
                "evaluation stays fp32", choices=AMP_MODES)
    p.add_argument("--compile", nargs="?", const="default", default=None, type=_compile_mode, metavar="MODE",
                   help=f"compile the model for {what} with torch.compile (the optimizer stays eager, so the decaying "
                        f"learning rate never recompiles it; a synthesis model: its generator); pays off on GPUs. "
                        f"MODE: {', '.join(COMPILE_MODES)}, or none (not compiled, as without the flag"
                        + (": over a preset's" if preset else "") + "); the flag alone: default")


_DATA_DIR_HELP = ("folder holding one folder per data set: mnist/, fashion-mnist/, smallnorb/, cifar10/, svhn/ "
                  "(default: $CAPSNET_DATA, else a user cache, downloading when missing)")


def _common(p: argparse.ArgumentParser, *, device: str = "auto", trains: bool = False) -> None:
    p.add_argument("--data-dir", default=None, help=_DATA_DIR_HELP)
    p.add_argument("--device", default=device, type=_device, help="auto (CUDA when present, else CPU), cpu, cuda or cuda:N")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bars" + (" (each evaluated epoch's line is still printed as it ends)" if trains
                                              else ""))


def _train_arguments(t: argparse.ArgumentParser) -> None:
    t.add_argument("--preset", choices=list(_PRESETS), default=None,
                   help="a recipe: " + "; ".join(f"{name}: " + " ".join(f"{_flag(k)} {v}" for k, v in flags.items())
                                                  for name, flags in _PRESETS.items()) +
                        ", --eval-every its --epochs (evaluation after the last epoch only). fast aims at <= 0.33%% "
                        "final MNIST test error in <= 20 s of training on an H100 (measured: 0.34%% mean over 3 seeds in 23 s). "
                        "Flags typed beside it override its values (--preset fast --epochs 40 --amp none "
                        "--compile none). For a new "
                        "run: refused with --resume, which keeps the run's own settings. Without it, every flag has "
                        "its own default")
    t.add_argument("--model", choices=list(MODELS), default=argparse.SUPPRESS,
                   help="; ".join(f"{n}: {spec.title}" for n, spec in MODELS.items()) + " (default: capsnet; segcaps on "
                        "segmentation data, capspix2pix on synthesis data)")
    _field_flag(t, "--dataset", TrainConfig, "dataset", "data set; mnist-sample ships with capsnet, offline; " +
                "; ".join(f"{n}: {t_.help}" for n, t_ in TASKS.items() if t_.help) + f"; {FOLDER_PREFIX}DIR: your own "
                "segmentation data, PNG images in DIR/images and masks of the same names in DIR/masks (README, "
                f"'Segmentation'); {PAIRS_PREFIX}DIR: your own synthesis pairs, label maps in DIR/labels and images of "
                f"the same names in DIR/images (README, 'Synthesis'); {CLASSES_PREFIX}DIR: your own images to classify, "
                "PNG files in a subfolder per class, DIR/CLASS/*.png (README, 'Your own images')", type=_dataset,
                metavar=_DATASETS)
    _field_flag(t, "--epochs", TrainConfig, "epochs", "epochs to train (with --resume: the new total, over which the "
                "linear schedule and EM's margin schedule stretch from there)", type=_positive_int)
    _field_flag(t, "--batch-size", TrainConfig, "batch_size", "examples per optimizer step; under torchrun the "
                "global batch, split evenly among the processes (a multiple of their number)", type=_positive_int)
    _field_flag(t, "--lr", TrainConfig, "lr", "Adam learning rate at step 0 (default 1e-3, the authors' code's; "
                "when not given, the EM models 3e-3, efficient-capsnet 5e-4, synthesis models 2e-4: each model's "
                "own, `capsnet models NAME`)", type=_positive_float, show_default=False)
    _field_flag(t, "--lr-decay", TrainConfig, "lr_decay", "learning rate factor per --lr-decay-steps (authors' code: "
                "0.96)", type=_positive_float)
    _field_flag(t, "--lr-decay-steps", TrainConfig, "lr_decay_steps", "steps over which the rate decays by --lr-decay "
                "(default 2000; multimnist 20000, the paper's 10x period, section 6.1)", type=_positive_int,
                show_default=False)
    _field_flag(t, "--lr-schedule", TrainConfig, "lr_schedule", "exponential: --lr times --lr-decay every "
                "--lr-decay-steps (authors' code); linear: up from --lr / --warmup-steps to --lr over --warmup-steps, "
                "then straight down to 0 at the run's last step (a --resume with a larger --epochs stretches the "
                "decay)", choices=LR_SCHEDULES)
    _field_flag(t, "--warmup-steps", TrainConfig, "warmup_steps", "optimizer steps of a linear warm-up from --lr / "
                "--warmup-steps up to the schedule's rate (0: start at --lr; default 0, 200 for --model baseline "
                "under the exponential schedule, whose first dense layer a full-rate start can kill); --lr-schedule "
                "linear: fewer than the run's steps",
                type=_nonneg_int, show_default=False)
    _field_flag(t, "--lr-min", TrainConfig, "lr_min", "a floor under the learning rate after the warm-up: the "
                "decay stops there (0: none; Efficient-CapsNet's code: 5e-5)", type=_nonneg_float)
    _field_flag(t, "--recon-weight", TrainConfig, "recon_weight", "scale of the reconstruction loss (paper: 0.0005; 0 "
                "turns it off)", type=_nonneg_float)
    shifted = ", ".join(n for n, t_ in TASKS.items() if not t_.places_digits) + f" and {CLASSES_PREFIX}DIR"
    _field_flag(t, "--shift", TrainConfig, "shift", "random shift augmentation in pixels (paper: 2; 0 turns it off); "
                f"--dataset {shifted} only: the others make their training images themselves", type=_nonneg_int)
    _field_flag(t, "--augment", TrainConfig, "augment", "shift: the paper's random shifts (--shift pixels); "
                "efficient-capsnet: Efficient-CapsNet's rotate, shift within the margins, squish and erase (default: "
                "shift; efficient-capsnet for --model efficient-capsnet on MNIST and Fashion-MNIST); the data sets "
                "of --shift only",
                choices=AUGMENTATIONS, show_default=False)
    _field_flag(t, "--val-size", TrainConfig, "val_size", "training examples held out to choose the best checkpoint "
                "(0: choose on test)", type=_nonneg_int)
    _field_flag(t, "--train-size", TrainConfig, "train_size", "train on a seeded subset of this many examples (0: all); "
                "for one --seed smaller subsets are nested in larger ones", type=_nonneg_int)
    _field_flag(t, "--test-size", TrainConfig, "test_size", "evaluate on the first this many test examples (0: all; "
                "multimnist: the first this many of the 10,000 fixed test pairs)", type=_nonneg_int)
    _field_flag(t, "--eval-every", TrainConfig, "eval_every", "evaluate every this many epochs, and after the last "
                "(many short epochs of a small --train-size); an epoch between evaluations still checkpoints when "
                "the last save is a minute old, so a long run resumes", type=_positive_int)
    _capsnet_arguments(t, all_flags=True)
    _baseline_arguments(t)
    t.add_argument("--model-option", type=_model_option, action="append", metavar="KEY=VALUE",
                   help="set any field of the model's config, e.g. caps1_types=16 or coordinate_addition=false "
                        "(VALUE as JSON); repeat for several; `capsnet models NAME` lists a model's fields")
    _field_flag(t, "--seed", TrainConfig, "seed", "seed of the initial weights, the --train-size subset, shuffles and "
                "shifts", type=_seed)
    _speed_arguments(t, "the training steps")
    _allocator_argument(t, "")
    t.add_argument("--tensorboard", default=None, metavar="DIR",
                   help="also write every evaluated epoch for TensorBoard into DIR: the metrics.jsonl numbers, "
                        "reconstructions and a pose sweep (needs pip install tensorboard; not for synthesis "
                        "models)")
    t.add_argument("--judge", default=None, metavar="CHECKPOINT",
                   help="synthesis models: a classifier trained on the real images (run directory, checkpoint or "
                        "pretrained:NAME) that reads the generated test images at every evaluation (default: the "
                        "shipped one for the data set, if any)")
    _field_flag(t, "--ema-decay", TrainConfig, "ema_decay", EMA_HELP, type=_unit_float)
    _field_flag(t, "--grad-clip", TrainConfig, "grad_clip", GRAD_CLIP_HELP, type=_nonneg_float, metavar="NORM")
    _field_flag(t, "--adam-beta1", TrainConfig, "adam_beta1", "Adam's first-moment decay (PyTorch's 0.9; SegCaps' "
                "reference code trains with 0.99; not for synthesis models, whose GAN loop keeps 0.5)",
                type=_unit_float, metavar="BETA1")
    t.add_argument("--out", default=None, help="run directory (default: runs/DATASET for the paper's CapsNet, "
                                               "runs/DATASET-MODEL for every other --model; -ROUTING-routing added "
                                               "for a --routing other than the model's)")
    t.add_argument("--resume", action="store_true", help="continue the run in --out from its last complete checkpoint")
    t.add_argument("--save-every", type=_nonneg_float, default=SAVE_EVERY_S / 60, metavar="MINUTES",
                   help="inside an epoch, rewrite last.safetensors when the last save is this many minutes old, so a "
                        "run stopped mid-epoch resumes from there, exactly (0: at epoch ends only; under torchrun "
                        "rank 0's clock decides, asked every 64 steps)")
    t.add_argument("--distributed", action="store_true",
                   help="insist on several processes: fail unless torchrun started this one (`torchrun "
                        "--nproc_per_node N -m capsnet train ...` trains with DistributedDataParallel with or without "
                        "this flag; rank 0 writes --out; not for synthesis models). Without torchrun, training runs "
                        "in one process")
    _common(t, trains=True)


def _models_arguments(m: argparse.ArgumentParser) -> None:
    m.add_argument("name", nargs="?", choices=list(MODELS), metavar="NAME",
                   help=f"a registered model ({', '.join(MODELS)}): list its config fields, defaults and notes")
    m.add_argument("--json", action="store_true", help="print JSON (capsnet.models.catalog) instead of tables")


def _routings_arguments(r: argparse.ArgumentParser) -> None:
    r.add_argument("name", nargs="?", choices=list_routings(), metavar="NAME",
                   help=f"a registered routing ({', '.join(list_routings())}): list its options, defaults and notes")
    r.add_argument("--json", action="store_true", help="print JSON (capsnet.routing.catalog) instead of tables")


_TRUNCATION_HELP = ("synthesis models with a noise vector (capspix2pix, capspix2pix-deep): draw it from the normal "
                    "truncated to [-T, T] (BigGAN's truncation trick): smaller T trades variety for fidelity, 0 gives "
                    "the noise's mean "
                    "(default: untruncated)")


# --which's default where a command shows test figures (eval, figures, viz; _final_for_test_chosen)
_TEST_CHOSEN = ("best; last, the final epoch's, for a finished run whose best was chosen on the test split, trained "
                "without --val-size")


def _checkpoint_choice(p: argparse.ArgumentParser, default: str = "best") -> None:
    """--which and --weights: the checkpoint of a run directory, and which of its weights make the model."""
    p.add_argument("--which", choices=("best", "last"), default=None,
                   help=f"which checkpoint of a run directory (default: {default}); not for a file or a shipped model")
    p.add_argument("--weights", choices=WEIGHTS, default="saved",
                   help="saved: the weights the checkpoint holds as the model (a run trained with --ema-decay: their "
                        "average); training: such a run's own training weights, which its last checkpoint keeps "
                        "(--which last): the model the run trained, not its average")


def _say_training_weights(args: argparse.Namespace) -> None:
    """What a command that loaded --weights training prints (its reports and files do not say it themselves);
    nothing for the saved weights."""
    if args.weights == "training":
        print("(the run's training weights, not the average it saved as its model)")


def _eval_arguments(e: argparse.ArgumentParser) -> None:
    e.add_argument("--checkpoint", required=True, help="run directory made by `capsnet train`, a .safetensors "
                                                       "checkpoint file, or pretrained:NAME (a model shipped with "
                                                       "capsnet, e.g. pretrained:capsnet-mnist-small)")
    _checkpoint_choice(e, _TEST_CHOSEN)
    e.add_argument("--dataset", type=_dataset, default=None, metavar=_DATASETS,
                   help="test set (default: the one it was trained on)")
    e.add_argument("--test-size", type=_nonneg_int, default=0,
                   help="evaluate on the first this many test examples (0: all; multimnist: the first this many "
                        "of the 10,000 fixed test pairs)")
    e.add_argument("--affnist", nargs="+", default=None, metavar="MAT_FILE",
                   help="also score a 40x40 (translated-mnist) model on real affNIST .mat files, e.g. test.mat from "
                        "https://www.cs.toronto.edu/~tijmen/affNIST/; each file's placement is measured and named "
                        "after the generated set it is nearest")
    e.add_argument("--batch-size", type=_positive_int, default=None,
                   help="examples per forward pass (default: 256; segmentation and synthesis models 64, whose passes "
                        "hold capsule grids or several generated images an example)")
    e.add_argument("--judge", default=None, metavar="CHECKPOINT",
                   help="synthesis models: the classifier that reads the generated images (default: the run's own, "
                        "else the shipped one for the data set, if any)")
    e.add_argument("--truncation", type=_nonneg_float, default=None, metavar="T", help=_TRUNCATION_HELP)
    e.add_argument("--json", default=None, help="where to write the results (default: eval-WHICH.json beside the "
                                                "checkpoint, with -DATASET added for another data set than the "
                                                "run's, -nSIZE for any --test-size, -judge-NAME for a --judge, "
                                                "-truncationT for a --truncation, and -training-weights for "
                                                "--weights training; for pretrained:NAME eval-NAME.json in the "
                                                "working folder)")
    _common(e)


def _generate_arguments(g: argparse.ArgumentParser) -> None:
    g.add_argument("--checkpoint", required=True, help="run directory or checkpoint of a synthesis model "
                                                       "(capspix2pix, capspix2pix-deep, pix2pix), or a shipped one "
                                                       "(pretrained:capspix2pix-mnist, pretrained:capspix2pix-fashion)")
    _checkpoint_choice(g)
    g.add_argument("--labels", required=True, metavar="DIR",
                   help="folder of label maps (PNG, the model's size and channels), e.g. skeletons or silhouettes")
    g.add_argument("--out", required=True, metavar="DIR", help="folder for the images: NAME_seedS.png per label map "
                                                                "and seed")
    g.add_argument("--seeds", type=_seed, nargs="+", default=[0],
                   help="noise seeds: one image per label map and seed (the same map and seed give the same image, "
                        "whatever else the folder holds)")
    g.add_argument("--truncation", type=_nonneg_float, default=None, metavar="T", help=_TRUNCATION_HELP)
    g.add_argument("--device", default="cpu", type=_device, help="auto (CUDA when present, else CPU), cpu, cuda or cuda:N")
    g.add_argument("--no-progress", action="store_true", help="no progress bars")


def _open_unit_float(text: str) -> float:
    """An argparse type: a number strictly between 0 and 1."""
    value = _nonneg_float(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must lie strictly between 0 and 1 (e.g. 0.5), got {text}")
    return value


def _predict_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True, help="run directory or checkpoint of a classifier or a segmentation "
                                                       "model, or a shipped one (pretrained:NAME)")
    _checkpoint_choice(p)
    p.add_argument("--images", required=True, metavar="DIR",
                   help="folder of PNG images: a classifier's input size and channels (with --fit, or for a "
                        "classifier trained on a folder capsnet prepare made: any image Pillow opens, any size; "
                        "subfolders are passed over); a segmentation model's channels, any size whose sides are "
                        "multiples of its stride (SegCaps: 8)")
    p.add_argument("--out", required=True, metavar="DIR",
                   help=f"folder for the results: a classifier's {PREDICTIONS_FILE} (each file's class and every "
                        f"class's score); a segmentation model's NAME.png masks (0/255)")
    p.add_argument("--threshold", type=_open_unit_float, default=None,
                   help="segmentation: the mask is where the foreground probability exceeds this (default: 0.5)")
    p.add_argument("--probabilities", action="store_true",
                   help="segmentation: also write NAME_probability.png, the probabilities x 255")
    p.add_argument("--mnist-style", action="store_true",
                   help="classifiers trained on MNIST's 28x28 digits: make each image, of any size, as MNIST was made "
                        "(a photo or scan of one digit: dark ink on light paper inverted, its box scaled to 20x20, "
                        "centred by its centre of mass), as the viewer does with uploads")
    from .data.prepare import FITS

    p.add_argument("--fit", choices=FITS, default=None,
                   help="classifiers: read every image Pillow opens (JPEG, PNG, WebP, ...), of any size, and fit it to "
                        "the model's input as capsnet prepare does (crop: the shorter side to the size, the centre "
                        "kept; pad: the longer side, centred on black); by default none, but for a classifier "
                        "trained on a folder capsnet prepare made: the fit it made it with (a note says where it "
                        "changed an image)")
    p.add_argument("--batch-size", type=_positive_int, default=64,
                   help="images per forward pass (segmentation: at the model's training size; larger images go "
                        "fewer at a time)")
    p.add_argument("--device", default="cpu", type=_device, help="auto (CUDA when present, else CPU), cpu, cuda or cuda:N")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def _prepare_arguments(p: argparse.ArgumentParser) -> None:
    from .data.prepare import FITS, MODES

    p.add_argument("--images", required=True, metavar="DIR",
                   help="your photos: a subfolder of images per class (DIR/CLASS/*, any size, any format Pillow reads: "
                        "JPEG, PNG, BMP, WebP, ...), and DIR/test/CLASS/* if you hold test images out yourself")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="the folder to write (new or empty): OUT/CLASS/NAME.png, what --dataset classes:OUT reads")
    p.add_argument("--size", required=True, type=_number(int, minimum=1, maximum=4096), metavar="PIXELS",
                   help="the side of the square PNGs written, 1..4096 (the classifiers here are made for 28 to 32; "
                        "the paper's CapsNet takes 17 at least)")
    p.add_argument("--mode", choices=list(MODES), default="rgb", help="grey (1 channel) or rgb (3 channels)")
    p.add_argument("--fit", choices=FITS, default="crop",
                   help="crop: the shorter side scaled to the size, the centre kept; pad: the longer side scaled to "
                        "the size, centred on black")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _cmd_prepare(args: argparse.Namespace) -> int:
    from .data.prepare import passed_over, prepare_class_folders

    done = prepare_class_folders(args.images, args.out, args.size, mode=args.mode, fit=args.fit,
                                 progress=not args.no_progress)
    if done.skipped:
        print(passed_over(done.skipped))
    wrote = (f"wrote {' and '.join(f'{n:,} {split}' for split, n in done.counts.items())} images of {args.size}x"
             f"{args.size} ({args.mode}) in {len(done.classes)} classes to {done.out}")
    smallest = _smallest_capsnet_side()
    if args.size < smallest:  # the command named would be refused: "input 12x12 is too small for conv1 9x9 ..."
        print(f"{wrote}; but capsnet train's CapsNet takes images of {smallest}x{smallest} at least (conv1 9x9, "
              f"then primary capsules 9x9 at stride 2): prepare them again with --size {smallest} or more")
        return 0
    print(f"{wrote}; train on them with: capsnet train --dataset {shlex.quote('classes:' + str(done.out))}")
    return 0


def _smallest_capsnet_side() -> int:
    """The smallest square input the paper's CapsNet (CapsNetConfig's defaults: conv1 9x9, primary capsules 9x9 at
    stride 2) takes."""
    from .models.capsnet import CapsNetConfig

    for side in range(1, 4097):
        try:
            CapsNetConfig(input_height=side, input_width=side)
        except ValueError:  # "input 12x12 is too small for conv1 9x9 and primary capsules 9x9"
            continue
        return side
    raise AssertionError("the default CapsNetConfig takes no input up to 4096x4096")


def _export_arguments(x: argparse.ArgumentParser) -> None:
    x.add_argument("--checkpoint", required=True, help="run directory made by `capsnet train`, a .safetensors "
                                                       "checkpoint file, or pretrained:NAME (a model shipped with "
                                                       "capsnet)")
    _checkpoint_choice(x)
    x.add_argument("--format", choices=list(FORMATS), default="onnx",
                   help="onnx: an ONNX graph for onnxruntime and other runtimes; torch-export: torch.export's "
                        "program (.pt2), loaded with torch.export.load")
    x.add_argument("--out", default=None, help="file to write, ending .onnx or .pt2 as --format (default: the "
                                               "checkpoint's name with .onnx or .pt2, "
                                               "beside it, last-training-weights.onnx for --weights training; for "
                                               "pretrained:NAME, NAME.onnx or NAME.pt2 in the working folder)")
    x.add_argument("--opset", type=_number(int, minimum=MIN_OPSET), default=None,
                   help=f"ONNX opset, {MIN_OPSET} or newer (default: the exporter's)")
    x.add_argument("--any-size", action="store_true",
                   help="a segmentation model's graph takes images of any height and width that are multiples of "
                        "its stride (8 for SegCaps, 16 for the default U-Net), two of them a side at least, not only "
                        "the run's own size; tracing takes several times as long")


def _bench_arguments(b: argparse.ArgumentParser) -> None:
    b.add_argument("--batch-size", type=_positive_int, nargs="+", default=[128], help="images per step; several: one "
                                                                                      "row set each")
    b.add_argument("--routing-iterations", type=_positive_int, nargs="+", default=[3], help="routing rounds; several: "
                                                                                            "one row set each")
    b.add_argument("--dtype", choices=DTYPES, nargs="+", default=["fp32"],
                   help="fp32, or bf16 or fp16 autocast (weights stay fp32; fp16 without --amp fp16's gradient "
                        "scaler); several: one row set each")
    b.add_argument("--repeats", type=_positive_int, default=5, help="timings per measurement, each of "
                                                                  "--steps-per-timing steps (median reported)")
    b.add_argument("--steps-per-timing", type=_positive_int, default=None,
                   help="steps run back to back in each timing, their mean the step time (default: 1 on a CPU; 10 on "
                        "CUDA, where the host queues a step while the GPU runs the last, as in training: throughput, "
                        "not one step's latency)")
    b.add_argument("--device", default="auto", type=_device, help="auto (CPU, plus CUDA when present), cpu or cuda")
    b.add_argument("--baseline", default=None, help="file of the tutorial-style baseline (default: "
                                                    "benchmarks/tutorial_baseline.py of the source checkout or the "
                                                    "working folder, left out with a note when neither has it; '' "
                                                    "to skip)")
    b.add_argument("--compile", nargs="?", const="default", default=None, type=_compile_mode, metavar="MODE",
                   help="compile capsnet's model as capsnet train --compile does (the baseline and the floor stay "
                        f"eager): {', '.join(COMPILE_MODES)}, or none (as without the flag); the flag alone: default")
    b.add_argument("--seed", type=_seed, default=0, help="seed of the weights and inputs")
    b.add_argument("--json", default=None, help="also write the environment and every row to this JSON file")
    _allocator_argument(b, ". Applies to every implementation in the run")


def _figures_arguments(f: argparse.ArgumentParser) -> None:
    f.add_argument("--checkpoint", required=True, nargs="+", metavar="RUN_DIR",
                   help="run directory, checkpoint file or pretrained:NAME (figures to figures-NAME in the working "
                        "folder); the model figures use the first, the training curves overlay all")
    _checkpoint_choice(f, _TEST_CHOSEN)
    f.add_argument("--out", default=None, help="folder for the figures (default: FIRST_RUN_DIR/figures, "
                                               "FIRST_RUN_DIR/figures-training-weights for --weights training; "
                                               "figures-NAME in the working folder for pretrained:NAME); --which and "
                                               "--weights pick the first run's model, the others add their curves")
    f.add_argument("--dataset", type=_dataset, default=None, metavar=_DATASETS,
                   help="test set the inputs come from (default: the run's; for a shipped model trained on MNIST the "
                        "same task on the shipped digits, offline: mnist-sample, mnist-sample-segmentation or "
                        "mnist-sample-skeleton)")
    f.add_argument("--indices", type=_nonneg_int, nargs="+", default=None,
                   help="test-set indices of the inputs (default: the first test image of each class; MultiMNIST: "
                        "the first 8 pairs of the fixed test set; segmentation: the first 8 test images)")
    f.add_argument("--dims", type=_nonneg_int, nargs="+", default=None, help="pose dimensions to sweep (default: all)")
    f.add_argument("--delta-range", type=_positive_float, default=0.25, help="sweep each dimension from -R to +R")
    f.add_argument("--delta-step", type=_positive_float, default=0.05, help="step of the sweep")
    f.add_argument("--misclassified", type=_misclassified, default=MISCLASSIFIED,
                   help="misclassified test inputs to show, found by classifying the whole test set (segmentation: "
                        "this many lowest-Dice images of the first 1,000 test images) (0: skip; at most 100, one row "
                        "of panels)")
    f.add_argument("--format", choices=("png", "svg", "pdf"), default="png", help="file format of the figures")
    f.add_argument("--dpi", type=_dpi, default=100, help="resolution of PNG figures (10 to 1200)")
    _common(f)


# what each experiment does (`capsnet experiment NAME --help` shows its own paragraph and flags)
_EXPERIMENT_ABOUT = {
    "multimnist": "CapsNet against the CNN baseline: top-2 exact error on 36x36 overlapping pairs (section 6).",
    "affine": "CapsNet against the CNN baseline: train on translated MNIST (40x40), accuracy on translated and affine "
              "test digits, each placed within the training range (+-6 px) and anywhere in the frame (section 5.2).",
    "less-data": "CapsNet against the CNN baseline: MNIST test error from nested training subsets, every run with "
                 "the same --steps.",
    "routing": "One model per routing algorithm (dynamic, EM, self-attention, inverted dot-product) on MNIST and "
               "Fashion-MNIST over --seeds, with each paper's learning rate and augmentation: error, weights, "
               "images/s, peak memory. --models capsnet capsnet:em capsnet:self-attention: one network, the "
               "routing swapped.",
    "segmentation": "SegCaps against the U-Net on mnist-segmentation (LaLonde and Bagci 2018): Dice and IoU on the "
                    "test and out-of-distribution canvases, weights, images/s, peak memory, beside an Otsu "
                    "threshold.",
    "synthesis": "CapsPix2pix against pix2pix on mnist-skeleton and fashion-silhouette (Bass et al. 2019): L1, SSIM, "
                 "shape IoU, noise spread, a frozen classifier's accuracy on the generated images, weights, speeds, "
                 "and classifiers trained on the generated images tested on real ones.",
}
_EXPERIMENT_RUNS = ("Each run is a `capsnet train` run directory under --out (finished runs are read back, "
                    "interrupted ones resume); results.md and results.json go there too{}.")
# flags (their dests) that only some experiments take; the rest apply to every one
_EXPERIMENT_ONLY = {"steps": ("less-data",), "sizes": ("less-data",), "seeds": ("routing",),
                    "datasets": ("routing", "segmentation", "synthesis"), "probe_epochs": ("synthesis",),
                    "train_size": tuple(n for n in EXPERIMENTS if n != "less-data"),
                    "eval_every": tuple(n for n in EXPERIMENTS if n != "less-data"),
                    "grad_clip": tuple(n for n in EXPERIMENTS if n != "synthesis"),
                    "augment": ("less-data", "routing")}
# why an experiment left out of a flag's list above does without it, by (experiment, field)
_EXPERIMENT_WITHOUT = {("less-data", "train_size"): "--sizes sets its training sizes",
                       ("less-data", "eval_every"): "it evaluates about 10 times a run",
                       ("synthesis", "grad_clip"): "its GAN steps are not clipped",
                       **{(n, "augment"): "its task makes its training images itself"
                          for n in ("multimnist", "affine", "segmentation", "synthesis")}}


# NAME:ROUTING models by task kind (experiments.model_entry): the examples, and what the routing replaces
_ROUTED_MODELS = {"classification": ("capsnet:em, capsnet:self-attention", "the paper's CapsNet's digit capsules"),
                  "segmentation": ("segcaps:self-attention", "every capsule layer of SegCaps"),
                  "synthesis": ("capspix2pix:self-attention", "every capsule layer of the generator")}


class _ExperimentHelp(argparse.Action):
    """--help: after an experiment's name (`capsnet experiment routing --help`), that experiment's paragraph and
    only the flags it takes; else every experiment's."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        name = getattr(namespace, "name", None)
        if name in _EXPERIMENT_ABOUT:
            more = " (and less_data.png, the plot)" if name == "less-data" else ""
            parser.description = (f"`capsnet experiment {name}`: {_EXPERIMENT_ABOUT[name]} "
                                  f"{_EXPERIMENT_RUNS.format(more)} "
                                  f"(`capsnet experiment --help` describes every experiment.)")
            kind = task(EXPERIMENTS[name][0]).kind
            fitting = [m for m, spec in MODELS.items() if spec.kind == kind]
            for action in parser._actions:
                if name not in _EXPERIMENT_ONLY.get(action.dest, (name,)):
                    action.help = argparse.SUPPRESS
                elif action.dest in _MODEL_FIELDS and not any(action.dest in _fields(m) for m in fitting):
                    action.help = argparse.SUPPRESS  # a field no model this experiment can train has
                elif action.dest == "models":
                    routed = _ROUTED_MODELS.get(kind)
                    action.help = (f"models to train (default: {' '.join(planned_models(name))}): "
                                   f"any of {', '.join(fitting)}" +
                                   (f", or {routed[0]} ({routed[1]} routed by another algorithm)" if routed else ""))
            parser.usage = None
        parser.print_help()
        parser.exit()


def _experiment_model(text: str) -> str:
    """An experiment's model: a registered name or NAME:ROUTING (experiments.model_entry), checked."""
    from .experiments import model_entry

    try:
        model_entry(text)
    except ValueError as e:  # a shipped model's name: what it is ("unknown model 'pretrained'" before)
        raise argparse.ArgumentTypeError(str(e) + _shipped_model_hint(text, "experiment")) from None
    return text


def _experiment_arguments(x: argparse.ArgumentParser) -> None:
    x.add_argument("-h", "--help", action=_ExperimentHelp, help="show this help message and exit (after an "
                   "experiment's name: that experiment's alone)")
    x.add_argument("name", choices=list(EXPERIMENTS), help="which experiment")
    x.add_argument("--out", default=None, help="folder for the runs and the results (default: runs/experiment-NAME)")
    x.add_argument("--models", nargs="+", type=_experiment_model, default=None, metavar="MODEL",
                   help="models to train: registered names, or NAME:ROUTING for a model routed by another algorithm "
                        "(" + "; ".join(f"{examples}: {what}" for examples, what in _ROUTED_MODELS.values()) + ") "
                        "(default: " + "; ".join([" ".join(COMPARED)] + [f"{n}: {' '.join(m)}" for n, m in DEFAULT_MODELS.items()])
                        + ")")
    routing_sets = " ".join(n for n in TASKS if task(n).kind == "classification" and input_shape(n) == (1, 28, 28))
    x.add_argument("--datasets", nargs="+", type=_dataset, default=argparse.SUPPRESS, metavar="DATASET",
                   help=f"routing: the 28x28 data sets to compare on ({routing_sets}, or your own {CLASSES_PREFIX}DIR "
                        f"of 28x28 grey images; default: mnist fashion-mnist); "
                        f"segmentation: mnist-segmentation (the default), mnist-sample-segmentation or your own "
                        f"{FOLDER_PREFIX}DIR; synthesis: the pairs to train on (default: mnist-skeleton "
                        f"fashion-silhouette; or your own {PAIRS_PREFIX}DIR)")
    x.add_argument("--model-option", type=_model_option, action="append", metavar="KEY=VALUE",
                   help="set a field of the config of every model of the experiment that has it, e.g. "
                        "l1_weight=1000 or upsampling=resize (VALUE as JSON); repeat for several; `capsnet models "
                        "NAME` lists a model's fields")
    x.add_argument("--probe-epochs", type=_nonneg_int, default=argparse.SUPPRESS,
                   help="synthesis: epochs of each train-on-synthetic classifier (0: no probes) (default: 3)")
    _field_flag(x, "--ema-decay", TrainConfig, "ema_decay", EMA_HELP, type=_unit_float)
    _field_flag(x, "--grad-clip", TrainConfig, "grad_clip", GRAD_CLIP_HELP, type=_nonneg_float, metavar="NORM")
    x.add_argument("--seeds", type=_nonneg_int, nargs="+", default=argparse.SUPPRESS,
                   help="routing: one run per seed, reported as mean and spread (default: --seed)")
    _field_flag(x, "--epochs", TrainConfig, "epochs", "epochs per run (less-data: unless --steps is given)",
                type=_positive_int)
    x.add_argument("--steps", type=_nonneg_int, default=argparse.SUPPRESS,
                   help="less-data: optimizer steps per run, the same for every size and model, rounded up to "
                        "whole epochs (epochs = ceil(steps / ceil(size / batch)); 0: --epochs for every size) "
                        "(default: 0)")
    x.add_argument("--sizes", type=_positive_int, nargs="+", default=argparse.SUPPRESS,
                   help=f"less-data: training-set sizes (nested subsets for one --seed) (default: "
                        f"{' '.join(map(str, LESS_DATA_SIZES))})")
    _field_flag(x, "--train-size", TrainConfig, "train_size", "all but less-data: train on a seeded subset of this "
                "many training examples (0: all)", type=_nonneg_int)
    _field_flag(x, "--test-size", TrainConfig, "test_size", "first this many test examples: digits, the "
                "segmentation's canvases, the synthesis's label maps (0: all 10,000); multimnist: the first this many "
                "of the 10,000 fixed test pairs", type=_nonneg_int)
    _field_flag(x, "--batch-size", TrainConfig, "batch_size", "examples per optimizer step", type=_positive_int)
    _field_flag(x, "--lr", TrainConfig, "lr", "Adam learning rate at step 0 (default 1e-3, the authors' code's); "
                "when not given, each model's own (EM 3e-3, Efficient-CapsNet 5e-4, synthesis models 2e-4)",
                type=_positive_float, show_default=False)
    _field_flag(x, "--lr-decay-steps", TrainConfig, "lr_decay_steps", "the learning rate is multiplied by 0.96 every "
                "this many steps (default 2000; multimnist 20000, the paper's 10x period, section 6.1; 2000 "
                "reproduces the multimnist runs made before 2026-11-30)", type=_positive_int, show_default=False)
    _field_flag(x, "--augment", TrainConfig, "augment", "the training images' augmentation for every model: shift "
                "(the paper's random shifts) or efficient-capsnet (Efficient-CapsNet's recipe); less-data and routing "
                "only (default: each model's own: efficient-capsnet for Efficient-CapsNet, shift for the rest)",
                choices=AUGMENTATIONS, show_default=False)
    _field_flag(x, "--warmup-steps", TrainConfig, "warmup_steps", "a linear warm-up of the learning rate over this "
                "many steps, for every model (default: each model's own: 200 for the CNN baseline, 0 for the rest; "
                "0 reproduces the baseline runs made before 2026-11-25)", type=_nonneg_int, show_default=False)
    _field_flag(x, "--eval-every", TrainConfig, "eval_every", "evaluate every this many epochs, and after the last "
                "(not less-data, which evaluates about ten times a run)", type=_positive_int)
    _capsnet_arguments(x, all_flags=False)
    _baseline_arguments(x)
    _field_flag(x, "--seed", TrainConfig, "seed", "seed of the weights, subsets, shuffles and placements (test sets "
                "have their own fixed seed)", type=_seed)
    _speed_arguments(x, "every run's training steps", preset=False)
    _allocator_argument(x, ", for every run")
    x.add_argument("--jobs", type=_positive_int, default=1,
                   help="train this many runs at once, each in a process of its own with 1/N of the CPU threads and "
                        "no progress bar (the same results as one at a time with that many threads: tested); then "
                        "every run is read back and tabulated")
    _common(x)


def _viz_arguments(v: argparse.ArgumentParser) -> None:
    v.add_argument("--checkpoint", default=None, metavar="RUN_DIR",
                   help="run directory or .safetensors file of a capsule model, a segmentation model (segcaps, "
                        "segcaps-r1, unet) or a synthesis model (capspix2pix, capspix2pix-deep, pix2pix), or pretrained:NAME "
                        "(default: the shipped pretrained:capsnet-mnist-small on the shipped mnist-sample test digits)")
    v.add_argument("--untrained", action="store_true",
                   help="open an untrained (random) paper CapsNet instead of the shipped model")
    _checkpoint_choice(v, _TEST_CHOSEN)
    v.add_argument("--dataset", type=_dataset, default=None, metavar=_DATASETS,
                   help="test images to pick from (default: the checkpoint's data set; mnist-sample without one "
                        "and for a shipped MNIST classifier, mnist-sample-segmentation or mnist-sample-skeleton for a "
                        "shipped MNIST segmentation or synthesis model; "
                        "multimnist: the fixed test pairs; translated-mnist: test digits on 40x40; "
                        "mnist-segmentation: the fixed test canvases with their masks; mnist-skeleton, "
                        "fashion-silhouette, pairs:DIR: the test label maps with their real images)")
    v.add_argument("--test-size", type=_nonneg_int, default=None,
                   help="keep the first this many test examples (0: all; default: all, but the first 1,000 of "
                        "mnist-segmentation's 10,000 canvases and of the synthesis sets' 10,000 pairs, which are "
                        "made when the viewer starts)")
    v.add_argument("--data-dir", default=None, help=_DATA_DIR_HELP)
    v.add_argument("--host", default="127.0.0.1",
                   help="address to listen on; the default serves this machine only (0.0.0.0: every network)")
    v.add_argument("--port", type=int, default=5000, help="port to listen on (0: any free port)")
    v.add_argument("--allow-host", action="append", default=[], metavar="NAME", type=_allowed_host,
                   help="a host name others open the viewer by (repeatable); it answers for localhost, IP addresses "
                        "and this machine's name, and refuses other names (a web page's, pointed at this machine)")
    v.add_argument("--device", default="cpu", type=_device,
                   help="device for the model: cpu, cuda, cuda:N or auto (CUDA when present, else CPU)")
    v.add_argument("--quiet", action="store_true", help="do not log each request")


# ------------------------------------------------------------------------------------------ handlers


def _loopback(host: str) -> bool:
    """Whether a bound address serves this machine only (127.0.0.0/8, ::1)."""
    import ipaddress

    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name: localhost is loopback, any other may not be
        return host == "localhost"


def _point_to_an_older_default(args: argparse.Namespace, older: Path, out: Path, chosen: str,
                               routing: str | None) -> None:
    """A --resume without --out of a model (routed by ``routing``) whose run an older capsnet put in runs/DATASET
    (every classifier's default before 2026-12-03, the CNN baseline's apart): refused naming that folder, not with
    "nothing to resume" in the new default alone."""
    from .checkpoint import header_metadata

    last = older / "last.safetensors"
    if older == out or not last.is_file():
        return
    try:  # the header alone (load_checkpoint read every tensor for two names)
        saved = header_metadata(last)
        name, config = saved.get("model", "capsnet"), json.loads(saved["model_config"])
    except (AttributeError, KeyError, ValueError, RecursionError):  # not a run this can say anything of: the usual
        return  # refusal follows
    if name == chosen and isinstance(config, dict) and config.get("routing") == routing:
        args.parser.error(f"--resume without --out looks in {out}, which holds no run; {older} holds a --model "
                          f"{chosen} run, where capsnet trained every model by default before 2026-12-03: resume it "
                          f"with --out {older} --resume")


def _train_config(typed: dict[str, Any], model: str) -> TrainConfig:
    """The training settings typed, over the task's own defaults (``Task.train_defaults``: MultiMNIST's decay
    period), over ``model``'s (``ModelSpec.train_defaults``: the synthesis models' GAN rate, the baseline's warm-up),
    over TrainConfig's."""
    return TrainConfig(**(train_defaults(model, typed.get("lr_schedule", TrainConfig.lr_schedule),
                                         typed.get("dataset", TrainConfig.dataset)) | typed))


def _apply_preset(args: argparse.Namespace, flags: dict[str, Any]) -> list[str]:
    """Set each of a preset's ``flags`` that was not typed (absent, or None), and --eval-every to the run's epochs;
    the fields it set. Its warm-up belongs to its linear schedule: left out when another --lr-schedule is typed."""
    other_schedule = getattr(args, "lr_schedule", None) not in (None, flags.get("lr_schedule"))
    set_here = [f for f in flags if getattr(args, f, None) is None and not (other_schedule and f == "warmup_steps")]
    for field in set_here:
        setattr(args, field, flags[field])
    if not hasattr(args, "eval_every"):
        args.eval_every = getattr(args, "epochs", TrainConfig.epochs)
        set_here.append("eval_every")
    return set_here


def _check_schedule_flags(args: argparse.Namespace, typed: dict[str, Any], preset_fields: list[str],
                          resumed: tuple[Path, str] | None = None) -> None:
    """Refuse flags of the learning-rate schedule that the run's schedule would ignore: a new run's, or with
    ``resumed`` (the run's folder and saved schedule) the resumed run's."""
    schedule = typed.get("lr_schedule", TrainConfig.lr_schedule if resumed is None else resumed[1])
    unused = [_flag(f) for f in (("lr_decay", "lr_decay_steps") if schedule == "linear" else ()) if f in typed]
    if unused:
        how = f" (set by --preset {args.preset})" if "lr_schedule" in preset_fields else \
            f" (the schedule of the run in {resumed[0]})" if resumed is not None and "lr_schedule" not in typed else ""
        args.parser.error(f"{_listed(unused, 'does', 'do')} not apply to --lr-schedule {schedule}{how}")


def _same_value(a: Any, b: Any) -> bool:
    """Whether a flag's value and a --model-option's JSON value are one setting ([64, 128] is (64, 128))."""
    return (list(a) if isinstance(a, tuple) else a) == (list(b) if isinstance(b, tuple) else b)


def _one_pass(model_cfg: Any) -> bool:
    """Whether a model's config names a routing that makes one pass (self-attention), so routing_iterations is
    nothing to it."""
    routing = getattr(model_cfg, "routing", None)
    return isinstance(routing, str) and bool(unused_rounds(model_cfg, routing))


def _check_rounds_flags(args: argparse.Namespace, chosen: str, model_changes: dict[str, Any],
                        options: dict[str, Any]) -> None:
    """Refuse rounds typed for a routing that makes one pass (self-attention), naming the flags, before the model's
    config refuses them by its field names."""
    routing = model_changes.get("routing", getattr(model_spec(chosen).config, "routing", None))
    unused = unused_rounds(model_spec(chosen).config, routing) if isinstance(routing, str) else {}
    for rounds_field in unused:  # SegCaps' primary layer's too
        if rounds_field in model_changes:
            rounds = _as_typed(rounds_field, model_changes[rounds_field], rounds_field in options)
            by = _as_typed("routing", routing, "routing" in options)
            args.parser.error(f"{rounds} sets the rounds of a routing that iterates, and {by} makes one pass: leave "
                              f"the rounds out")
    if isinstance(routing, str):  # a dynamic-routing switch typed for another routing: said by the flag typed
        from .models.capsnet import DYNAMIC_SWITCHES
        from .routing import list_routings, routing_takes

        for name, option in DYNAMIC_SWITCHES.items():
            if model_changes.get(name) is True and routing in list_routings() and not routing_takes(routing, option):
                switch = _as_typed(name, True, name in options)
                by = _as_typed("routing", routing, "routing" in options)
                args.parser.error(f"{switch} is an option of dynamic routing, which {by} is not: leave {switch} out")
    rounds = model_changes.get("routing_iterations", getattr(model_spec(chosen).config, "routing_iterations", None))
    if model_changes.get("detach_agreement") is True and rounds == 1:  # trained as without it, gradients identical
        switch = _as_typed("detach_agreement", True, "detach_agreement" in options)
        by = _as_typed("routing_iterations", 1, "routing_iterations" in options) \
            if "routing_iterations" in model_changes else f"--model {chosen} (one round by default)"
        args.parser.error(f"{switch} stops the gradient through the routing rounds before the last, and {by} routes "
                          f"one round, the last: leave {switch} out, or route more rounds")


def _check_unused_flags(args: argparse.Namespace, model_cfg: Any, train_cfg: Any, typed: list[str],
                        model_changes: dict[str, Any], options: dict[str, Any]) -> None:
    """Refuse training flags (``typed``: by the user, not a preset) that the new run's model or other flags ignore."""
    name = model_name(model_cfg)
    if "recon_weight" in typed and train_cfg.recon_weight > 0:
        switch = next((f for f in ("decoder", "reconstruction") if hasattr(model_cfg, f)), None)
        if switch is None:
            args.parser.error(f"--recon-weight weighs a reconstruction loss, and --model {name} has none; leave "
                              f"--recon-weight out")
        if not getattr(model_cfg, switch):
            off = _as_typed(switch, model_changes[switch], switch in options) if switch in model_changes else \
                f"--model {name} (its {switch} is off by default)"
            args.parser.error(f"--recon-weight {train_cfg.recon_weight:g} weighs the reconstruction loss, and {off} "
                              f"leaves the model without a reconstruction; leave out one of them")
    if "test_size" in typed and train_cfg.test_size and train_cfg.val_size:  # recorded and never read: the test split
        # is not loaded (0, the default, asks for nothing: it was refused as well)
        args.parser.error(f"--test-size keeps the first test examples a run evaluates on, and --val-size "
                          f"{train_cfg.val_size} makes the run evaluate on held-out training examples instead (it "
                          f"never reads the test split); leave --test-size out (`capsnet eval --test-size N` scores "
                          f"the run on the test split)")
    if "shift" in typed and train_cfg.augment != "shift":
        args.parser.error(f"--shift sets how far --augment shift moves the images, and --augment {train_cfg.augment} "
                          f"makes its own shifts (within each digit's margins); leave --shift out, or pass "
                          f"--augment shift")


def _resume_point(path: Path) -> Any:
    """The run's last.safetensors read for --resume; one that cannot be read is said as a run that cannot resume
    (its refusal's advice, "use best.safetensors (--which best)", is for the commands that score a run)."""
    from .checkpoint import CheckpointError, load_checkpoint

    try:
        return load_checkpoint(path)
    except CheckpointError as e:
        raise CheckpointError(f"{e}; --resume continues from last.safetensors alone, so this run cannot resume: "
                              f"train it again in a new --out") from None


def _cmd_train(args: argparse.Namespace) -> int:
    from . import train
    from .distributed import launcher

    if args.preset is not None and args.resume:
        args.parser.error(f"--preset {args.preset} sets up a new run; --resume continues with the run's own settings: "
                          f"leave --preset out")
    preset_fields = [] if args.preset is None else _apply_preset(args, _PRESETS[args.preset])
    launch = launcher(required=args.distributed)  # None: one process, as always
    main_rank = launch is None or launch.is_main
    model = getattr(args, "model", None)
    dataset = getattr(args, "dataset", TrainConfig.dataset)
    last = None  # a resume's last.safetensors, read once: the flags typed again are checked against its run
    if args.resume and args.out and (Path(args.out) / "last.safetensors").exists():
        last = _resume_point(Path(args.out) / "last.safetensors")
        _refuse_moved_folder(args, args.out, last)  # before the folder is read for its shapes
        dataset = getattr(args, "dataset", last.train_config.get("dataset", dataset))
        model = model or last.model_name
    kind = task_kind(dataset)  # a user's folder is read after the model's kind is checked against it
    chosen = model or _DEFAULT_MODEL[kind]
    if not args.resume and model_spec(chosen).kind != kind:
        fitting = [n for n, spec in MODELS.items() if spec.kind == kind]
        by = {f: f" (set by --preset {args.preset})" if f in preset_fields else "" for f in ("model", "dataset")}
        args.parser.error(f"--model {chosen}{by['model']} is a {model_spec(chosen).kind} model and --dataset "
                          f"{dataset}{by['dataset']} a {kind} data set; use --model {_either(fitting)}"
                          + (f", or leave --preset {args.preset} out" if preset_fields else ""))
    typed = _typed(args, _MODEL_FIELDS)
    foreign = sorted(f for f in typed if f not in _fields(chosen))  # flags for fields the chosen model lacks
    if foreign:  # the first one's, and the others with the same models (of the chosen model's task where any)
        owners = _owners(foreign[0], kind)
        flags = sorted(_flag(f) for f in foreign if _owners(f, kind) == owners)
        why = "" if model else f", the default for --dataset {dataset}"
        it = "it" if len(flags) == 1 else "them"
        fix = (f"use {it} with --model {_either(owners)}" if MODELS[owners[0]].kind == kind else
               f"no {kind} model takes {it} (--model {_either(owners)} {'does' if len(owners) == 1 else 'do'})")
        args.parser.error(f"{_listed(flags, 'does', 'do')} not apply to --model {chosen}{why}; {fix}")
    options = dict(args.model_option or [])
    unknown = sorted(set(options) - _fields(chosen))
    if unknown:
        args.parser.error(f"--model-option {', '.join(unknown)}: not a field of {chosen}; its fields are "
                          f"{', '.join(sorted(_fields(chosen)))} (`capsnet models {chosen}` says what each does)")
    twice = [f for f in sorted(set(typed) & set(options)) if not _same_value(typed[f], options[f])]
    if twice:  # the option would win, silently
        f = twice[0]
        args.parser.error(f"{_as_typed(f, typed[f])} and {_as_typed(f, options[f], True)} both set {f}; keep one")
    model_changes, train_changes = typed | options, _typed(args, _TRAIN_FIELDS)
    if task(dataset).places_digits:  # its batches are made by the task; shift and augment never reach them
        for field in ("shift", "augment"):
            if field in train_changes:
                args.parser.error(f"--{field} does not apply to --dataset {dataset}, which makes its training images "
                                  f"itself")
    folder = user_folder(dataset)
    stem = dataset_stem(dataset)
    # a model of its own, and a routing of its own (runs/mnist-em-routing: as an experiment's folders add
    # -ROUTING-routing to the model's name)
    own_routing = default_routing(chosen)
    routing = model_changes.get("routing", own_routing)
    routed = f"-{routing}-routing" if routing != own_routing else ""
    out = Path(args.out or f"runs/{stem}" + ("" if chosen == "capsnet" else f"-{chosen}") + routed)
    if args.resume and not args.out and not (out / "last.safetensors").exists():
        _point_to_an_older_default(args, Path(f"runs/{stem}"), out, chosen, routing)
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out} is a file, where a folder was to be made; give a folder (--out)")
    check_out_dir(out, "run's checkpoints")  # a file above it, a read-only disk: before the data is read
    if args.tensorboard is not None and not args.tensorboard.strip():  # SummaryWriter's ./runs/DATE_HOST for ""
        args.parser.error("--tensorboard needs a folder for the logs, got an empty name; give one, or leave the "
                          "flag out")
    board = Path(args.tensorboard) if args.tensorboard else None
    if board is not None and any(p.exists() and not p.is_dir() for p in (board, *board.parents)):
        raise ValueError(f"--tensorboard {board}: a file stands where its folder was to be made; give a folder "
                         f"for the TensorBoard logs")
    resumed = None  # the state in the run's last.safetensors, read once here (fit reads the file again to train on)
    planned = None  # the epochs that run was training
    if args.resume and (out / "last.safetensors").exists():  # the run's saved settings hold; typed flags must agree
        from .checkpoint import saved_point

        last = last or _resume_point(out / "last.safetensors")  # --resume without --out: the default run folder's
        with train.resume_state_of(last):  # one holding no optimizer state (a best copied over it) refused before
            pass  # "resuming the run" is printed
        resumed, planned = last.state, last.train_config.get("epochs")
        _refuse_moved_folder(args, out, last)  # --resume without --out: read only now
        # a linear run's --lr-decay was refused as differing from the 0.96 it never used (its config.json's default)
        _check_schedule_flags(args, train_changes, preset_fields,
                              (out, last.train_config.get("lr_schedule", TrainConfig.lr_schedule)))
        try:
            model_cfg, train_cfg = train.resume_configs(last, model=model, model_changes=model_changes,
                                                        train_changes=train_changes)
        except train.ResumeError as e:
            given = model_changes | train_changes | ({"model": model} if model else {})
            typed = [_as_typed(f, given[f], f in options) for f in e.fields]
            if not e.saved and all(f in model_changes for f in e.fields):  # settings the run's model has not
                args.parser.error(f"{_listed(typed, 'does', 'do')} not apply to the run in {out}, a --model "
                                  f"{last.model_name} run: leave {'it' if len(typed) == 1 else 'them'} out")
            saved = ", ".join(_as_typed(f, e.saved[f], f in options) for f in e.fields if f in e.saved)
            args.parser.error(f"{_listed(typed, 'differs', 'differ')} from the run in {out}"
                              + (f", which trained with {saved}" if saved else "") + "; --resume continues with "
                              f"the run's own settings: leave {'it' if len(typed) == 1 else 'them'} out, or train "
                              f"the new settings in a new --out. {_RESUME_MAY_CHANGE}")
        del last  # its weights and optimizer state, not held while fit trains
    else:
        _check_schedule_flags(args, train_changes, preset_fields)
        _check_rounds_flags(args, chosen, model_changes, options)
        sized = train.input_fields(chosen, dataset)
        clash = {f: v for f, v in model_changes.items() if f in sized and v != sized[f]}
        if clash:  # the config got both (a TypeError's traceback); the same value is taken as it is
            f, v = next(iter(clash.items()))
            args.parser.error(f"--model-option {f}={v}: capsnet train sets {f} from --dataset {dataset} "
                              f"({sized[f]}); leave it out")
        try:
            # --routing X on a model whose own dynamic-routing switches X does not take (capsnet-cifar10's leaky
            # routing): they go, unless typed (then the config refuses them by name)
            off = unused_switches(model_spec(chosen).config, model_changes["routing"]) \
                if isinstance(model_changes.get("routing"), str) else {}
            model_cfg = model_spec(chosen).config(**(sized | off | model_changes))
        except ValueError as e:  # a user's images of a size the network cannot take: say whose size it is
            unfitting = train.unfitting_images(e, dataset, chosen, sized) if folder else None
            raise (unfitting or _opened_by_flag(e, model_changes, options)) from None
        try:
            train_cfg = _train_config(train_changes, chosen)
        except ValueError as e:
            raise _opened_by_flag(e, train_changes, {}) from None
        _check_unused_flags(args, model_cfg, train_cfg, [f for f in train_changes if f not in preset_fields],
                            model_changes, options)
    chosen, kind = model_name(model_cfg), model_spec(model_name(model_cfg)).kind  # a resume: the run's own
    synthesis = kind == "synthesis"
    if synthesis:
        if args.tensorboard:
            args.parser.error(f"--tensorboard does not apply to the GAN loop of --model {chosen}; train without it")
        if "adam_beta1" in train_changes:  # its two Adams keep pix2pix's (0.5, 0.999)
            args.parser.error(f"--adam-beta1 does not apply to the GAN loop of --model {chosen}, whose optimizers "
                              f"keep pix2pix's beta1 of 0.5; train without it")
        if args.distributed or launch is not None:  # torchrun with or without --distributed
            how = "--distributed does" if args.distributed else "several processes (torchrun) do"
            args.parser.error(f"{how} not apply to the GAN loop of --model {chosen}, which trains in one process; "
                              f"run `capsnet train` without torchrun")
    elif args.judge is not None:
        args.parser.error(f"--judge scores synthesis models; --model {chosen} is a {kind} model")
    require_compiler(args.compile, args.device)  # before the data: Inductor's own error came at the
    # first step
    _keep_memory(args.allocator)
    again = ["capsnet", "train", "--out", str(out), "--resume"]  # with the flags a checkpoint does not keep
    for flag, value in (("--data-dir", args.data_dir), ("--device", None if args.device == "auto" else args.device),
                        ("--compile", args.compile or None), ("--tensorboard", args.tensorboard),
                        ("--save-every", None if args.save_every == SAVE_EVERY_S / 60 else f"{args.save_every:g}"),
                        ("--allocator", None if args.allocator == "keep" else args.allocator)):
        again += [] if value is None else [flag, str(value)]
    if launch is not None:  # one machine: --standalone, a port of its own (older torch took 29500: two jobs clashed)
        again = ["torchrun", *(["--standalone"] if launch.world_size == launch.local_world_size else []),
                 "--nproc_per_node", str(launch.local_world_size), "-m", *again]
    args.resume_command, args.resume_checkpoint = f"`{shlex.join(again)}`", out / "last.safetensors"  # Ctrl-C's line
    if launch is not None:
        if launch.world_size > launch.local_world_size:
            args.resume_command += " (on every machine, with the run's --nnodes and rendezvous flags)"
        args.quiet_interrupt = not main_rank
        if launch.max_restarts > launch.restart and launch.agent_store and launch.one_machine:  # torchrun goes on
            args.restart_note = f"restart {launch.restart + 1} of at most {launch.max_restarts}"
    if resumed is not None:  # a run past the epochs asked for is refused before any line says it goes on
        train.check_epochs(resumed, train_cfg.epochs, out / "last.safetensors", planned)
        if launch is not None and not synthesis:  # as is a batch the processes cannot divide (fit's own check)
            train.check_batch_divides(train_cfg, launch, out, True)
    finished = resumed is not None and train.finished(resumed, train_cfg.epochs)
    if resumed is not None and synthesis and (not finished or args.judge is not None):  # as is a judge that cannot
        from .gan import load_run_judge, resumed_judge  # read the run's images, or none where config.json records it

        # (fit_gan's checks; a finished run's given judge is checked for the eval line below, which uses it)
        load_run_judge(resumed_judge(out, train_cfg.dataset, args.judge), given=args.judge, run_dir=out,
                       dataset=train_cfg.dataset)
    if main_rank and finished:
        # a finished run evaluates nothing more: a judge given was not loaded (its epochs keep the one that scored them)
        judged = (f"; --judge scores the epochs still to train: score this run with `capsnet eval --checkpoint "
                  f"{shlex.quote(str(out))} --judge {shlex.quote(str(args.judge))}`") if args.judge is not None else ""
        print(f"the run in {out} has finished its {_counted(train_cfg.epochs, 'epoch')}; pass a larger --epochs to "
              f"train on{judged}")
    # each evaluated epoch's line: the progress bars write it after its evaluation; without them it is printed here
    # (a log of a --no-progress run held the final epoch's alone); a finished run prints its last
    summarise = finished
    with RunLock(out) as lock:
        if main_rank and resumed is not None and not finished:
            # another trainer there: refused before a line says this one goes on, and the lock held from here to
            # the training (two resumes at once both printed "resuming", one refused after)
            lock.acquire()
            print(f"resuming the run in {out} from {saved_point(resumed)}", flush=True)
        with _preset_named(args, preset_fields, train_cfg), _sizes_by_flag(train_changes):
            return _fit_run(args, model_cfg, train_cfg, out, launch, main_rank, synthesis, summarise,
                            lock if lock.taken else None)


@contextlib.contextmanager
def _preset_named(args: argparse.Namespace, preset_fields: list[str], cfg: Any) -> Iterator[None]:
    """The schedule's refusal of a warm-up as long as the run, and torchrun's of a global batch its processes do not
    divide, said with the preset that set the warm-up or the batch (the user typed none: "lower --warmup-steps" or
    "use a multiple of 3" alone sent them looking for it; a bug hunt, 2026-12-04)."""
    try:
        yield
    except ValueError as e:  # DistributedError too
        said = {"warmup_steps": ("warmup_steps (", "--warmup-steps", cfg.warmup_steps),
                "batch_size": ("--batch-size ", "--batch-size", cfg.batch_size)}
        for field, (opening, flag, value) in said.items():
            if field in preset_fields and str(e).startswith(opening):
                raise type(e)(f"{e} (--preset {args.preset} set {flag} {value}; a value typed beside it wins)") \
                    from None
        raise


def _fit_run(args: argparse.Namespace, model_cfg: Any, train_cfg: Any, out: Path, launch: Any, main_rank: bool,
             synthesis: bool, summarise: bool, lock: RunLock | None = None) -> int:
    """``capsnet train``'s training, once its flags and folder are checked: the GAN loop or ``fit``."""
    from . import gan, train

    if synthesis:
        from .synthesis import judge_for

        judge = args.judge if args.resume else judge_for(train_cfg.dataset, args.judge)  # a resume: the run's own
        final = gan.fit_gan(model_cfg, train_cfg, out, device=args.device, data_root=args.data_dir, resume=args.resume,
                            progress=not args.no_progress, judge=judge, compile=args.compile or False,
                            save_every_s=args.save_every * 60,
                            on_epoch=(lambda r: print(gan.describe_gan_epoch(r), flush=True)) if args.no_progress
                            else None, lock=lock)
        if final and summarise:
            print(gan.describe_gan_epoch(final))
        print(f"run directory: {out}")
        return 0
    final = train.fit(model_cfg, train_cfg, out, device=args.device, data_root=args.data_dir, resume=args.resume,
                      progress=not args.no_progress, compile=args.compile or False, distributed=launch is not None,
                      tensorboard=args.tensorboard, save_every_s=args.save_every * 60,
                      on_epoch=(lambda r: print(train.describe_epoch(r, train_cfg.dataset), flush=True))
                      if args.no_progress else None, lock=lock)
    if not main_rank:  # rank 0 speaks for the run
        return 0
    if final and summarise:
        print(train.describe_epoch(final, train_cfg.dataset))
    print(f"run directory: {out}")
    return 0


def _dpi(text: str) -> int:
    """A PNG resolution: 10 to 1200 dots per inch (100,000 asked matplotlib for gigabytes and ended in MemoryError;
    1 to 5 met FreeType's smallest font size, a traceback)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer from 10 to 1200, got {text!r}") from None
    if not 10 <= value <= 1200:
        raise argparse.ArgumentTypeError(f"must be an integer from 10 to 1200 dots per inch (below 10 the labels' "
                                         f"fonts cannot be drawn; above 1200 no printed figure needs it), got {value}")
    return value


def _misclassified(text: str) -> int:
    """How many misclassified inputs to draw: 0 to 100 (one row of panels; 8,055 drew for minutes in 9.7 GB)."""
    value = _nonneg_int(text)
    if value > 100:
        raise argparse.ArgumentTypeError(f"must be at most 100 (one row of panels), got {value}")
    return value


def _output_file(path: str | None, flag: str) -> None:
    """A file the command writes at its end: refused before any work if it cannot be written there."""
    if path is None:
        return
    from .checkpoint import run_file, unwritable

    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{flag} {p} is a folder; give a file name, e.g. {p / 'results.json'}")
    if path.endswith(("/", os.sep)):  # a folder meant (Path drops the slash: the report was written as a file named so)
        raise ValueError(f"{flag} {path} names a folder (it ends in a slash); give a file name, e.g. "
                         f"{p / 'results.json'}")
    if p.parent.exists() and not p.parent.is_dir():
        raise ValueError(f"{flag} {p}: {p.parent} is a file, not a folder; write elsewhere")
    if not p.parent.is_dir():
        raise ValueError(f"{flag} {p}: the folder {p.parent} does not exist; create it or write elsewhere")
    if (lost := run_file(p)) is not None:
        raise ValueError(f"{flag} {p} is {lost}; writing there would lose it: give another file name, e.g. "
                         f"{p.with_name('results.json')}")
    if (why := unwritable(p.parent)) is not None:
        raise ValueError(f"{flag} {p}: cannot write in {p.parent} ({why}); give a file where you can write")


def _judge_tag(judge: str) -> str:
    """A judge as part of a report's name: a shipped one's NAME; a checkpoint file's run folder and stem
    (runs/a/best.safetensors: a-best, where its stem alone made every run's best judge "best"), a run folder's name,
    with six hex digits of its absolute path (two judges of one name in other folders wrote one report)."""
    import hashlib

    from . import pretrained

    if str(judge).startswith(pretrained.PREFIX):
        return str(judge)[len(pretrained.PREFIX):]
    p = Path(os.path.abspath(os.path.expanduser(judge)))
    name = (f"{p.parent.name}-{p.stem}" if p.stem in ("best", "last") else p.stem) if p.suffix == ".safetensors" \
        else p.name
    return f"{name}-{hashlib.sha1(str(p).encode()).hexdigest()[:6]}"


def _eval_report(ckpt: Any, args: argparse.Namespace) -> Path:
    """Where ``capsnet eval`` writes its report without --json: eval-best.json (eval-last.json) beside the checkpoint
    for its own data set's whole test split, with the data set and the size in the name otherwise
    (eval-best-fashion-mnist-n100.json), and a synthesis run's --judge and --truncation
    (eval-last-judge-capsnet-fashion-small-truncation0.5.json), so a quick check never replaces the full figure; a
    shipped model's in the working folder (never into the installed package)."""
    from . import pretrained
    from .average import weights_tag

    name = f"eval-{ckpt.path.stem}"
    if args.dataset is not None and absolute_dataset(args.dataset) != ckpt.train_config.get("dataset"):
        name += "-" + dataset_stem(args.dataset)
    if args.test_size:  # the first N test examples: another figure than the whole split's
        name += f"-n{args.test_size}"
    if args.judge is not None:  # another reader, or truncated noise: other figures than the run's own report's
        name += "-judge-" + _judge_tag(args.judge)  # (each replaced the report of the plain eval)
    if args.truncation is not None:
        name += f"-truncation{args.truncation:g}"
    name += weights_tag(args.weights)  # an averaged run's training weights: another figure than its average's
    return Path(f"{name}.json") if pretrained.is_shipped(args.checkpoint) else ckpt.path.parent / f"{name}.json"


def _final_for_test_chosen(args: argparse.Namespace, run: Any, best: Any = None) -> tuple[Any, str]:
    """For eval, figures and viz on a run directory without --which: its best.safetensors (``best``, read if not given)
    chosen on the test split (trained without --val-size) is the best test figure over epochs, not an estimate; a
    finished run's last.safetensors, its final epoch, is scored instead (with --which best: the best, and a note of
    what it is). Returns (that Checkpoint or None, a note ending in a newline, or '')."""
    from . import train
    from .checkpoint import load_checkpoint

    what = {"eval": "scored", "viz": "shown"}.get(args.command, "drawn")
    given = getattr(args, "which_given", None)  # None: a command without --which
    if given is None or args.which != "best" or not Path(run).is_dir() or not (Path(run) / "best.safetensors").exists():
        return None, ""
    if best is not None and best.path.name != "best.safetensors":  # read before best.safetensors was written (a
        return None, ""  # run's first epoch, the fallback to last): what was read is scored, and no note of a best
    best = best if best is not None else load_checkpoint(run, "best")
    chosen = best.state.get("best") or {}
    if chosen.get("split") != "test":  # chosen on the validation split: an estimate
        return None, ""
    if given:  # --which best asked for it: scored as asked, said for what it is
        return None, (f"{run}: best.safetensors (epoch {chosen.get('epoch')}), asked for, was chosen on the test split "
                      f"(trained without --val-size): its test figures are the best over epochs, not an estimate; "
                      f"--which last is the final epoch's\n")
    if not (Path(run) / "last.safetensors").exists():
        return None, ""
    last = load_checkpoint(run, "last")
    planned = last.train_config.get("epochs")
    if train.finished(last.state, planned):  # its final epoch
        return last, (f"{run}: best.safetensors was chosen on the test split (trained without --val-size), so its "
                      f"test figures would be the best over epochs; {what} from last.safetensors, the final epoch's "
                      f"weights (--which best takes the other)\n")
    # stopped before its last epoch: no final epoch yet, and last is not one
    return None, (f"{run}: the run has not finished its {planned} epochs, and its best.safetensors, {what} here, was "
                  f"chosen on the test split (trained without --val-size): its test figures are the best over its "
                  f"epochs so far, not an estimate; finish the run for its final epoch's\n")


def _say_test_chosen_best(args: argparse.Namespace, used: str) -> None:
    """For predict, generate and export on a run directory without --which: a note when its best.safetensors, which
    they use, was chosen on the test split (trained without --val-size); for a finished run `capsnet eval` scores
    the final epoch's last.safetensors unless asked (``_final_for_test_chosen``): the two commands' models differ,
    and nothing said so."""
    from . import train
    from .checkpoint import load_checkpoint

    run = Path(args.checkpoint)
    if args.which_given or not run.is_dir() or not (run / "best.safetensors").exists():
        return
    best = load_checkpoint(run, "best").state.get("best") or {}
    if best.get("split") != "test":
        return
    chosen = f"note: {used} {run}'s best.safetensors, epoch {best.get('epoch')}, chosen on the test split (trained " \
             f"without --val-size)"
    last = load_checkpoint(run, "last") if (run / "last.safetensors").exists() else None
    if last is not None and train.finished(last.state, last.train_config.get("epochs")):
        if last.state.get("epoch") != best.get("epoch"):  # the final epoch the best: one model either way
            print(f"{chosen}; `capsnet eval` scores the final epoch's last.safetensors unless --which best asks, and "
                  f"--which last uses it here", flush=True)
    else:  # eval scores this best too, and says so
        print(f"{chosen}, of a run not finished (or without its last.safetensors): its test figures are the best "
              f"over its epochs so far, and `capsnet eval` scores it too", flush=True)


def _cmd_eval(args: argparse.Namespace) -> int:
    from .checkpoint import atomic_write_text, load_checkpoint, unwritable
    from .evaluate import evaluate_checkpoint
    from .synthesis import evaluate_synthesis_checkpoint

    _output_file(args.json, "--json")
    saved = load_checkpoint(args.checkpoint, args.which)  # read once: the report is of these weights, whatever a
    saved_configs(saved)  # a model this capsnet lacks, named with the file (not as if --model had been typed)
    last, note = _final_for_test_chosen(args, args.checkpoint, saved)
    if last is not None:
        args.which, saved = "last", last
    out = Path(args.json) if args.json else _eval_report(saved, args)  # running training writes meanwhile
    if not args.json and (why := unwritable(out.parent)) is not None:  # said now, not after the evaluation
        raise ValueError(f"cannot write the report {out} ({why}); give --json FILE where you can write")
    with _sizes_by_flag({"test_size": args.test_size}):  # --test-size past the split, by its flag
        if model_spec(saved.model_name).kind == "synthesis":
            if args.affnist:
                args.parser.error("--affnist scores 40x40 classifiers; this checkpoint holds a synthesis model")
            done = evaluate_synthesis_checkpoint(saved, which=args.which, dataset=args.dataset,
                                                 test_size=args.test_size, judge=args.judge, root=args.data_dir,
                                                 device=str(resolve_device(args.device)),
                                                 batch_size=args.batch_size, progress=not args.no_progress,
                                                 truncation=args.truncation, weights=args.weights)
        elif args.judge is not None or args.truncation is not None:
            flag = "--judge" if args.judge is not None else "--truncation"
            noisy = {n for n, spec in MODELS.items()
                     if any(f.name == "noise_dim" for f in dataclasses.fields(spec.config))}
            models = ", ".join(n for n, spec in MODELS.items()  # pix2pix has no noise vector to truncate
                               if spec.kind == "synthesis" and (args.judge is not None or n in noisy))
            args.parser.error(f"{flag} applies to synthesis models ({models}); this checkpoint holds a "
                              f"{saved.model_name} model")
        else:
            done = evaluate_checkpoint(saved, which=args.which, dataset=args.dataset, test_size=args.test_size,
                                       affnist=args.affnist or (), batch_size=args.batch_size, device=args.device,
                                       root=args.data_dir, progress=not args.no_progress, weights=args.weights)
    report = done.report() | {"weights": args.weights}
    try:  # first: a reader that stops early (| head) loses nothing
        atomic_write_text(out, json.dumps(strict_json(report), indent=2, allow_nan=False))  # NaN as null
    finally:  # a long evaluation's figures are shown even when the report cannot be written (then the error)
        print(note + done.format())
        _say_training_weights(args)
    print(f"\nwrote {out}")
    return 0


def _cmd_models(args: argparse.Namespace) -> int:
    from .models import catalog

    if args.json:
        data = catalog.describe(args.name) if args.name else {"models": catalog.catalog(), "pretrained": catalog.shipped()}
        print(json.dumps(data, indent=1))
    else:
        print(catalog.format_model(args.name) if args.name else catalog.format_catalog())
    return 0


def _cmd_routings(args: argparse.Namespace) -> int:
    from .models.capsnet import ROUTING_OPTIONS_SET_ELSEWHERE, ROUTING_OPTIONS_UNUSED, ROUTING_STARTS
    from .routing import catalog

    if args.json:
        print(json.dumps(catalog.describe_routing(args.name) if args.name else catalog.routing_catalog(), indent=1))
        return 0
    if not args.name:
        print(catalog.format_routings())
        print(f"\nIn the paper's CapsNet: `capsnet train --routing NAME` takes "
              f"{', '.join(CapsNetConfig.probability_routings())} (activations in [0, 1], which its margin loss reads), "
              f"with their options as `--routing-option KEY=VALUE`; `capsnet routings NAME` lists a routing's.")
        print(f"In SegCaps and CapsPix2pix's generator (every capsule layer): `capsnet train --model segcaps "
              f"--routing NAME` (or --model capspix2pix) takes {', '.join(stack_routings())} (activations that are "
              f"its capsules' lengths, as probabilities).")
        return 0
    print(catalog.format_routing(args.name))
    if args.name not in CapsNetConfig.probability_routings():
        print(f"\n{args.name} routing's activations are not in [0, 1], so CapsNet's --routing does not take it; the "
              f"models built for it do (capsnet models).")
        return 0
    options = [o["name"] for o in catalog.describe_routing(args.name)["options"]]
    own = [o for o in options if o not in ROUTING_OPTIONS_SET_ELSEWHERE and o not in ROUTING_OPTIONS_UNUSED]
    print(f"\nIn the paper's CapsNet: `capsnet train --routing {args.name}`"
          + (f", its options as `--routing-option KEY=VALUE` ({', '.join(own)})" if own else " (it has no options)")
          + "; the layer's sizes" + (" and --routing-iterations" if "iterations" in options else "")
          + " come from the network"
          + (", --leaky-routing and --detach-agreement from their flags" if "leaky" in options else "") + ".")
    if args.name in ROUTING_STARTS:
        options, std = ROUTING_STARTS[args.name]
        print(f"CapsNet starts it from {', '.join(f'{k}={v}' for k, v in options.items())} and the digit capsules' W "
              f"at N(0, {std}^2) (ROUTING_STARTS), unless --routing-option or --model-option digit_init_std say "
              f"otherwise.")
    return 0


def _cmd_generate(args: argparse.Namespace) -> int:
    from .synthesis import generate_folder

    done = generate_folder(args.checkpoint, args.labels, args.out, seeds=args.seeds, which=args.which,
                           weights=args.weights, device=str(resolve_device(args.device)), progress=not args.no_progress,
                           truncation=args.truncation)
    again = _replaced(done.replaced)
    _say_test_chosen_best(args, "drew with")
    print(f"wrote {_counted(len(done.files), 'image')} to {done.folder}{again}")
    _say_training_weights(args)
    return 0


def _replaced(files: Sequence[Path]) -> str:
    """' (N files of the same names replaced)' for the last line of a command that wrote into a folder, else '': a
    second run into one folder is said, so no earlier output goes unnoticed."""
    n = len(files)
    return f" ({_counted(n, 'file')} of the same name{'s' if n > 1 else ''} replaced)" if n else ""


def _refuse_moved_folder(args: argparse.Namespace, run_dir, last) -> None:
    """A resume of a run whose user folder (folder:DIR, pairs:DIR, classes:DIR) is no longer there, named with the
    fix: a resume reads the folder it trained on (its test split is drawn from its files)."""
    saved = last.train_config.get("dataset", "")
    if (gone := user_folder(saved)) and not Path(gone[1]).is_dir():
        args.parser.error(f"the run in {run_dir} trained on --dataset {saved}, and that folder is gone; put it back at "
                          f"{gone[1]} to resume (its test split is drawn from its files)")


def _cmd_predict(args: argparse.Namespace) -> int:
    from .predict import predict_folder

    done = predict_folder(args.checkpoint, args.images, args.out, which=args.which, weights=args.weights,
                          device=str(resolve_device(args.device)), threshold=args.threshold,
                          probabilities=args.probabilities, batch_size=args.batch_size, progress=not args.no_progress,
                          mnist_style=args.mnist_style, fit=args.fit)
    _say_test_chosen_best(args, "predicted with")
    for note in done.notes:
        print(f"note: {note}")
    _say_training_weights(args)
    again = _replaced(done.replaced)
    if done.kind == "classification":
        shown = done.rows[:10]
        width = max(len(r["file"]) for r in shown)
        for r in shown:
            print(f"{r['file']:<{width}}  {r['class']:<12}  score {r['score']:.4f}")
        if len(done.rows) > len(shown):
            print(f"... and {len(done.rows) - len(shown)} more")
        print(f"classified {_counted(len(done.rows), 'image')}: wrote {done.files[0]}{again}")
    else:
        share = sum(r["foreground"] for r in done.rows) / len(done.rows)
        print(f"segmented {_counted(len(done.rows), 'image')} (foreground {100 * share:.1f}% of the pixels on "
              f"average): wrote {_counted(len(done.files), 'file')} to {done.folder}{again}")
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from .export import export_model

    if args.opset is not None and args.format != "onnx":
        args.parser.error(f"--opset applies to --format onnx only, not --format {args.format}")
    from .export import FORMATS as suffixes

    given = Path(args.out).suffix.lower() if args.out else ""
    other = next((f for f, s in suffixes.items() if s == given and f != args.format), None)
    if other:  # x.pt2 written as ONNX reads back as neither
        renamed = Path(args.out).with_suffix(suffixes[args.format]).name
        args.parser.error(f"--out {args.out} has the suffix of --format {other} ({given}), not of {args.format}: use "
                          f"--format {other}, or name the file {renamed}")
    # tracing and checking take seconds to minutes with nothing else to show: said first, on stderr with the bars,
    # once the checkpoint has loaded and every refusal has passed (a refusal came after it before)
    print(export_model(args.checkpoint, args.out, format=args.format, which=args.which, opset=args.opset,
                       weights=args.weights, any_size=args.any_size,
                       say=lambda line: print(line, file=sys.stderr, flush=True)).format_report())
    _say_test_chosen_best(args, "exported")
    _say_training_weights(args)
    return 0


def _cmd_figures(args: argparse.Namespace) -> int:
    from .figures import sweep_deltas, write_figures

    runs = args.checkpoint if isinstance(args.checkpoint, list) else [args.checkpoint]
    last, note = _final_for_test_chosen(args, runs[0]) if runs and runs[0] is not None else (None, "")
    if last is not None:
        args.which = "last"
    done = write_figures(args.checkpoint, loaded=last, which=args.which, weights=args.weights, out=args.out,
                         dataset=args.dataset,
                         root=args.data_dir,
                         indices=None if args.indices is None else list(dict.fromkeys(args.indices)),  # once each
                         dims=args.dims, deltas=sweep_deltas(args.delta_range, args.delta_step),
                         misclassified=args.misclassified, fmt=args.format, dpi=args.dpi, device=args.device,
                         progress=not args.no_progress)
    print(note + "\n".join(done.notes))  # after: a model figures refuse is told that alone
    _say_training_weights(args)
    print(f"wrote {len(done.files)} figures to {done.folder}{_replaced(done.replaced)}:")
    print("\n".join(f"  {p.name}" for p in done.files))
    if done.earlier:  # another call's figures beside these (--which best then last drew into one folder, unsaid)
        shown = some_of(done.earlier)
        left = "was left as it was" if len(done.earlier) == 1 else "were left as they were"
        give = "give another --out" if args.out else "give --out"
        print(f"note: {_counted(len(done.earlier), 'other figure')} in {done.folder} came from an earlier `capsnet "
              f"figures` (another --which, --indices, --format or --weights) and {left}: {shown}; {give} to keep "
              f"each drawing apart")
    return 0


def _experiment_options(args: argparse.Namespace, model_flags: dict[str, Any]) -> dict[str, Any]:
    """An experiment's --model-option KEY=VALUE pairs, refused where no registered model has the field, where the
    experiment sets the field itself (each data set's sizes, the routing of --models NAME:ROUTING), or where a flag
    sets the same field otherwise."""
    options = dict(args.model_option or [])
    known = set().union(*(_fields(m) for m in MODELS))
    for field, value in options.items():
        typed = _as_typed(field, value, True)
        if field not in known:
            # a flag's name as the key (cnn_channels for --cnn-channels, whose field is channels): that field
            flagged = {_flag(f)[2:].replace("-", "_"): f for f in _MODEL_FIELDS}.get(field)
            close = [flagged] if flagged else difflib.get_close_matches(field, sorted(known), n=1)
            args.parser.error(f"{typed}: no model has a field {field}"
                              + (f" ({_flag(flagged)} sets the field {flagged})" if flagged else "")
                              + (f"; did you mean {close[0]}?" if close else "")
                              + " (`capsnet models NAME` lists a model's fields)")
        if field in DATASET_FIELDS:
            args.parser.error(f"{typed}: the experiment sizes each model's input and output to the data set it "
                              f"trains on; leave it out")
        if field in ("routing", "routing_options"):
            args.parser.error(f"{typed}: capsnet experiment routes a model by another algorithm as --models "
                              f"NAME:ROUTING (--models capsnet:em), with that routing's own settings; leave it out")
        if field in model_flags and not _same_value(model_flags[field], value):  # the option would win, silently
            args.parser.error(f"{_as_typed(field, model_flags[field])} and {typed} both set {field}; keep one")
    return options


def _cmd_experiment(args: argparse.Namespace) -> int:
    from . import experiments as ex

    args.interrupted_hint = "run the same command again to continue (finished runs are read back)"  # Ctrl-C's line

    misplaced = [f for f, names in _EXPERIMENT_ONLY.items() if args.name not in names and hasattr(args, f)]
    if misplaced:  # the first one's, and the others that the same experiments take
        takers = _EXPERIMENT_ONLY[misplaced[0]]
        flags = [_flag(f) for f in misplaced if _EXPERIMENT_ONLY[f] == takers]
        why = _EXPERIMENT_WITHOUT.get((args.name, misplaced[0])) if len(flags) == 1 else None
        others = "every other experiment" if set(takers) == set(EXPERIMENTS) - {args.name} else \
            _either([f"`capsnet experiment {n}`" for n in takers])
        args.parser.error(f"{_listed(flags, 'does', 'do')} not apply to `capsnet experiment {args.name}`"
                          f"{f' ({why})' if why else ''}; {'it is an option' if len(flags) == 1 else 'they are options'}"
                          f" of {others}")
    if getattr(args, "steps", 0) and hasattr(args, "epochs"):  # --steps 0 is --epochs for every size: no conflict
        args.parser.error("--steps and --epochs conflict: less-data takes one budget, give one of them")
    out = Path(args.out or f"runs/experiment-{args.name}")
    check_out_dir(out, "experiment's runs and tables")
    ex.check_results_folder(out, args.name)
    typed = _typed(args, _TRAIN_FIELDS)
    if getattr(args, "seeds", ()) and "seed" in typed:  # --seed was set aside without a word
        args.parser.error(f"--seed and --seeds conflict: the runs take the seeds of --seeds "
                          f"({', '.join(map(str, args.seeds))}); give one of them")
    model_flags = _typed(args, _MODEL_FIELDS)
    options = _experiment_options(args, model_flags)
    planned_models = {ex.model_entry(m)[0] for m in ex.planned_models(args.name, args.models)}
    try:  # a refusal opened by the flag as typed, as train's
        train = TrainConfig(**typed)  # each model's own defaults are the plan's (experiments.plan)
        configs = {m: model_spec(m).config(**{f: v for f, v in (model_flags | (options if m in planned_models else {}))
                                              .items() if f in _fields(m)})
                   for m in ([ex.model_entry(m)[0] for m in args.models] if args.models else MODELS)}
    except ValueError as e:
        raise _opened_by_flag(e, typed | model_flags | options, options) from None
    require_compiler(args.compile, args.device)  # before any run: Inductor's own error came at the first step
    kept = _keep_memory(args.allocator) == "keep"
    runs = ex.plan(args.name, out, train=train, configs=configs, models=args.models,
                   sizes=getattr(args, "sizes", LESS_DATA_SIZES), steps=getattr(args, "steps", 0),
                   seeds=getattr(args, "seeds", ()), datasets=getattr(args, "datasets", None), typed=typed)
    planned = {}  # label (NAME, or NAME:ROUTING) -> its first run
    for run in runs:
        planned.setdefault(run.label, run)

    def takes(run: ex.Run, field: str) -> bool:  # a routing of one pass (capsnet:self-attention) has no rounds to set;
        # a field NAME:ROUTING sets back (another routing's switches, CapsNet's start) is not the run's either
        return (field in _fields(run.model) and not (field in ROUNDS and _one_pass(run.model_config))
                and _same_value(getattr(run.model_config, field), getattr(configs[run.model], field)))

    # a model's flag or --model-option: refused where no model of the plan has its field
    for field, said in [(f, _flag(f)) for f in model_flags] + [(f, f"--model-option {f}") for f in options]:
        having = [m for m, run in planned.items() if takes(run, field)]
        if not having:
            owners = [m for m in MODELS if field in _fields(m)]
            args.parser.error(f"{said} sets a field of {', '.join(owners)}, and no model of this experiment "
                              f"({', '.join(planned)}) has it; leave it out")
        if len(having) < len(planned):
            print(f"note: {said} applies to {', '.join(having)}; "
                  f"{', '.join(m for m in planned if m not in having)} {'has' if len(planned) - len(having) == 1 else 'have'} "
                  f"no such setting", flush=True)

    def started(k: int, run: ex.Run, done: bool) -> None:
        print(f"[{k + 1}/{len(runs)}] {run.label} on {run.dataset}, seed {run.seed}, "
              f"{ex.training_examples(run):,} training examples, {_counted(run.train_config.epochs, 'epoch')} "
              f"-> {run.run_dir}" + (" (finished: its figures read back)" if done else ""), flush=True)

    def epoch_line(run: ex.Run, record: dict[str, Any]) -> None:  # without bars, each evaluated epoch's line
        from . import gan, train

        synthesis = model_spec(run.model).kind == "synthesis"
        print(gan.describe_gan_epoch(record) if synthesis else train.describe_epoch(record, run.dataset), flush=True)

    def launched(k: int, run: ex.Run) -> None:
        print(f"training [{k + 1}/{len(runs)}] {run.label} on {run.dataset}, seed {run.seed} in a process of its own "
              f"-> {run.run_dir}", flush=True)

    def trained(k: int, run: ex.Run) -> None:
        print(f"trained [{k + 1}/{len(runs)}] {run.label} on {run.dataset}, seed {run.seed} -> {run.run_dir}",
              flush=True)

    def parallel(n: int) -> None:
        print(f"training the {_counted(n, 'run')} not yet finished {min(n, args.jobs)} at a time, each in a process "
              f"of its own", flush=True)

    probe_epochs = getattr(args, "probe_epochs", 3) if args.name == "synthesis" else 0  # once every run is done

    def written(rows: list[dict]) -> None:  # after each run: the tables so far, marked unfinished until all is done
        unfinished = None
        if len(rows) < len(runs):
            unfinished = f"{len(rows)} of {len(runs)} runs finished"
        elif probe_epochs:
            unfinished = "every run finished, the train-on-synthetic classifiers not yet"
        elif args.name == "segmentation":  # a stop (or an error) in the baseline's scoring left tables that looked
            unfinished = "every run finished, the Otsu baseline not yet"  # whole, without its row
        ex.write_results(rows, out, args.command_line, unfinished=unfinished)

    with _sizes_by_flag(typed):  # a size past the data's, by its flag
        rows = ex.run_plan(runs, device=args.device, data_root=args.data_dir, progress=not args.no_progress,
                           on_start=started, on_done=written,
                           compile=args.compile or False, jobs=args.jobs, keep_memory=kept, on_trained=trained,
                           on_launch=launched, on_epoch=epoch_line if args.no_progress else None,
                           on_parallel=parallel)
    if (args.name == "segmentation" or probe_epochs) and ex.stop_requested():  # asked in the last run's final epoch:
        raise KeyboardInterrupt  # its tables are written, marked unfinished; the work after the runs does not start
    if args.name == "segmentation":  # the untrained baseline beside the models, on the same test canvases
        rows += [ex.otsu_row(d, test_size=train.test_size, root=args.data_dir)
                 for d in dict.fromkeys(r.dataset for r in runs)]
        ex.write_results(rows, out, args.command_line)
    if probe_epochs:  # train on synthetic, test on real
        from .train import describe_epoch

        for d in dict.fromkeys(r.dataset for r in runs if task(r.dataset).num_classes < 2):
            print(f"note: {d} has no classes, so no classifier is trained on its generated images (--probe-epochs)")
        rows += ex.synthetic_probe_rows(runs, out, epochs=probe_epochs, device=args.device, data_root=args.data_dir,
                                        progress=not args.no_progress, say=lambda line: print(line, flush=True),
                                        on_epoch=(lambda r: print(describe_epoch(r, "mnist"), flush=True))
                                        if args.no_progress else None)
        ex.write_results(rows, out, args.command_line)
    print(ex.format_routing_table(rows) if args.name == "routing" else ex.format_segmentation_table(rows)
          if args.name == "segmentation" else ex.format_synthesis_table(rows) if args.name == "synthesis" else
          ex.format_table(rows))
    if args.name == "less-data":
        from .figures import save_figure

        print(f"wrote {save_figure(ex.plot_less_data(rows), out / 'less_data.png')}")
    print(f"wrote {out / 'results.md'} and {out / 'results.json'}")
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    """The grid of row sets; each one finished is kept: the JSON rewritten after it (marked unfinished until the
    last), and Ctrl-C or SIGTERM (a scheduler's or timeout's stop) prints and records the rows finished so far (a
    stopped grid lost them all)."""
    from .bench import environment, format_table, run_grid, write_record

    _output_file(args.json, "--json")
    require_compiler(args.compile, args.device)
    allocator = _keep_memory(args.allocator)
    def once(values):  # a value given twice is one row set, not two measurements of it
        return list(dict.fromkeys(values))

    grid = dict(batch_sizes=once(args.batch_size), rounds=once(args.routing_iterations), dtypes=once(args.dtype))
    total = len(grid["batch_sizes"]) * len(grid["rounds"]) * len(grid["dtypes"])
    env = environment() | {"allocator": allocator}
    done: list[list[dict]] = []  # the rows of the row sets finished so far

    def finished(rows: list[dict]) -> None:
        done.append(rows)
        if args.json and len(done) < total:
            write_record(args.json, args.command_line, env, rows, f"{len(done)} of {total} row sets, still running")

    def report(rows: list[dict]) -> None:
        print(" ".join(f"{k}={v}" for k, v in env.items()))
        timings = sorted({(r["device"], r["steps_per_timing"]) for r in rows})
        print("steps per timing: " + ", ".join(f"{n} on {d}" for d, n in timings)
              + " (1: one step's latency; more: steps queued back to back, throughput)")
        print(format_table(rows))

    try:  # (SIGTERM raises KeyboardInterrupt as Ctrl-C does: main)
        rows = run_grid(**grid, on_done=finished,
                        on_start=lambda b, r, d: print(f"capsnet bench: batch {b}, {_counted(r, 'routing round')}, "
                                                       f"{d} ...", file=sys.stderr, flush=True),
                        devices=None if args.device == "auto" else (args.device,), repeats=args.repeats,
                        baseline_path=args.baseline, seed=args.seed, compile=args.compile or False,
                        steps_per_timing=args.steps_per_timing)
    except KeyboardInterrupt:
        if not done:
            raise
        rows, note = done[-1], f"interrupted after {len(done)} of {total} row sets"
        report(rows)
        if args.json:
            write_record(args.json, args.command_line, env, rows, note)
        args.interrupted_hint = (f"{'the row set' if len(done) == 1 else f'the {len(done)} row sets'} finished "
                                 f"{'is' if len(done) == 1 else 'are'} above" +
                                 (f" and in {args.json} (marked unfinished)" if args.json else ""))
        raise
    report(rows)
    if args.json:
        write_record(args.json, args.command_line, env, rows)
        print(f"wrote {args.json}")
    return 0


def _cmd_viz(args: argparse.Namespace) -> int:
    from .memory import limit_arenas
    from .viz import load_viewer, make_server

    limit_arenas(2)  # each handler thread runs the model: glibc's pool per thread held what it freed (RSS 1.8x)

    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port {args.port} is not a port number: use 0..65535")
    if not args.host.strip():  # "" binds every interface, while the URL printed said 127.0.0.1
        raise ValueError("--host needs an address: 127.0.0.1 for this machine only (the default), 0.0.0.0 for "
                         "every network")
    from . import pretrained

    if args.untrained and args.checkpoint:
        raise ValueError("--untrained and --checkpoint contradict each other: give one")
    if args.weights == "training" and args.checkpoint is None:  # the shipped model and an untrained one keep none
        raise ValueError("--weights training needs --checkpoint RUN_DIR, a run trained with --ema-decay (the shipped "
                         "model and an untrained one keep no training weights beside an average)")
    checkpoint = args.checkpoint
    if checkpoint is None and not args.untrained and pretrained.DEFAULT in pretrained.names():
        checkpoint = pretrained.PREFIX + pretrained.DEFAULT
    # the viewer shows the test images' predictions: as eval scores them, a finished run's final epoch where its
    # best was chosen on the test split (it opened best, while the quick start's eval scored last)
    last, note = _final_for_test_chosen(args, checkpoint) if args.checkpoint is not None else (None, "")
    if last is not None:
        args.which = "last"
    viewer = load_viewer(checkpoint, which=args.which, weights=args.weights, dataset=args.dataset,
                         data_dir=args.data_dir,
                         device=str(resolve_device(args.device)), test_size=args.test_size)
    try:
        server = make_server(viewer, args.host, args.port, allowed_hosts=args.allow_host,
                             log=None if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True)))
    except OSError as e:
        import errno

        # taken, or a privileged port (Windows: a reserved range, WSAEACCES)
        in_use = e.errno in (errno.EADDRINUSE, errno.EACCES, getattr(errno, "WSAEACCES", errno.EACCES))
        fix = "pick another --port or stop what uses it" if in_use else \
            "give --host an address of this machine (127.0.0.1 for this machine only, 0.0.0.0 for every interface)"
        if in_use and args.port == 5000 and sys.platform == "darwin":  # the default port, macOS 12's AirPlay's too
            fix += " (on macOS, AirPlay Receiver listens on 5000: --port 8000, or turn it off in System Settings)"
        raise ValueError(f"cannot listen on {args.host}:{args.port} ({e.strerror or e}); {fix}") from None
    host, port = server.server_address[:2]
    if viewer.checkpoint is None:
        print("the weights are UNTRAINED (random), so predictions and reconstructions mean nothing; pass "
              "--checkpoint RUN_DIR from `capsnet train`, or leave both out for the shipped model", file=sys.stderr)
    if viewer.warning:
        print(f"warning: {viewer.warning}", file=sys.stderr)
    print(note, end="", flush=True)
    shown = checkpoint if pretrained.is_shipped(checkpoint) else viewer.checkpoint or "untrained CapsNet"
    weights = " (its training weights, not the average it saved as its model)" if args.weights == "training" else ""
    print(f"capsnet viewer: {shown}{weights} on {viewer.dataset} test images", flush=True)
    shown_host = "127.0.0.1" if host == "0.0.0.0" else "[::1]" if host == "::" else f"[{host}]" if ":" in host \
        else host  # an IPv6 address in brackets, as URLs write it
    print(f"open http://{shown_host}:{port}/  (Ctrl-C stops)", flush=True)
    if not _loopback(host):
        print(f"warning: the viewer listens on {args.host}, reachable from other machines, without a password: anyone "
              f"who can reach this one sees the model, its checkpoint's path and the test images; --host 127.0.0.1 "
              f"serves this machine only", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        server.server_close()
        print("stopped", flush=True)
        sys.stderr.flush()
        # handler threads may be inside torch's C++ code: the interpreter's shutdown stops them there
        # (std::terminate, SIGABRT and a core dump); nothing is left to write, so the program ends here (called from
        # Python, main() returns: a notebook's process is not the viewer's to end)
        if AS_PROGRAM:
            os._exit(0)
    finally:
        server.server_close()
    return 0


def _path_error(e: OSError, args: argparse.Namespace | None = None) -> str:
    """An OSError of a path in words: a file where a folder was to be made, the folder an atomic write's temporary
    file was in (its name means nothing to the user), else the error and the path."""
    import errno

    name = Path(e.filename) if e.filename else None
    if name is not None and e.errno == errno.EEXIST and name.is_file():
        return f"{name} is a file, where a folder was to be made; give a folder (--out) that is not a file"
    if name is not None and isinstance(e, FolderInTheWay):
        return (f"{name} is a folder, where a file of that name was to be written (the folder is left as it was); "
                f"move or rename it, or write elsewhere")
    if name is not None and e.errno == errno.EEXIST and name.is_symlink() and not name.exists():
        return (f"{name} is a link to {os.readlink(name)}, which does not exist; create the folder it points to, or "
                f"give another (--out)")
    if name is not None and e.strerror and e.strerror.startswith(f"cannot replace {name}:"):  # said in full
        return e.strerror
    if name is not None and name.name.startswith(".") and ".tmp-" in name.name:  # atomic_write's temporary file
        return f"cannot write in {name.parent}: {e.strerror or e}; give a folder you can write to (--out)"
    if e.errno in (errno.ENOSPC, errno.EDQUOT):  # the previous file of that name, if any, is as it was
        return (f"cannot write {name if name else 'the output'}: {e.strerror}; free space there or write elsewhere "
                f"(any earlier file of that name is unchanged)")
    if e.errno == errno.EFBIG:  # a file size limit (ulimit -f) or the file system's largest file
        return (f"cannot write {name if name else 'the output'}: {e.strerror} (larger than a file may be here: a "
                f"file size limit, `ulimit -f`, or the file system's); raise the limit or write elsewhere (any "
                f"earlier file of that name is unchanged)")
    cache = _compile_cache_of(name, args)
    if cache is not None:  # no flag named it: "check the paths given" misled
        var, folder = cache
        return (f"{'Triton' if var.startswith('TRITON') else 'TorchInductor'}'s cache folder {folder} ({var}) cannot be "
                f"used: {e.strerror or e}: {name}; set {var} to a folder you can write to, or train uncompiled "
                f"(--compile none)")
    return f"{e.strerror or e}{f': {name}' if name else ''}; check the paths given"


def _compile_cache_of(name: Path | None, args: argparse.Namespace | None) -> tuple[str, str] | None:
    """(variable, folder) of the compiler cache that ``name`` lies in, for a command that compiles, where the path is
    none the command was given (its --out, its --data-dir): a cache folder set to $HOME holds those too."""
    if name is None or args is None or not getattr(args, "compile", None):
        return None
    path = Path(os.path.abspath(name))
    own = [getattr(args, f, None) for f in ("out", "data_dir")]
    if any(o and path.is_relative_to(os.path.abspath(os.path.expanduser(str(o)))) for o in own):
        return None
    for var in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        folder = os.environ.get(var)  # Inductor sets its own (the default, /tmp/torchinductor_USER) before using it
        if folder and path.is_relative_to(os.path.abspath(folder)):
            return var, folder
    return None


def _allocator_argument(p: argparse.ArgumentParser, scope: str) -> None:
    p.add_argument("--allocator", choices=ALLOCATORS, default="keep",
                   help="keep: glibc keeps freed memory for reuse, faster CPU training (capsnet.memory; a no-op off "
                        f"glibc); default: the C library's own behaviour{scope}")


def _keep_memory(allocator: str) -> str:
    """Apply ``--allocator``; the allocator in effect ("default" where keeping is not possible, "keep" where an
    earlier call in this process kept freed memory: glibc's tuning lasts, and a benchmark recorded "default" under
    it)."""
    from . import memory

    if allocator == "keep":
        return "keep" if memory.keep_freed_memory() else "default"
    if memory.kept():
        warnings.warn("--allocator default: an earlier command in this process kept freed memory (--allocator "
                      "keep), which lasts as long as the process; the allocator stays tuned (run it in a process of "
                      "its own)", stacklevel=2)
        return "keep"
    return "default"


# ------------------------------------------------------------------------------------------ the command

_COMMANDS = {  # name: (arguments, handler, help, description)
    "models": (_models_arguments, _cmd_models, "the registered models, their fields and the shipped trained ones",
               "List the registered models (paper, task, input, weights) and the trained models shipped with capsnet; "
               "with NAME, every field of that model's config: its type, default and what it does. Set a field with "
               "`capsnet train --model NAME --model-option FIELD=VALUE`."),
    "routings": (_routings_arguments, _cmd_routings, "the registered routing algorithms and their options",
                 "List the registered routing algorithms (whether each iterates, takes a pose bias and gives "
                 "activations in [0, 1]); with NAME, its options, defaults and notes, read from its code. In the "
                 "paper's CapsNet: `capsnet train --routing NAME --routing-option KEY=VALUE`."),
    "prepare": (_prepare_arguments, _cmd_prepare, "make your photos into class folders capsnet trains on",
                "Make a folder of your own photos (a subfolder per class, any size, any format Pillow reads) into "
                "what --dataset classes:DIR reads: PNG files of one size and mode, each turned by its EXIF "
                "orientation and fitted to the size (crop or pad). The folder is written whole or not at all: a file "
                "that cannot be read, a full disk or Ctrl-C leaves no --out folder."),
    "train": (_train_arguments, _cmd_train, "train a registered model (CapsNet by default), checkpointing as it goes",
              "Train a registered model (the paper's CapsNet by default). Writes last.safetensors, best.safetensors, "
              "config.json and metrics.jsonl into --out; last.safetensors at the end of epochs and every "
              "--save-every minutes inside an epoch, so --resume continues a stopped run where it was."),
    "generate": (_generate_arguments, _cmd_generate, "images from your own label maps with a synthesis model",
                 "Make images from a folder of label maps (PNG) with a trained synthesis model (capspix2pix, "
                 "pix2pix): one PNG per label map and noise seed, every label map checked before any file is "
                 "written."),
    "predict": (_predict_arguments, _cmd_predict, "classify or segment your own images with a trained model",
                "Apply a trained classifier or segmentation model to a folder of PNG images (a classifier with "
                "--fit, or one trained on a folder capsnet prepare made: any image Pillow opens, fitted to its "
                "input): a classifier writes "
                f"{PREDICTIONS_FILE} (each file's class and every class's score), a segmentation model one mask "
                "per image (and, with --probabilities, its probabilities). Every image is read and checked, and "
                "every prediction made, before any file is written."),
    "eval": (_eval_arguments, _cmd_eval, "test accuracy, per-class accuracy and confusion matrix",
             "Evaluate a checkpoint on its data set's test split; prints a table and writes JSON."),
    "export": (_export_arguments, _cmd_export, "write a checkpoint's model as ONNX or a torch.export program",
               "Export a trained model for inference: images (batch, C, H, W) in [0, 1] in (CIFAR-10 and "
               "smallNORB runs: their standardised crops, as the file's capsnet.input says); the class scores, the "
               "class capsules' poses and, where the model has a decoder, the reconstruction from the predicted "
               "class out (capsnet.export lists them per model); a CapsPix2pix checkpoint's generator: label_maps and "
               "noise in, images out. The batch size is dynamic and the graph holds plain "
               "operations. Before the file is written its graph runs once (ONNX: in onnxruntime) and is compared "
               "with the PyTorch model."),
    "bench": (_bench_arguments, _cmd_bench, "training and inference throughput and peak memory",
              "Throughput (images/s) and peak memory of the MNIST CapsNet, with the tutorial-style baseline measured "
              "in the same run when its file is found."),
    "figures": (_figures_arguments, _cmd_figures, "reconstructions, pose sweeps, routing maps, lengths, curves; "
                "segmentation: masks, predictions, capsule maps; synthesis: samples, interpolation, capsule maps",
                "Look inside a trained CapsNet. Writes into --out: reconstructions, misclassified (inputs decoded from "
                "the true and the predicted capsule), pose_sweep_INDEX (the paper's Figure 4), routing_INDEX "
                "(coupling per round and primary capsule lengths), lengths (digit capsule lengths) and "
                "training_curves. For a MultiMNIST run: multimnist (the paper's Figure 5: each pair of overlapping "
                "digits above its two reconstructions in red and green) and training_curves. For a segmentation "
                "run (segcaps, segcaps-r1, unet): segmentations and segmentations_ood (inputs, true masks, "
                "probabilities, predicted masks, SegCaps' reconstruction), worst, capsule_maps_INDEX (SegCaps: every "
                "layer's capsule lengths per type) and training_curves. For a synthesis run (capspix2pix, "
                "capspix2pix-deep, pix2pix): samples (label maps, real images and images for several noise seeds), "
                "interpolation and truncation (between two noise vectors, and the noise truncated; models with a "
                "noise vector), capsule_maps_INDEX (the generator's capsule lengths per layer) and training_curves "
                "(both losses)."),
    "experiment": (_experiment_arguments, _cmd_experiment, "rerun the paper's experiments; compare the routings",
                   "Train models through the same loop, data and budget, and tabulate their final-epoch test "
                   "figures. " + " ".join(f"{n}: {about}" for n, about in _EXPERIMENT_ABOUT.items()) + " "
                   + _EXPERIMENT_RUNS.format(" (less-data: and less_data.png)")
                   + " (`capsnet experiment NAME --help`: one experiment's flags alone.)"),
    "viz": (_viz_arguments, _cmd_viz, "local web viewer: walk an image through the network, move its pose",
            "Serve the interactive viewer on a local web server (loopback by default)."),
}


def _torch_version() -> str:
    import torch

    return torch.__version__


def build_parser() -> argparse.ArgumentParser:
    # allow_abbrev=False: an abbreviation is taken for the one flag it begins (--routing em for --routing-iterations,
    # "invalid int"), and a flag added later turns yesterday's abbreviation into an error; every flag in full
    p = _Parser(prog="capsnet", formatter_class=_HelpFormatter, allow_abbrev=False,
                description="Capsule networks (Sabour, Frosst and Hinton, NIPS 2017): train, evaluate, benchmark.")
    p.add_argument("-v", "--verbose", action="store_true", help="log progress details to stderr")
    p.add_argument("--version", action="version", version=f"capsnet {__version__} (torch {_torch_version()})")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (arguments, handler, help, description) in _COMMANDS.items():
        sp = sub.add_parser(name, formatter_class=_HelpFormatter, help=help, description=description,
                            add_help=name != "experiment", allow_abbrev=False)  # its own --help (_ExperimentHelp)
        arguments(sp)
        sp.set_defaults(handler=handler, parser=sp)
        sp.before_command = tuple(o for a in p._actions for o in a.option_strings if o not in ("-h", "--help"))
    return p


AS_PROGRAM = False  # set by the `capsnet` command and `python -m capsnet`: this process is the command's own


def _launched() -> Any:
    """torchrun's ``Launch`` for this process, or None (also for launcher variables too broken to read: the command
    itself then says nothing of them, as before)."""
    from .distributed import DistributedError, launcher

    try:
        return launcher()
    except DistributedError:
        return None


def _rank_tag() -> str:
    """' (rank R of W)' in a process torchrun started with several processes, else ''."""
    rank, world = os.environ.get("RANK", ""), os.environ.get("WORLD_SIZE", "")
    return f" (rank {rank} of {world})" if rank.isdigit() and world.isdigit() and int(world) > 1 else ""



# the running command's warning prefix, per thread (a context variable), and the hook that reads it: installed while
# any command runs, the program's own restored when the last ends (two calls of main in two threads each set
# warnings.showwarning and restored it out of order, leaving a command's prefix on every later warning)
_WARNING_PREFIX: contextvars.ContextVar[str | None] = contextvars.ContextVar("capsnet_warning_prefix", default=None)
_HOOK_LOCK = threading.Lock()
_HOOK: dict[str, Any] = {"users": 0, "saved": None}


@contextlib.contextmanager
def _command_warnings(prefix: str) -> Iterator[None]:
    """The calling thread's capsnet warnings printed as ``PREFIX MESSAGE`` for the block (``one_line_warnings``);
    other threads' and other packages' as the program's own hook prints them."""
    token = _WARNING_PREFIX.set(prefix)
    with _HOOK_LOCK:
        if _HOOK["users"] == 0:
            _HOOK["saved"] = warnings.showwarning
            warnings.showwarning = one_line_warnings(_WARNING_PREFIX.get)  # the saved hook for the rest
        _HOOK["users"] += 1
    try:
        yield
    finally:
        with _HOOK_LOCK:
            _HOOK["users"] -= 1
            if _HOOK["users"] == 0:
                warnings.showwarning = _HOOK["saved"]
        _WARNING_PREFIX.reset(token)


@contextlib.contextmanager
def _logging_for(verbose: bool) -> Iterator[None]:
    """The command's log records on stderr, "capsnet.train: ..." (INFO with -v, else WARNING). As the program: the
    root logger's, for good. Called from another program: a handler of the ``capsnet`` logger for the call alone
    (basicConfig left a root handler for the whole process, so a later call's -v did nothing and an earlier -v left
    every library of the program logging at INFO)."""
    if AS_PROGRAM:
        logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(name)s: %(message)s")
        yield
        return
    logger = logging.getLogger("capsnet")
    handler = None
    if not logger.hasHandlers():  # the program's handlers (its own or the root's) show the records where it has any
        handler = logging.StreamHandler(sys.stderr)  # (a second handler printed each record twice)
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        handler.setLevel(logging.INFO if verbose else logging.WARNING)
        logger.addHandler(handler)
    level = logger.level
    if verbose and not logger.isEnabledFor(logging.INFO):
        logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        if handler is not None:
            logger.removeHandler(handler)
        logger.setLevel(level)


def _tolerant_stdout() -> None:
    """Paths and file names the stream's encoding cannot hold (a cp1252 log on Windows, PYTHONIOENCODING=ascii in a
    CI job, a non-ASCII home folder) are written escaped, as stderr's always are: a strict stream made every
    command that printed one end in exit status 2 and a codec's message, its work done and its table lost."""
    stream = sys.stdout
    if getattr(stream, "errors", None) == "strict" and hasattr(stream, "reconfigure"):
        try:
            stream.reconfigure(errors="backslashreplace")
        except (ValueError, OSError):  # a stream closed or detached by the caller: left as it is
            pass


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if AS_PROGRAM:
        _tolerant_stdout()
    parser = build_parser()
    parser.argv = argv
    for action in parser._actions:  # each command's parser quotes the command line back too (_stray_values)
        if isinstance(action, argparse._SubParsersAction):
            for command in action.choices.values():
                command.argv = argv
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # said by the command's own parser, which knows the options they may have meant
        args.parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    args.command_line = shlex.join(["capsnet", *argv])
    if args.command != "train" and (launch := _launched()) is not None and launch.world_size > 1:
        # each process ran the whole command: an experiment trained every run once per process, all writing the
        # same files
        args.parser.error(f"capsnet {args.command} runs in one process; run it without torchrun (`capsnet train` "
                          f"is the command that trains in several)")
    for field in ("out", "images", "labels", "checkpoint", "json", "data_dir"):  # an unset shell variable, say
        value = getattr(args, field, None)  # (--out "" trained into runs/DATASET, predict wrote into ./)
        if any(isinstance(v, str) and not v.strip() for v in (value if isinstance(value, list) else [value])):
            required = any(a.dest == field and a.required for a in args.parser._actions)
            args.parser.error(f"--{field.replace('_', '-')} needs a path, got an empty one; give one"
                              + ("" if required else " or leave the flag out"))
    for field in ("out", "images", "labels", "checkpoint", "json", "data_dir", "tensorboard", "judge", "affnist",
                  "baseline"):
        # a ~ the shell left as it was (--out=~/runs, a launcher's or a config file's): checked as the home folder
        # and written as ./~ before; one meaning for every path flag
        value = getattr(args, field, None)
        if isinstance(value, list):
            setattr(args, field, [os.path.expanduser(v) if isinstance(v, str) else v for v in value])
        elif isinstance(value, str):
            setattr(args, field, os.path.expanduser(value))
    if hasattr(args, "which"):  # --which picks a run directory's checkpoint: for a file it was accepted and ignored
        given = args.checkpoint if isinstance(args.checkpoint, list) else [args.checkpoint]
        if args.which is not None and not any(c is not None and Path(c).is_dir() for c in given):
            named = " ".join(str(c) for c in given if c is not None)
            args.parser.error(f"--which {args.which} picks a run directory's best or last checkpoint; " + (
                f"{named} is one checkpoint (a file or a shipped model)" if named else
                "an untrained model has none" if getattr(args, "untrained", False) else
                "the shipped model is one checkpoint") + ": leave --which out")
        args.which_given = args.which is not None  # eval: a test-chosen best is left for last unless asked for
        args.which = args.which or "best"
    from ._signals import sigterm_as_interrupt
    from .checkpoint import CheckpointError, WritesInterrupted
    from .data import DataError

    # SIGTERM (kill, timeout, a scheduler) stops a command as Ctrl-C does: its temporary files removed and one line
    # said (every command but train, experiment and bench died of it at once, silently, status 143, leaving a
    # half-written file: a review, 2026-12-02); train's loop saves where it is on either signal (train.SaveThenStop),
    # except under torchrun, where it is off (the launcher owns the signals): there SIGTERM, which torchrun passes
    # on to every process when it is stopped (a scheduler), stops each as Ctrl-C does, rank 0 saying how to resume
    # (it ended silently, leaving a part-written checkpoint: a review, 2026-12-03)
    from .distributed import LAUNCHER_VARIABLES

    torchrun = any(os.environ.get(v) for v in LAUNCHER_VARIABLES)
    stops = contextlib.nullcontext() if args.command == "train" and not torchrun else sigterm_as_interrupt()
    try:
        # capsnet's own warnings as one line, "capsnet train: warning: ..."; the rest as Python shows them
        with _command_warnings(f"capsnet {args.command}{_rank_tag()}: warning: "), _logging_for(args.verbose), \
                warnings.catch_warnings(), stops:
            return args.handler(args)
    except (CheckpointError, DataError, ValueError) as e:
        print(f"capsnet {args.command}{_rank_tag()}: error: {e}", file=sys.stderr)
        from .distributed import PeerLostError

        resume, saved = getattr(args, "resume_command", None), getattr(args, "resume_checkpoint", None)
        if isinstance(e, PeerLostError) and resume and saved.exists():  # every rank left says it: rank 0 may be
            if getattr(args, "restart_note", None):  # the lost one; under --max-restarts torchrun starts it again
                # (unless the other's error was a NaN stop, which the restart would meet again: it stops at once)
                print(f"capsnet {args.command}{_rank_tag()}: torchrun restarts the run ({args.restart_note}), which "
                      f"resumes from the last checkpoint, or stops at once if the other process stopped on a NaN or "
                      f"infinite loss", file=sys.stderr)
            else:
                print(f"capsnet {args.command}{_rank_tag()}: {resume} continues from the last checkpoint",
                      file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        if getattr(args, "quiet_interrupt", False):  # under torchrun rank 0 says how to resume
            return 130
        if isinstance(e, WritesInterrupted):  # how many of its files a command wrote, and what to run
            args.interrupted_hint = str(e)
        resume, saved = getattr(args, "resume_command", None), getattr(args, "resume_checkpoint", None)
        if resume and not saved.exists():  # stopped before the first save: nothing to continue
            print(f"capsnet {args.command}: interrupted before the run saved anything ({saved} is not written "
                  f"yet); run the same command again to start it", file=sys.stderr)
            return 130
        hint = f"; {resume} continues from the last checkpoint" if resume else \
            f"; {args.interrupted_hint}" if getattr(args, "interrupted_hint", None) else ""
        print(f"capsnet {args.command}: interrupted{hint}", file=sys.stderr)
        return 130
    except RuntimeError as e:  # an allocation that failed (the CPU allocator's, CUDA's): one line with the fix
        from .predict import _out_of_memory

        if not _out_of_memory(e):
            raise
        said = str(e).strip().splitlines()[-1][:200] if str(e).strip() else type(e).__name__
        fix = ("lower --batch-size" + (" or --jobs" if args.command == "experiment" else "")
               if hasattr(args, "batch_size") else "give fewer or smaller inputs")  # figures, generate, export, viz
        print(f"capsnet {args.command}{_rank_tag()}: error: out of memory ({said}); {fix}, or free memory on the "
              f"device", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the output went to a reader that stopped (`capsnet eval ... | head`): not an error
        if AS_PROGRAM:  # so the interpreter's final flush is quiet (a caller's process keeps its stdout)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        return 141
    except OSError as e:  # a path the command cannot read or write (a file where a folder belongs, no permission)
        written = f"; {e.written}" if getattr(e, "written", None) else ""  # atomic_write_all's files before it
        print(f"capsnet {args.command}{_rank_tag()}: error: {_path_error(e, args)}{written}", file=sys.stderr)
        return 2

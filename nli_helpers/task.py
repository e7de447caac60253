"""The trainer command: parse flags into a `TrainConfig`, then `run.run_training` (load, train,
save). What a shell, papermill and the trainer image run.

    python -m nli_helpers.task --profile smoke
    python -m nli_helpers.task --profile full --job-dir gs://BUCKET/runs/1      # on a GPU
    python -m nli_helpers.task --help                                             # every field

Every flag comes from a `TrainConfig` field, with underscores or hyphens (`--batch_size` /
`--batch-size`); flags you leave out take the profile's defaults. It exits 0 with a whole run, 2
with one `error:` line, 130 after Ctrl-C, and 143 (128 + SIGTERM) when a SIGTERM stopped the run.
A `Platform` adds what the place that runs it knows: `nli_helpers.vertex.entry` is Vertex AI's.
"""

from __future__ import annotations

import argparse
import dataclasses
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn

from .config import PROFILE_DEFAULTS, NLIError, TrainConfig, make_config

if TYPE_CHECKING:
    from .run import RunStopped
    from .train import TrainCallback

ALIASES = {"bf16": ("precision", "bf16")}  # the old recipe's switch, kept as a shorthand
STOPPED_EXIT_CODE = 128 + signal.SIGTERM  # the shell's code for a process a SIGTERM ended


@dataclass(frozen=True)
class Platform:
    """What the place that runs the command adds to it; the defaults are a plain machine's."""

    # Defaults its environment gives (a job dir, a checkpoint dir, resuming), applied to the flags.
    configure: Callable[[TrainConfig], TrainConfig] = lambda cfg: cfg
    callbacks: Callable[[TrainConfig], list[TrainCallback]] = lambda cfg: []  # its observers
    # The exit code of a run a SIGTERM stopped, and what to print after it.
    stopped: Callable[[RunStopped], tuple[int, str]] = lambda e: (STOPPED_EXIT_CODE, "")
    # In the SIGTERM handler: exit at once (no checkpoint) instead of stopping at the next step.
    exit_on_sigterm: Callable[[], bool] = lambda: False


def whole_number(text: str) -> int:
    """An int flag's value; "16.0" is 16: Vertex AI tuning passes discrete values as doubles."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not value.is_integer():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number")
    return int(value)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, as every other error; not the 60-line usage
        self.exit(2, f"error: {message} (python -m nli_helpers.task --help lists every option)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m nli_helpers.task", description=__doc__.split("\n\n")[0],
        argument_default=argparse.SUPPRESS)
    for f in dataclasses.fields(TrainConfig):
        names = sorted({f"--{f.name}", f"--{f.name.replace('_', '-')}"})
        kind = TrainConfig.field_type(f.name)
        help_text = f.metadata["help"] + default_help(f.name, f.default)
        if kind is bool:
            parser.add_argument(*names, dest=f.name, action=argparse.BooleanOptionalAction,
                                help=help_text)
        else:
            parser.add_argument(*names, dest=f.name, type=whole_number if kind is int else kind,
                                choices=f.metadata.get("choices"), help=help_text,
                                metavar=f.name.upper())
    parser.add_argument("--bf16", dest="bf16", action="store_true",
                        help="shorthand for --precision bf16 (fails clearly where bf16 is "
                        "unsupported)")
    return parser


def default_help(name: str, default: object) -> str:
    """' (default: ...)' for --help: the profiles' values where they set the field, else its own.
    (A flag left out is absent, not defaulted: make_config fills it from the profile.)"""
    smoke, real, full = (PROFILE_DEFAULTS[k] for k in ("smoke", "smoke_real_data", "full"))
    if name == "data":  # its help says where smoke looks
        return ""
    parts = []
    if name in smoke:
        parts.append(f"smoke {real[name]} on MultiNLI, {smoke[name]} on the sample" if name in real
                     else f"smoke {smoke[name]}")
    if name in full:
        parts.append(f"full {full[name]}")
    if parts and (name not in smoke or name not in full) and default is not None:
        parts.append(f"else {default}")
    if not parts and (default is None or name == "profile"):
        return ""
    return f" (default: {', '.join(parts) or default})"


def config_from_args(argv: list[str] | None = None) -> TrainConfig:
    values = vars(build_parser().parse_args(argv))
    for flag, (name, value) in ALIASES.items():
        if values.pop(flag, False):
            values[name] = value
    return make_config(values.pop("profile", "smoke"), verbose=True, **values)


def main(argv: list[str] | None = None, platform: Platform = Platform(), *,
         as_command: bool = False) -> int:
    """The command: 0 with a whole result, 2 with one error: line, or a signal's documented code."""
    try:
        code = _run_command(argv, platform)
        if as_command:  # held until the interpreter can take it without a traceback (command)
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        return code
    except KeyboardInterrupt:  # at any point, torch's import included: one line, not a traceback
        print("interrupted: the newest complete checkpoint (if any) is intact; rerun with "
              "--resume auto", file=sys.stderr)
        return 130


def _run_command(argv: list[str] | None, platform: Platform) -> int:
    try:
        cfg = platform.configure(config_from_args(argv))  # --help and a bad flag stop here
        callbacks = platform.callbacks(cfg)
    except NLIError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    # Lazy, and the only lazy import here: torch loads after the flags, so --help answers at once.
    from .run import RunStopped, run_training

    try:
        run_training(cfg, callbacks=callbacks, exit_on_sigterm=platform.exit_on_sigterm)
    except RunStopped as e:
        code, note = platform.stopped(e)
        print(f"stopped: {e}; exiting {code}{note}", file=sys.stderr)
        return code
    except NLIError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def command(platform: Platform = Platform()) -> NoReturn:
    """Run `main` as the process's command, and exit with its code."""
    code = main(platform=platform, as_command=True)
    # The files are written: a Ctrl-C from here on, held since main returned, or while the
    # interpreter joins its threads, ends the process at once, not in KeyboardInterrupt's traceback.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    sys.exit(code)


if __name__ == "__main__":
    command()

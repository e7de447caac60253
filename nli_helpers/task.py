"""The trainer command: parse flags into a `TrainConfig`, then `run.run_training` (load, train,
save). What a shell, papermill and the trainer image run.

    python -m nli_helpers.task --profile smoke
    python -m nli_helpers.task --profile full --output_dir gs://BUCKET/runs/1   # on a GPU
    python -m nli_helpers.task --config runs/x/train_config.json --num_train_epochs 1
    python -m nli_helpers.task --help                                           # every field

Every flag is a `TrainConfig` field under Hugging Face's name (`--per_device_train_batch_size`,
also `--per-device-train-batch-size`); flags override `--config`, which overrides the profile.
It exits 0 with a whole run, 2 with one `error:` line, 130 after Ctrl-C, and 143 (128 + SIGTERM)
when a SIGTERM stopped the run.
A `Platform` adds what the place that runs it knows: `nli_helpers.vertex.entry` is Vertex AI's.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn

from .config import NLIError, TrainConfig, parse_args

if TYPE_CHECKING:
    from .tracking import TrainCallback
    from .train import Stopped

STOPPED_EXIT_CODE = 128 + signal.SIGTERM  # the shell's code for a process a SIGTERM ended


@dataclass(frozen=True)
class Platform:
    """What the place that runs the command adds to it; the defaults are a plain machine's."""

    # Defaults its environment gives (a job dir, a checkpoint dir, resuming), applied to the flags.
    configure: Callable[[TrainConfig], TrainConfig] = lambda cfg: cfg
    callbacks: Callable[[TrainConfig], list[TrainCallback]] = lambda cfg: []  # its observers
    # The exit code of a run a SIGTERM stopped, and what to print after it.
    stopped: Callable[[Stopped], tuple[int, str]] = lambda stopped: (STOPPED_EXIT_CODE, "")
    # In the SIGTERM handler: exit at once (no checkpoint) instead of stopping at the next step.
    exit_on_sigterm: Callable[[], bool] = lambda: False


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
              "--resume_from_checkpoint auto", file=sys.stderr)
        return 130


def _run_command(argv: list[str] | None, platform: Platform) -> int:
    try:
        cfg = platform.configure(parse_args(argv))  # --help and a bad flag stop here
        callbacks = platform.callbacks(cfg)
    except NLIError as e:
        return _error(e)
    # Lazy, and the only lazy import here: torch loads after the flags, so --help answers at once.
    from .run import RunFinished, run_training

    try:
        result = run_training(cfg, callbacks=callbacks, exit_on_sigterm=platform.exit_on_sigterm)
    except RunFinished as e:
        print(e)
        return 0
    except NLIError as e:
        return _error(e)
    if result.stopped:  # the one place a stopped run becomes an exit code
        code, note = platform.stopped(result.stopped)
        print(f"stopped: {result.stopped.message}; exiting {code}{note}", file=sys.stderr)
        return code
    return 0


def _error(e: NLIError) -> int:
    """One `error:` line; a library's text inside the message can hold newlines: indented, so
    nothing after it reads as a line of its own (a list of bad settings is indented already)."""
    first, *rest = str(e).splitlines() or [""]
    lines = [line if line.startswith(" ") else f"  {line}" for line in rest if line.strip()]
    print("\n".join([f"error: {first}", *lines]), file=sys.stderr)
    return 2


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

"""The trainer command: what a notebook, a shell and Vertex AI all run.

    python -m nli_helpers.task --profile smoke
    python -m nli_helpers.task --profile full --job-dir gs://BUCKET/runs/1      # on a GPU
    python -m nli_helpers.task --help                                             # every field

Every flag comes from a `TrainConfig` field, with underscores or hyphens (`--batch_size` /
`--batch-size`); flags you leave out take the profile's defaults.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

from .config import NLIError, TrainConfig, make_config

ALIASES = {"bf16": ("precision", "bf16")}  # the old recipe's switch, kept as a shorthand


def whole_number(text: str) -> int:
    """An int flag's value; "16.0" is 16: Vertex AI tuning passes discrete values as doubles."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not value.is_integer():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number")
    return int(value)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m nli_helpers.task", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter, argument_default=argparse.SUPPRESS)
    for f in dataclasses.fields(TrainConfig):
        names = sorted({f"--{f.name}", f"--{f.name.replace('_', '-')}"})
        kind = TrainConfig.field_type(f.name)
        help_text = f.metadata["help"]
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


def config_from_args(argv: list[str] | None = None) -> TrainConfig:
    values = vars(build_parser().parse_args(argv))
    for flag, (name, value) in ALIASES.items():
        if values.pop(flag, False):
            values[name] = value
    return make_config(values.pop("profile", "smoke"), verbose=True, **values)


def main(argv: list[str] | None = None) -> int:
    from .run import run_training  # torch and transformers load after the arguments pass
    from .train import Preempted, StoppedWithoutCheckpoint

    try:
        cfg = config_from_args(argv)
        result = run_training(cfg)
    except Preempted as e:  # an exit code Vertex AI retries; the restarted job resumes
        mark_preempted()
        print(f"preempted: {e}; exiting {e.exit_code}, an exit code Vertex AI retries",
              file=sys.stderr)
        return e.exit_code
    except StoppedWithoutCheckpoint as e:
        print(f"stopped: {e}; exiting {e.exit_code}", file=sys.stderr)
        return e.exit_code
    except NLIError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: the newest complete checkpoint (if any) is intact; rerun with "
              "--resume auto", file=sys.stderr)
        return 130
    return 0 if result.metrics else 1


def mark_preempted() -> None:
    """Tell `nli_helpers.launch` that this process stopped for a SIGTERM, not for an error."""
    folder = os.environ.get("NLI_PREEMPTED_MARKERS")
    if folder and os.path.isdir(folder):
        with open(os.path.join(folder, f"rank-{os.environ.get('RANK', '0')}"), "w") as marker:
            marker.write("preempted\n")


if __name__ == "__main__":
    sys.exit(main())

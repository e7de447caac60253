"""Check a hyperparameter-tuning search space before Vertex AI sees it (notebook 05 runs the job).

The space maps `TrainConfig` fields (the trainer's flags: Vertex AI passes each trial's values as
`--<parameter id>=<value>`) to the SDK's own parameter specs
(`google.cloud.aiplatform.hyperparameter_tuning`); one ConfigError names every problem at once:

    >>> space = {"learning_rate": hpt.DoubleParameterSpec(min=1e-5, max=5e-5, scale="log")}
    >>> validate_search_space(space, cfg)

What Vertex AI checks itself on create (a range's min below its max, discrete values in increasing
order) it refuses with its own message; this checks what only the trainer knows.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any

from google.cloud.aiplatform import hyperparameter_tuning as hpt

from nli_helpers.config import ConfigError, TrainConfig

# Fields a search may not vary: where the run writes, what it reports, how it is shown.
NOT_SEARCHABLE = ("profile", "output_dir", "checkpoint_dir", "resume_from_checkpoint",
                  "tuning_metric", "progress", "report_to", "data", "allow_cpu")
RANGES = (hpt.DoubleParameterSpec, hpt.IntegerParameterSpec)
# Which field types each spec fits.
FITS = {hpt.DoubleParameterSpec: (float,), hpt.IntegerParameterSpec: (int, float),
        hpt.DiscreteParameterSpec: (int, float), hpt.CategoricalParameterSpec: (str,)}


def validate_search_space(space: Mapping[str, Any], base: TrainConfig | None = None) -> None:
    """Raise one ConfigError naming every problem: unknown or unsearchable fields, specs of the
    wrong type, and values that would make an invalid TrainConfig (each range's ends and every
    listed value are checked)."""
    base = base or TrainConfig(profile="smoke")
    hints = typing.get_type_hints(TrainConfig)
    problems = [] if space else ["the search space is empty: name at least one TrainConfig field"]
    for name, spec in space.items():
        if name not in hints:
            problems.append(f"{name!r} is not a TrainConfig field (known: "
                            f"{', '.join(TrainConfig.field_names())})")
        elif name in NOT_SEARCHABLE:
            problems.append(f"{name!r} cannot be searched: it says where or how a run writes, "
                            "not how it trains")
        else:  # the field's type without its None: int for `int | None`
            kind = next((t for t in typing.get_args(hints[name]) if t is not type(None)),
                        hints[name])
            problems += [f"{name}: {p}" for p in _spec_problems(name, kind, spec, base)]
    if problems:
        raise ConfigError("invalid search space:\n  - " + "\n  - ".join(problems))


def _spec_problems(name: str, kind: type, spec, base: TrainConfig) -> list[str]:
    if kind not in FITS.get(type(spec), ()):
        return [f"a {type(spec).__name__} does not fit a {kind.__name__} field"]
    values = [spec.min, spec.max] if isinstance(spec, RANGES) else list(spec.values)
    if kind is int and any(float(v) != int(v) for v in values):
        return ["an int field: values must be whole numbers"]
    problems = []
    for value in values:
        try:
            dataclasses.replace(base, **{name: kind(value)})
        except ConfigError as err:
            problems.append(f"value {value!r}: {str(err).splitlines()[-1].strip(' -')}")
    return problems

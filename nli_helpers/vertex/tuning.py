"""Check a hyperparameter-tuning search space before Vertex AI sees it (notebook 05 runs the job).

The space maps `TrainConfig` fields to the SDK's own parameter specs
(`google.cloud.aiplatform.hyperparameter_tuning`); one ConfigError names every problem at once:

    >>> space = {"learning_rate": hpt.DoubleParameterSpec(min=1e-5, max=5e-5, scale="log")}
    >>> validate_search_space(space, cfg)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from google.cloud.aiplatform import hyperparameter_tuning as hpt

from nli_helpers.config import ConfigError, TrainConfig

# Fields a search may not vary: where the run writes, what it reports, how it is shown.
NOT_SEARCHABLE = ("profile", "job_dir", "checkpoint_dir", "resume", "tuning_metric", "progress",
                  "data", "allow_cpu")
FIELD_NAMES = set(TrainConfig.field_names())
SCALES = ("linear", "log", "reverse_log")
RANGES = (hpt.DoubleParameterSpec, hpt.IntegerParameterSpec)
# Which field types each spec fits.
FITS = {hpt.DoubleParameterSpec: (float,), hpt.IntegerParameterSpec: (int, float),
        hpt.DiscreteParameterSpec: (int, float), hpt.CategoricalParameterSpec: (str,)}


def validate_search_space(space: Mapping[str, Any], base: TrainConfig | None = None) -> None:
    """Raise one ConfigError naming every problem: unknown or unsearchable fields, specs of the
    wrong type, and values that would make an invalid TrainConfig (each range's ends and every
    listed value are checked)."""
    base = base or TrainConfig(profile="smoke")
    problems = []
    for name, spec in space.items():
        if name not in FIELD_NAMES:
            known = ", ".join(TrainConfig.field_names())
            problems.append(f"{name!r} is not a TrainConfig field (known: {known})")
        elif name in NOT_SEARCHABLE:
            problems.append(f"{name!r} cannot be searched: it says where or how a run writes, "
                            "not how it trains")
        else:
            problems += [f"{name}: {p}" for p in _spec_problems(name, spec, base)]
    if not space:
        problems.append("the search space is empty: name at least one TrainConfig field")
    if problems:
        raise ConfigError("invalid search space:\n  - " + "\n  - ".join(problems))


def _spec_problems(name: str, spec, base: TrainConfig) -> list[str]:
    kind = TrainConfig.field_type(name)
    if type(spec) not in FITS or kind not in FITS[type(spec)]:
        return [f"a {type(spec).__name__} does not fit a {kind.__name__} field"]
    if isinstance(spec, RANGES):
        if spec.scale not in SCALES:
            return [f"scale {spec.scale!r} is unknown; use one of {', '.join(SCALES)}"]
        if not spec.min < spec.max:
            return [f"min {spec.min} must be below max {spec.max}"]
        if spec.scale != "linear" and spec.min <= 0:
            return [f"a {spec.scale} scale needs min > 0 (got {spec.min})"]
    elif not spec.values:
        return ["no values to choose from"]
    elif isinstance(spec, hpt.DiscreteParameterSpec) and (repeated := _close_values(spec.values)):
        return [f"values {', '.join(map(repr, repeated))} repeat: Vertex AI wants distinct "
                "values, in increasing order and at least 1e-10 apart (StudySpec "
                "DiscreteValueSpec); list each value once"]
    elif isinstance(spec, hpt.DiscreteParameterSpec) and list(spec.values) != sorted(spec.values):
        return [f"values {list(spec.values)} are out of order: Vertex AI wants discrete values "
                f"in increasing order (StudySpec DiscreteValueSpec); pass {sorted(spec.values)}"]
    elif (isinstance(spec, hpt.CategoricalParameterSpec)
          and len(set(spec.values)) < len(spec.values)):
        repeated = sorted({v for v in spec.values if list(spec.values).count(v) > 1})
        return [f"values {repeated} repeat: list each category once"]
    values = [spec.min, spec.max] if isinstance(spec, RANGES) else list(spec.values)
    if kind is int and any(float(v) != int(v) for v in values):
        return [f"{kind.__name__} field: values must be whole numbers"]
    problems = []
    for value in values:
        try:
            dataclasses.replace(base, **{name: kind(value)})
        except ConfigError as err:
            problems.append(f"value {value!r}: {str(err).splitlines()[-1].strip(' -')}")
    return problems


def _close_values(values: Sequence[float]) -> list[float]:
    """The values of a discrete spec that repeat (closer than 1e-10 to a neighbour once sorted)."""
    ordered = sorted(float(v) for v in values)
    return sorted({b for a, b in zip(ordered, ordered[1:]) if b - a < 1e-10})

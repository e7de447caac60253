"""The machine catalogue for Vertex AI training: which GPUs a machine takes, what an hour costs.

    >>> accelerator_problem("g2-standard-8", "NVIDIA_TESLA_T4", 1)     # None when the pair is valid
    'g2-standard-8 comes with 1 x NVIDIA_L4 attached; use accelerator_type="NVIDIA_L4", ...'
    >>> print(estimate_cost("n1-standard-8", "NVIDIA_TESLA_T4", 1, replica_count=1, hours=2))
    about $1.68 = (n1-standard-8 $0.4370/h + 1 x NVIDIA_TESLA_T4 $0.4025/h) x 1 replica x 2 h ...
    >>> print(estimate_job_cost(worker_pool_specs, hours=2))     # every pool of a job, summed

The prices are approximate on-demand list prices of Vertex AI custom training in us-central1
(USD per hour), transcribed from PRICE_SOURCE as of PRICE_TABLE_DATE; the A3 rows come from
A3_PRICE_SOURCE. Spot VMs, other regions and discounts differ: check the page before relying on
a number.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from nli_helpers.config import NLIError

PRICE_SOURCE = ("https://cloud.google.com/vertex-ai/pricing#custom-trained_models "
                "(Training: machine types, accelerators)")
PRICE_REGION = "us-central1"
PRICE_TABLE_DATE = "2025-06 (transcribed; not re-checked on 2026-11-22)"

# USD per hour per replica for the VM itself (vCPUs and memory; GPUs are priced below).
MACHINE_PRICES_PER_HOUR: dict[str, float] = {
    "n1-standard-4": 0.2185, "n1-standard-8": 0.4370, "n1-standard-16": 0.8740,
    "n1-standard-32": 1.7480, "n1-highmem-8": 0.5442, "n1-highmem-16": 1.0883,
    "n1-highcpu-16": 0.6518,  # Reduction Server machine: Compute Engine $0.5668/h x 1.15, as for n1
    "g2-standard-4": 0.1685, "g2-standard-8": 0.3370,
    "a2-highgpu-1g": 0.8504, "a2-highgpu-2g": 1.7008, "a2-highgpu-4g": 3.4016,
    "a2-highgpu-8g": 6.8032,
    # A3: the price includes its NVIDIA_H100_80GB GPUs (Compute Engine sells them together).
    "a3-highgpu-1g": 12.6260, "a3-highgpu-2g": 25.2520, "a3-highgpu-4g": 50.5040,
    "a3-highgpu-8g": 101.7635,
}
# Compute Engine's price x 1.15, the markup the N1 and A2 rows show (A100: $2.934 x 1.15 = $3.3741).
A3_PRICE_SOURCE = ("Compute Engine on-demand list prices, us-central1, from the Cloud Billing "
                   "catalog as read 2026-09 (a3-highgpu-1g $10.98/h, 2g and 4g taken as 2x and 4x "
                   "that, a3-highgpu-8g $88.49/h) x 1.15 (Vertex AI training markup); not read "
                   "from the Vertex AI pricing page: check "
                   "https://cloud.google.com/vertex-ai/pricing")
PRICED_WITH_MACHINE = {"NVIDIA_H100_80GB"}

# USD per hour per GPU.
ACCELERATOR_PRICES_PER_HOUR: dict[str, float] = {
    "NVIDIA_TESLA_T4": 0.4025, "NVIDIA_TESLA_P4": 0.6900, "NVIDIA_TESLA_P100": 1.6790,
    "NVIDIA_TESLA_V100": 2.8520, "NVIDIA_L4": 0.6440, "NVIDIA_TESLA_A100": 3.3741,
    "NVIDIA_A100_80GB": 4.5173,
}

# Accelerator-optimized machines come with their GPUs (https://cloud.google.com/compute/docs/gpus):
# (name pattern, GPU, count, or None to read it from the "-<N>g" suffix).
ATTACHED_GPUS: list[tuple[str, str, int | None]] = [
    (r"a2-(highgpu|megagpu)-\d+g", "NVIDIA_TESLA_A100", None),
    (r"a2-ultragpu-\d+g", "NVIDIA_A100_80GB", None),
    (r"a3-highgpu-\d+g", "NVIDIA_H100_80GB", None),
    (r"a3-megagpu-\d+g", "NVIDIA_H100_MEGA_80GB", None),
    (r"a3-ultragpu-\d+g", "NVIDIA_H200_141GB", None),
    (r"a4-highgpu-\d+g", "NVIDIA_B200", None),
    (r"g2-standard-(4|8|12|16|32)", "NVIDIA_L4", 1),
    (r"g2-standard-24", "NVIDIA_L4", 2),
    (r"g2-standard-48", "NVIDIA_L4", 4),
    (r"g2-standard-96", "NVIDIA_L4", 8),
    # G4, NVIDIA RTX PRO 6000 (Blackwell): Vertex AI's "Configure compute resources for custom
    # training" lists g4-standard-48/-96/-192/-384 with 1/2/4/8 GPUs.
    (r"g4-standard-48", "NVIDIA_RTX_PRO_6000", 1),
    (r"g4-standard-96", "NVIDIA_RTX_PRO_6000", 2),
    (r"g4-standard-192", "NVIDIA_RTX_PRO_6000", 4),
    (r"g4-standard-384", "NVIDIA_RTX_PRO_6000", 8),
]
# N1 machines take a GPU in these counts (https://cloud.google.com/compute/docs/gpus, N1 section,
# transcribed from memory, not re-read). The page also caps an N1's vCPUs and memory per GPU count;
# those caps are not checked here: unverified numbers would refuse sound jobs.
N1_GPU_COUNTS: dict[str, tuple[int, ...]] = {
    "NVIDIA_TESLA_T4": (1, 2, 4), "NVIDIA_TESLA_P4": (1, 2, 4), "NVIDIA_TESLA_P100": (1, 2, 4),
    "NVIDIA_TESLA_V100": (1, 2, 4, 8),
}


class PricingError(NLIError):
    """A machine or accelerator has no price in the table."""


def attached_gpus(machine_type: str) -> tuple[str, int] | None:
    """(GPU type, count) an accelerator-optimized machine comes with, or None for other families."""
    for pattern, gpu, count in ATTACHED_GPUS:
        if re.fullmatch(pattern, machine_type):
            return gpu, count if count is not None else int(re.search(r"-(\d+)g$", machine_type)[1])
    return None


def accelerator_problem(machine_type: str, accelerator_type: str | None,
                        accelerator_count: int) -> str | None:
    """None when the machine can carry this accelerator, else a message saying what would work."""
    attached = attached_gpus(machine_type)
    if attached:
        gpu, count = attached
        if (accelerator_type, accelerator_count) != (gpu, count):
            return (f"{machine_type} comes with {count} x {gpu} attached; use "
                    f"accelerator_type=\"{gpu}\", accelerator_count={count}")
        return None
    if not accelerator_type:
        return None if accelerator_count == 0 else (
            f"accelerator_count={accelerator_count} without an accelerator_type")
    if not machine_type.startswith("n1-"):
        return (f"{machine_type} cannot take a {accelerator_type}: GPUs attach to n1-* machines "
                "(T4, P4, P100, V100) or come with a2-* (A100), a3-* (H100/H200), a4-* (B200), "
                "g2-* (L4) and g4-* (RTX PRO 6000) machines")
    if accelerator_type not in N1_GPU_COUNTS:
        return (f"{accelerator_type} does not attach to {machine_type}; n1-* machines take "
                f"{', '.join(N1_GPU_COUNTS)}")
    if accelerator_count not in N1_GPU_COUNTS[accelerator_type]:
        return (f"{accelerator_type} attaches to n1-* machines in counts of "
                f"{', '.join(map(str, N1_GPU_COUNTS[accelerator_type]))}, not {accelerator_count}")
    return None


@dataclass(frozen=True)
class CostEstimate:
    machine_type: str
    machine_per_hour: float
    accelerator_type: str | None
    accelerator_count: int
    accelerator_per_hour: float
    replica_count: int
    hours: float

    @property
    def per_hour(self) -> float:
        """USD per hour for the whole job (every replica)."""
        gpus = self.accelerator_count * self.accelerator_per_hour
        return (self.machine_per_hour + gpus) * self.replica_count

    @property
    def total(self) -> float:
        return self.per_hour * self.hours

    @property
    def sources(self) -> str:
        a3 = f"; A3 rows: {A3_PRICE_SOURCE}" if self.machine_type.startswith("a3-") else ""
        return (f"approximate on-demand list prices in {PRICE_REGION} as of {PRICE_TABLE_DATE}; "
                f"Spot VMs cost less, other regions differ: check {PRICE_SOURCE}{a3}")

    def __str__(self) -> str:
        replicas = f"{self.replica_count} replica{'s' if self.replica_count != 1 else ''}"
        return (f"about ${self.total:.2f} = ({self.machine_type} ${self.machine_per_hour:.4f}/h"
                f"{gpu_text(self)}) x {replicas} x {self.hours:g} h; {self.sources}")


def gpu_text(est: CostEstimate) -> str:
    """' + 2 x NVIDIA_TESLA_T4 $0.4025/h', or the GPUs a machine's price includes, or ''."""
    if not est.accelerator_type:
        return ""
    if est.accelerator_type in PRICED_WITH_MACHINE:
        return f" incl. {est.accelerator_count} x {est.accelerator_type}"
    return f" + {est.accelerator_count} x {est.accelerator_type} ${est.accelerator_per_hour:.4f}/h"


def estimate_cost(machine_type: str, accelerator_type: str | None = None,
                  accelerator_count: int = 0, replica_count: int = 1,
                  hours: float = 1.0) -> CostEstimate:
    """Approximate cost of `hours` of training on `replica_count` machines, each with its GPUs."""
    if hours < 0 or replica_count < 1:
        raise PricingError(f"hours={hours} must be >= 0 and replica_count={replica_count} >= 1")
    if machine_type not in MACHINE_PRICES_PER_HOUR:
        raise PricingError(f"no price for machine type {machine_type!r} in the table "
                           f"({PRICE_TABLE_DATE}); it knows {', '.join(MACHINE_PRICES_PER_HOUR)}. "
                           f"Look it up at {PRICE_SOURCE}")
    gpu_price = 0.0
    if accelerator_type and accelerator_count and accelerator_type not in PRICED_WITH_MACHINE:
        if accelerator_type not in ACCELERATOR_PRICES_PER_HOUR:
            known = ", ".join(ACCELERATOR_PRICES_PER_HOUR)
            raise PricingError(f"no price for accelerator {accelerator_type!r} in the table "
                               f"({PRICE_TABLE_DATE}); it knows {known}. "
                               f"Look it up at {PRICE_SOURCE}")
        gpu_price = ACCELERATOR_PRICES_PER_HOUR[accelerator_type]
    return CostEstimate(machine_type, MACHINE_PRICES_PER_HOUR[machine_type], accelerator_type,
                        accelerator_count if accelerator_type else 0, gpu_price, replica_count,
                        hours)


POOL_ROLES = ("chief", "workers", "reduction server", "evaluators")  # Vertex's workerpool0..3


@dataclass(frozen=True)
class JobCostEstimate:
    """The cost of a whole job: one `CostEstimate` per worker pool, summed."""

    pools: tuple[tuple[str, CostEstimate], ...]

    @property
    def per_hour(self) -> float:
        return sum(est.per_hour for _, est in self.pools)

    @property
    def total(self) -> float:
        return sum(est.total for _, est in self.pools)

    def __str__(self) -> str:
        hours = self.pools[0][1].hours
        lines = [f"about ${self.total:.2f} = ${self.per_hour:.4f}/h x {hours:g} h, "
                 "over every pool:"]
        for name, est in self.pools:
            lines.append(f"  {name}: {est.replica_count} x ({est.machine_type} "
                         f"${est.machine_per_hour:.4f}/h{gpu_text(est)}) = ${est.per_hour:.4f}/h")
        lines.append(max((est.sources for _, est in self.pools), key=len))
        return "\n".join(lines)


def estimate_job_cost(worker_pool_specs: list[dict], hours: float = 1.0) -> JobCostEstimate:
    """Price every worker pool of a job (chief, workers, reduction server) for `hours`."""
    parts = []
    for i, pool in enumerate(worker_pool_specs):
        spec = pool.get("machine_spec", {})
        if not pool.get("replica_count"):
            continue
        try:
            est = estimate_cost(spec["machine_type"], spec.get("accelerator_type"),
                                spec.get("accelerator_count", 0),
                                replica_count=pool["replica_count"], hours=hours)
        except PricingError as err:
            raise PricingError(f"workerpool{i} ({POOL_ROLES[i]}): {err}") from err
        parts.append((f"workerpool{i} ({POOL_ROLES[i]})", est))
    if not parts:
        raise PricingError("no worker pool with replicas to price")
    return JobCostEstimate(tuple(parts))


# Online and batch prediction, USD per node-hour in us-central1, for the machines notebook 07
# offers. Not read from the Vertex AI pricing page itself (the copies this project can read stop
# before its prediction tables): quoted by a third-party cost plan that fetched the page on
# 2026-09-29. Check the page before relying on a number.
PREDICTION_PRICES_PER_HOUR: dict[str, float] = {"e2-standard-2": 0.0770564, "n1-standard-2": 0.1095}
PREDICTION_PRICE_SOURCE = ("list price, us-central1, as quoted 2026-09-29 and not re-checked: "
                           "https://cloud.google.com/vertex-ai/pricing")


def prediction_hourly_price(machine_type: str) -> float:
    """USD per node-hour of a prediction machine (an endpoint, or a batch job's replica)."""
    if machine_type not in PREDICTION_PRICES_PER_HOUR:
        raise PricingError(f"no prediction price for machine type {machine_type!r}; the table "
                           f"knows {', '.join(PREDICTION_PRICES_PER_HOUR)}. Look it up at "
                           "https://cloud.google.com/vertex-ai/pricing")
    return PREDICTION_PRICES_PER_HOUR[machine_type]

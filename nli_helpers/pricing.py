"""The machine catalogue for Vertex AI training: which GPU each machine type carries, and what an hour costs.

Two small tables that `nli_helpers.vertex` checks a job against before it spends money:

    >>> accelerator_problem("g2-standard-8", "NVIDIA_TESLA_T4", 1)     # None when the pair is valid
    'g2-standard-8 comes with 1 x NVIDIA_L4 attached; use accelerator_type="NVIDIA_L4", accelerator_count=1'
    >>> print(estimate_cost("n1-standard-8", "NVIDIA_TESLA_T4", 1, replica_count=1, hours=2))
    about $1.68 = (n1-standard-8 $0.4370/h + 1 x NVIDIA_TESLA_T4 $0.4025/h) x 1 replica x 2 h ...

The prices are APPROXIMATE on-demand list prices of Vertex AI custom training in us-central1, in USD per
hour, transcribed from the pricing page (PRICE_SOURCE) as it stood in mid-2025 and NOT re-checked since:
the build machines cannot reach Google Cloud. Other regions, Spot VMs and committed-use discounts all
differ. Check PRICE_SOURCE (or the Cloud Billing SKU list) before relying on a number.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from nli_helpers.config import NLIError

PRICE_SOURCE = "https://cloud.google.com/vertex-ai/pricing#custom-trained_models (Training: machine types, accelerators)"
PRICE_REGION = "us-central1"
PRICE_TABLE_DATE = "2025-06 (transcribed; not re-checked on 2026-11-22)"

# USD per hour per replica for the VM itself (vCPUs and memory; the GPU is priced separately below).
MACHINE_PRICES_PER_HOUR: dict[str, float] = {
    "n1-standard-4": 0.2185,
    "n1-standard-8": 0.4370,
    "n1-standard-16": 0.8740,
    "n1-standard-32": 1.7480,
    "n1-highmem-8": 0.5442,
    "n1-highmem-16": 1.0883,
    "n1-highcpu-16": 0.6518,  # Reduction Server machine: Compute Engine $0.5668/h x 1.15, as for the n1 rows above
    "g2-standard-4": 0.1685,
    "g2-standard-8": 0.3370,
    "a2-highgpu-1g": 0.8504,
    "a2-highgpu-2g": 1.7008,
    "a2-highgpu-4g": 3.4016,
    "a2-highgpu-8g": 6.8032,
}

# USD per hour per GPU.
ACCELERATOR_PRICES_PER_HOUR: dict[str, float] = {
    "NVIDIA_TESLA_T4": 0.4025,
    "NVIDIA_TESLA_P4": 0.6900,
    "NVIDIA_TESLA_P100": 1.6790,
    "NVIDIA_TESLA_V100": 2.8520,
    "NVIDIA_L4": 0.6440,
    "NVIDIA_TESLA_A100": 3.3741,
    "NVIDIA_A100_80GB": 4.5173,
}

# Accelerator-optimized families come with their GPUs attached: (name pattern, GPU type, count or None to
# read the count from the "-<N>g" suffix). From Compute Engine's "GPU machine types" page.
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
]
# N1 machines take a GPU you choose: the allowed counts per GPU type.
N1_GPU_COUNTS: dict[str, tuple[int, ...]] = {
    "NVIDIA_TESLA_T4": (1, 2, 4),
    "NVIDIA_TESLA_P4": (1, 2, 4),
    "NVIDIA_TESLA_P100": (1, 2, 4),
    "NVIDIA_TESLA_V100": (1, 2, 4, 8),
}


class PricingError(NLIError):
    """A machine or accelerator has no price in the table."""


def attached_gpus(machine_type: str) -> tuple[str, int] | None:
    """(GPU type, count) that an accelerator-optimized machine type comes with, or None for other families."""
    for pattern, gpu, count in ATTACHED_GPUS:
        if re.fullmatch(pattern, machine_type):
            return gpu, count if count is not None else int(re.search(r"-(\d+)g$", machine_type).group(1))
    return None


def accelerator_problem(machine_type: str, accelerator_type: str | None, accelerator_count: int) -> str | None:
    """None when the machine can carry this accelerator, else a message saying what would work."""
    attached = attached_gpus(machine_type)
    if attached:
        gpu, count = attached
        if (accelerator_type, accelerator_count) != (gpu, count):
            return (f"{machine_type} comes with {count} x {gpu} attached; use accelerator_type=\"{gpu}\", "
                    f"accelerator_count={count}")
        return None
    if not accelerator_type:
        return None if accelerator_count == 0 else f"accelerator_count={accelerator_count} without an accelerator_type"
    if not machine_type.startswith("n1-"):
        return (f"{machine_type} cannot take a {accelerator_type}: GPUs attach to n1-* machines (T4, P4, P100, "
                "V100) or come with a2-* (A100), a3-* (H100/H200), g2-* (L4) machines")
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
        return (self.machine_per_hour + self.accelerator_count * self.accelerator_per_hour) * self.replica_count

    @property
    def total(self) -> float:
        return self.per_hour * self.hours

    def __str__(self) -> str:
        gpu = (f" + {self.accelerator_count} x {self.accelerator_type} ${self.accelerator_per_hour:.4f}/h"
               if self.accelerator_type else "")
        replicas = f"{self.replica_count} replica{'s' if self.replica_count != 1 else ''}"
        return (f"about ${self.total:.2f} = ({self.machine_type} ${self.machine_per_hour:.4f}/h{gpu}) x {replicas} "
                f"x {self.hours:g} h; approximate on-demand list prices in {PRICE_REGION} as of {PRICE_TABLE_DATE}; "
                f"Spot VMs cost less, other regions differ: check {PRICE_SOURCE}")


def estimate_cost(machine_type: str, accelerator_type: str | None = None, accelerator_count: int = 0,
                  replica_count: int = 1, hours: float = 1.0) -> CostEstimate:
    """Approximate cost of `hours` of training on `replica_count` machines, each with its GPUs."""
    if hours < 0 or replica_count < 1:
        raise PricingError(f"hours={hours} must be >= 0 and replica_count={replica_count} >= 1")
    if machine_type not in MACHINE_PRICES_PER_HOUR:
        raise PricingError(f"no price for machine type {machine_type!r} in the table ({PRICE_TABLE_DATE}); it "
                           f"knows {', '.join(MACHINE_PRICES_PER_HOUR)}. Look it up at {PRICE_SOURCE}")
    gpu_price = 0.0
    if accelerator_type and accelerator_count:
        if accelerator_type not in ACCELERATOR_PRICES_PER_HOUR:
            raise PricingError(f"no price for accelerator {accelerator_type!r} in the table ({PRICE_TABLE_DATE}); "
                               f"it knows {', '.join(ACCELERATOR_PRICES_PER_HOUR)}. Look it up at {PRICE_SOURCE}")
        gpu_price = ACCELERATOR_PRICES_PER_HOUR[accelerator_type]
    return CostEstimate(machine_type, MACHINE_PRICES_PER_HOUR[machine_type], accelerator_type,
                        accelerator_count if accelerator_type else 0, gpu_price, replica_count, hours)

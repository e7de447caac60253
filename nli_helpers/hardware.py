"""The hardware a run gets: which precision it trains in, and whether the GPU it needs is really there.

    >>> resolve_precision("auto", torch.device("cuda"))   # bf16 on an A100/L4/H100, fp16 on a T4/V100
    >>> check_accelerator(cfg)                             # before loading anything: no GPU, no `full` run

The precision rule, the same in the package and in notebook 02: bf16 autocast on GPUs of compute capability
8.0 or newer and on CPUs with AVX512-BF16/AMX; fp16 with loss scaling on older GPUs; fp32 on other CPUs.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import torch

from .config import ConfigError, NLIError, TrainConfig

BF16_MIN_CAPABILITY = (8, 0)  # Ampere (sm80) and newer compute in bf16; older GPUs only emulate it


def cpu_supports_bf16() -> bool:
    return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def native_bf16(device: torch.device) -> bool:
    """bf16 in hardware: a GPU of compute capability 8.0 or newer, or a CPU with AVX512-BF16/AMX.

    Not `torch.cuda.is_bf16_supported()`: by default it also answers True for pre-Ampere GPUs (T4, V100),
    where bf16 is emulated and several times slower than fp16 (`including_emulation=True`).
    """
    if device.type == "cuda":
        return torch.cuda.get_device_capability(device) >= BF16_MIN_CAPABILITY
    return cpu_supports_bf16()


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return f"{torch.cuda.get_device_name(device)} (compute capability {major}.{minor})"
    return f"CPU ({os.cpu_count()} cores)"


def resolve_precision(requested: str, device: torch.device) -> str:
    """Turn `auto` into fp32/bf16/fp16 for this device; refuse what the hardware cannot do (well).

    The rule: bf16 autocast on GPUs from compute capability 8.0 (A100, L4, H100) and on CPUs with
    AVX512-BF16/AMX; fp16 with loss scaling on older GPUs (T4, V100); fp32 on other CPUs.
    """
    cuda = device.type == "cuda"
    bf16_ok = native_bf16(device)
    if requested == "auto":
        return "bf16" if bf16_ok else ("fp16" if cuda else "fp32")
    if requested == "bf16" and not bf16_ok:
        where = (f"{device_name(device)}: bf16 runs natively from compute capability 8.0 (Ampere); here it would "
                 "be emulated, several times slower than fp16" if cuda else "this CPU (it lacks AVX512-BF16/AMX)")
        raise ConfigError(f"precision=bf16 is not supported on {where}; use --precision auto"
                          + (" (fp16 with loss scaling here) or fp16" if cuda else " or fp32"))
    if requested == "fp16" and not cuda:
        raise ConfigError("precision=fp16 needs a CUDA GPU; on a CPU use --precision auto (bf16 where "
                          "supported) or fp32")
    return requested


def autocast(precision: str, device: torch.device):
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16 if precision == "bf16" else torch.float16)


ALLOW_CPU_ENV = "NLI_ALLOW_CPU"  # = --allow-cpu, for environments that set it for every run (a local stand-in)


class NoGPUError(NLIError):
    """A run that needs a CUDA GPU found none."""


def vertex_gpus(cluster_spec: str | None = None) -> tuple[str, int] | None:
    """(GPU type, count) that this Vertex AI replica's worker pool asked for, from CLUSTER_SPEC; None elsewhere.

    Vertex AI puts the job's spec, worker pools included, in CLUSTER_SPEC["job"] (a JSON string).
    """
    spec = os.environ.get("CLUSTER_SPEC") if cluster_spec is None else cluster_spec
    if not spec:
        return None
    try:
        parsed = json.loads(spec)
        job = json.loads(parsed["job"]) if isinstance(parsed.get("job"), str) else parsed.get("job") or {}
        pools = job.get("worker_pool_specs") or job.get("workerPoolSpecs") or []
        index = int(str(parsed["task"]["type"]).removeprefix("workerpool"))
        machine = pools[index].get("machine_spec") or pools[index].get("machineSpec") or {}
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return None
    count = int(machine.get("accelerator_count") or machine.get("acceleratorCount") or 0)
    gpu = machine.get("accelerator_type") or machine.get("acceleratorType")
    return (gpu if isinstance(gpu, str) else "GPU", count) if count else None


def why_no_cuda() -> str:
    """The likeliest reason torch sees no CUDA device."""
    if torch.version.cuda is None:
        return f"this torch is a CPU-only build ({torch.__version__})"
    if not any(Path("/dev").glob("nvidia[0-9]*")):
        return ("no NVIDIA device is visible to this process (no /dev/nvidia*; in a container: docker run "
                "--gpus all)")
    return (f"CUDA failed to initialise: is the NVIDIA driver older than this torch's CUDA {torch.version.cuda} "
            "needs, or not on LD_LIBRARY_PATH (Vertex mounts it under /usr/local/nvidia/lib64)? nvidia-smi shows "
            "the driver")


def gpu_kernel_problem(arch_list: list[str], capability: tuple[int, int]) -> str | None:
    """Why this torch has no kernels for a GPU of `capability`, or None. `arch_list` is torch.cuda.get_arch_list()
    (['sm_75', ..., 'compute_120']): a cubin for X.y runs on X.z, z >= y; PTX runs on any newer GPU."""
    sass = [(int(a[3:-1]), int(a[-1])) for a in arch_list if a.startswith("sm_") and a[3:].isdigit()]
    ptx = [(int(a[8:-1]), int(a[-1])) for a in arch_list if a.startswith("compute_") and a[8:].isdigit()]
    if any(m == capability[0] and n <= capability[1] for m, n in sass) or any(p <= capability for p in ptx):
        return None
    return (f"this torch ({torch.__version__}, CUDA {torch.version.cuda}) has kernels for {', '.join(arch_list)} "
            f"but the GPU is compute capability {capability[0]}.{capability[1]}: install a torch CUDA build that "
            "covers it (docker/README.md, the table of builds)")


def check_accelerator(cfg: TrainConfig, *, cuda_available: bool | None = None) -> None:
    """Stop before anything is loaded when a run that needs a GPU has none: the `full` profile (roberta-base on
    393k pairs would take days on a CPU), or a Vertex AI replica that asked for GPUs and cannot use them."""
    if cfg.allow_cpu or os.environ.get(ALLOW_CPU_ENV) == "1":
        return
    cuda = torch.cuda.is_available() if cuda_available is None else cuda_available
    if cuda:
        problem = cuda_available is None and gpu_kernel_problem(torch.cuda.get_arch_list(),
                                                                torch.cuda.get_device_capability())
        if problem:
            raise NoGPUError(problem)
        return
    asked = vertex_gpus()
    if asked:
        raise NoGPUError(f"this Vertex AI replica asked for {asked[1]} x {asked[0]}, but torch sees no CUDA GPU: "
                         f"{why_no_cuda()}. The job would train on the CPU at the GPU's price: fix the image "
                         "(docker/README.md) or the accelerator spec, or pass "
                         "--allow-cpu to run on the CPU anyway")
    if cfg.profile == "full":
        raise NoGPUError(f"profile full trains roberta-base on 393k pairs, which needs a CUDA GPU, and there is "
                         f"none here: {why_no_cuda()}. Run it on a GPU machine (a Workbench GPU instance, or a "
                         "Vertex AI job: notebook 04), use --profile smoke on this CPU, or pass --allow-cpu to "
                         "train the full recipe on the CPU anyway (days)")

"""Processes, ranks and devices: torch.distributed from torchrun's environment, the precision a
device trains in, and whether the GPU a run needs is usable.

    >>> info = init_distributed()          # DistInfo(rank, local_rank, world_size)
    >>> device = device_for(info)
    >>> precision = resolve_precision("auto", device)   # bf16, fp16 or fp32

Without torchrun's RANK and LOCAL_RANK, `init_distributed` returns a single-process `DistInfo`.
On Vertex AI, RANK and WORLD_SIZE count nodes, not processes: `nli_helpers.vertex.launch` runs
torchrun.
"""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from .config import ConfigError, NLIError, TrainConfig


class DistributedError(NLIError):
    """Rank 0 failed, so another rank stops too, with rank 0's message."""


@dataclass(frozen=True)
class DistInfo:
    """Who this process is. `world_size == 1` means plain single-process training."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


SINGLE_PROCESS = DistInfo()
# A gloo group beside NCCL for small CPU flags (the stop request): agreeing on them must not
# synchronise the GPU stream every step. Under gloo the default group serves.
_control_group = None


def init_distributed(timeout_minutes: float = 30.0) -> DistInfo:
    """Join the process group torchrun describes in the environment; single process otherwise."""
    if "RANK" not in os.environ or "LOCAL_RANK" not in os.environ:
        return DistInfo()
    info = DistInfo(int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]),
                    int(os.environ["WORLD_SIZE"]))
    if info.world_size == 1 or dist.is_initialized():
        return info
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(info.local_rank)
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(minutes=timeout_minutes))
    global _control_group
    _control_group = dist.new_group(backend="gloo") if cuda else None
    return info


def shutdown_distributed() -> None:
    global _control_group
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    _control_group = None


def device_for(info: DistInfo) -> torch.device:
    return torch.device(f"cuda:{info.local_rank}" if torch.cuda.is_available() else "cpu")


def all_reduce_sum(tensor: torch.Tensor, info: DistInfo) -> torch.Tensor:
    if info.enabled:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def wrap_ddp(model: torch.nn.Module, device: torch.device, info: DistInfo, cfg: TrainConfig) -> DDP:
    """DDP that spends the interconnect on gradients only: buckets are the gradients' own memory
    (no copy in and out), buffers are synced before each forward only where a checkpoint would save
    one (a running statistic; position ids are constants every rank builds itself; torch syncs
    them once at the start either way), buckets of
    `--ddp_bucket_cap_mb` (torch's 25 MB by default; Google's Reduction Server page recommends 64),
    and optionally gradients travel in bf16 (`torch.distributed.algorithms.ddp_comm_hooks`)."""
    saved = set(model.state_dict())
    drifting = any(name in saved for name, _ in model.named_buffers())
    # torch 2.13 names it forward_sync_buffers and deprecates broadcast_buffers; older torch, which
    # Workbench and Deep Learning VM images ship (pyproject allows >= 2.6), knows only the latter.
    sync = "forward_sync_buffers" if "forward_sync_buffers" in inspect.signature(DDP).parameters \
        else "broadcast_buffers"
    net = DDP(model, [info.local_rank] if device.type == "cuda" else None,
              gradient_as_bucket_view=True, bucket_cap_mb=cfg.ddp_bucket_cap_mb, **{sync: drifting})
    if cfg.ddp_bf16_compress:
        net.register_comm_hook(None, default_hooks.bf16_compress_hook)
    return net


def agree_after_step(stop: bool, main_says: bool, info: DistInfo) -> tuple[bool, bool]:
    """(`stop` on any rank, `main_says` on rank 0) on every rank, in one CPU all-reduce: a SIGTERM
    may reach one rank first, and a clock's decision (a timed checkpoint) is rank 0's alone, because
    every rank must act at the same step."""
    if not info.enabled:
        return stop, main_says
    votes = torch.tensor([int(stop), int(main_says and info.is_main)], dtype=torch.int32)
    dist.all_reduce(votes, op=dist.ReduceOp.SUM, group=_control_group)
    return bool(votes[0]), bool(votes[1])


def broadcast_from_main(obj, info: DistInfo):
    """Rank 0's `obj` on every rank (over the CPU control group)."""
    if not info.enabled:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0, group=_control_group)
    return box[0]


def on_main_process(fn, info: DistInfo):
    """Run `fn` on rank 0 only and return its result there. A failure raises on every rank at once
    with rank 0's message, instead of leaving the others in a barrier until the timeout."""
    result, error = None, None
    if info.is_main:
        try:
            result = fn()
        except Exception as err:  # noqa: BLE001 - re-raised below, on every rank
            error = err
    failure = broadcast_from_main(None if error is None else f"{type(error).__name__}: {error}",
                                  info)
    if error is not None:
        raise error
    if failure is not None:
        raise DistributedError(f"rank 0 failed, so rank {info.rank} stops too: {failure}")
    return result


def all_gather_objects(obj, info: DistInfo) -> list:
    if not info.enabled:
        return [obj]
    out = [None] * info.world_size
    dist.all_gather_object(out, obj)
    return out


# -- devices: precision, and whether the GPU a run needs is usable --------------------------------
BF16_MIN_CAPABILITY = (8, 0)  # Ampere (sm80) and newer compute in bf16; older GPUs only emulate it


def native_bf16(device: torch.device) -> bool:
    """bf16 in hardware: a GPU of compute capability 8.0 or newer, or a CPU with AVX512-BF16/AMX.

    Not `torch.cuda.is_bf16_supported()`: by default it also says True for pre-Ampere GPUs (T4,
    V100), which emulate bf16 several times slower than fp16 (`including_emulation=True`).
    """
    if device.type == "cuda":
        return torch.cuda.get_device_capability(device) >= BF16_MIN_CAPABILITY
    return bool(torch.backends.mkldnn.is_available()
                and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return f"{torch.cuda.get_device_name(device)} (compute capability {major}.{minor})"
    return f"CPU ({os.cpu_count()} cores)"


def resolve_precision(requested: str, device: torch.device) -> str:
    """`auto` -> bf16 where the hardware has it (GPUs from A100/L4, CPUs with AVX512-BF16/AMX),
    fp16 with loss scaling on older GPUs, fp32 on other CPUs; refuse what the device cannot do."""
    cuda = device.type == "cuda"
    bf16_ok = native_bf16(device)
    if requested == "auto":
        return "bf16" if bf16_ok else ("fp16" if cuda else "fp32")
    if requested == "bf16" and not bf16_ok:
        where = (f"{device_name(device)}: bf16 runs natively from compute capability 8.0 "
                 "(Ampere); here it would be emulated, several times slower than fp16" if cuda
                 else "this CPU (it lacks AVX512-BF16/AMX)")
        raise ConfigError(f"precision=bf16 is not supported on {where}; use --precision auto"
                          + (" (fp16 with loss scaling here) or fp16" if cuda else " or fp32"))
    if requested == "fp16" and not cuda:
        raise ConfigError("precision=fp16 needs a CUDA GPU; on a CPU use --precision auto (bf16 "
                          "where supported) or fp32")
    return requested


def autocast(precision: str, device: torch.device) -> torch.autocast:
    """Mixed precision for bf16 and fp16; fp32 is autocast switched off (`enabled=False`)."""
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device.type, dtype=dtype, enabled=precision != "fp32")


ALLOW_CPU_ENV = "NLI_ALLOW_CPU"  # = --allow-cpu, for environments that set it for every run


class NoGPUError(NLIError):
    """A run that needs a CUDA GPU found none."""


def check_accelerator(cfg: TrainConfig, asked: str | None = None) -> None:
    """The GPU guard, before anything loads: a GPU-only option on a CPU; a GPU this torch has no
    kernels for (it would fail at the first step); no GPU where the run needs one: the reference
    recipe, or `asked`, the GPUs a Vertex AI replica's pool asked for (`vertex.entry`). --allow-cpu
    or NLI_ALLOW_CPU=1 lets the last two pass."""
    if cfg.ddp_bf16_compress and not torch.cuda.is_available():
        raise ConfigError("ddp_bf16_compress needs CUDA GPUs: torch's bf16 all-reduce hook runs on "
                          "NCCL only, and gloo on a CPU has none. Leave it off here (gradients "
                          "then travel in fp32)")
    if cfg.allow_cpu or os.environ.get(ALLOW_CPU_ENV) == "1":
        return
    if torch.cuda.is_available():
        problem = gpu_kernel_problem(torch.cuda.get_arch_list(), torch.cuda.get_device_capability())
        if problem:
            raise NoGPUError(problem)
    elif asked:
        raise NoGPUError(f"this Vertex AI replica asked for {asked}, but torch sees no CUDA GPU: "
                         f"{why_no_cuda()}. The job would train on the CPU at the GPU's price: fix "
                         "the image (docker/README.md) or the accelerator spec, or pass "
                         "--allow-cpu to run on the CPU anyway")
    elif cfg.reference_recipe:
        raise NoGPUError(f"profile full trains roberta-base on 393k pairs, which needs a CUDA GPU, "
                         f"and torch sees none here: {why_no_cuda()}. Run it on a GPU machine (a "
                         "Workbench GPU instance, or a Vertex AI job: notebook 04), use --profile "
                         "smoke on this CPU, or pass --allow-cpu to train the full recipe on the "
                         "CPU anyway (days)")


def why_no_cuda() -> str:
    if torch.version.cuda is None:
        return f"this torch is a CPU-only build ({torch.__version__})"
    if not any(Path("/dev").glob("nvidia[0-9]*")):
        return ("no NVIDIA device is visible to this process (no /dev/nvidia*; in a container: "
                "docker run --gpus all)")
    return (f"CUDA failed to initialise: is the NVIDIA driver older than this torch's CUDA "
            f"{torch.version.cuda} needs, or not on LD_LIBRARY_PATH (Vertex mounts it under "
            "/usr/local/nvidia/lib64)? nvidia-smi shows the driver")


def gpu_kernel_problem(arch_list: list[str], capability: tuple[int, int]) -> str | None:
    """Why this torch has no kernels for a GPU of `capability`, or None. `arch_list` is
    torch.cuda.get_arch_list(): a cubin for X.y runs on X.z, z >= y; PTX on any newer GPU."""
    def version(arch: str, prefix: str) -> tuple[int, int] | None:
        digits = arch.removeprefix(prefix)
        return (int(digits[:-1]), int(digits[-1])) if arch.startswith(prefix) and \
            digits.isdigit() else None

    if any((v := version(a, "sm_")) and v[0] == capability[0] and v[1] <= capability[1]
           or (v := version(a, "compute_")) and v <= capability for a in arch_list):
        return None
    return (f"this torch ({torch.__version__}, CUDA {torch.version.cuda}) has kernels for "
            f"{', '.join(arch_list)} but the GPU is compute capability "
            f"{capability[0]}.{capability[1]}: install a torch CUDA build that covers it "
            "(docker/README.md, the table of builds)")

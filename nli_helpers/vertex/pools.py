"""A Vertex AI custom job's worker pools, from a `TrainConfig` and a `Machine`: the chief, the
workers and a Reduction Server, each running the trainer (or the torchrun launcher) with the
config's args.

    >>> machine = Machine("g2-standard-8", "NVIDIA_L4", 1, replica_count=2)
    >>> pools = container_worker_pools(job_config("full"), machine, image_uri,
    ...                                reduction_server=ReductionServer(1))
    >>> pools_table(pools)                                           # one row per pool
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nli_helpers import storage
from nli_helpers.config import TrainConfig, check_profile, make_config, smoke_real_data
from nli_helpers.vertex.pricing import POOL_ROLES

from .errors import VertexError
from .images import local_torch_version, prebuilt_image_uri, registry_host
from .launch import ENTRY_MODULE

LAUNCH_MODULE = "nli_helpers.vertex.launch"  # reads CLUSTER_SPEC, starts torchrun on each replica
TASK_MODULE = ENTRY_MODULE  # the image's ENTRYPOINT: the trainer command with Vertex AI's side
# Reducers need network bandwidth, not memory, and a VM's bandwidth grows with its vCPUs. Vertex's
# distributed-training page: "We recommend that you use the n1-highcpu-16 machine type for
# Reduction Server nodes", from one of three multi-region copies of the image (us-, europe- and
# asia-docker.pkg.dev): "Choosing the multi-region closest to where you are performing serverless
# training might reduce latency."
REDUCTION_SERVER_IMAGE = "us-docker.pkg.dev/vertex-ai-restricted/training/reductionserver:latest"
REDUCTION_SERVER_MACHINE_TYPE = "n1-highcpu-16"
# A Spot job checkpoints this often unless its config says: a preempted VM is off 30 s after its
# notice, too soon to be sure of a last checkpoint (benchmarks/README.md weighs the interval).
SPOT_CHECKPOINT_EVERY_MINUTES = 10


def reduction_server_image(region: str = "us-central1") -> str:
    """Google's Reduction Server image from the multi-region nearest the job's region."""
    return REDUCTION_SERVER_IMAGE.replace("us-docker.pkg.dev", registry_host(region), 1)


@dataclass(frozen=True)
class Machine:
    """What each replica runs on, and how many replicas (the first is the chief)."""

    machine_type: str = "n1-standard-8"
    accelerator_type: str | None = "NVIDIA_TESLA_T4"
    accelerator_count: int = 1
    replica_count: int = 1

    def machine_spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = {"machine_type": self.machine_type}
        if self.accelerator_type and self.accelerator_count:
            spec.update(accelerator_type=self.accelerator_type,
                        accelerator_count=self.accelerator_count)
        return spec

    @property
    def has_gpu(self) -> bool:
        return bool(self.accelerator_type and self.accelerator_count)

    @property
    def processes(self) -> int:
        """Training processes: one per GPU (one per machine without GPUs), on every replica."""
        return self.replica_count * (self.accelerator_count if self.has_gpu else 1)

    @property
    def multi_process(self) -> bool:
        """More than one training process: the job must start through torchrun."""
        return self.replica_count > 1 or (self.has_gpu and self.accelerator_count > 1)


@dataclass(frozen=True)
class ReductionServer:
    """Workerpool2: reducers that aggregate the GPU nodes' NCCL all-reduce (Google's image, from the
    multi-region nearest `region` unless `image_uri` names one)."""

    replica_count: int = 1
    machine_type: str = REDUCTION_SERVER_MACHINE_TYPE
    image_uri: str | None = None
    region: str = "us-central1"

    def __post_init__(self) -> None:
        if self.image_uri is None:
            object.__setattr__(self, "image_uri", reduction_server_image(self.region))

    def worker_pool(self) -> dict:
        return {"machine_spec": {"machine_type": self.machine_type},
                "replica_count": self.replica_count,
                "container_spec": {"image_uri": self.image_uri}}


def job_config(profile: str = "smoke", *, verbose: bool = False, **overrides: Any) -> TrainConfig:
    """`make_config` for a job: the recipe is this argument, never this machine's hardware. On
    `smoke` the data is `mnli-subset` where this machine has MultiNLI, else the sample the image
    carries, never $NLI_REAL_DATA; `stage_data` then puts local data where the job can read it."""
    name = check_profile(profile)
    if name == "smoke" and not overrides.get("data"):
        overrides["data"] = smoke_real_data()
    return make_config(name, verbose=verbose, **overrides)


def stage_data(cfg: TrainConfig, bucket: str, folder: str | Path) -> TrainConfig:
    """`cfg` with its data where a Vertex job can read it: a local file or folder, or `mnli-subset`
    written out in `folder` as JSON Lines (the same splits), is uploaded to `bucket`/data/; gs://,
    a hub name and the sample (inside the image) stay as they are."""
    from nli_helpers.data import MNLI_SUBSET, write_mnli_subset  # lazy: data loads torch

    if cfg.data == MNLI_SUBSET:
        local = write_mnli_subset(Path(folder) / f"{MNLI_SUBSET}.jsonl")
    elif cfg.data and cfg.data != "sample" and not storage.is_gcs_uri(cfg.data) \
            and Path(cfg.data).expanduser().exists():
        local = Path(cfg.data).expanduser()
    else:
        return cfg
    uri = f"{bucket.rstrip('/')}/data/{local.name}"
    storage.upload(local, uri)
    print(f"data: uploaded {cfg.data} ({local.name}) to {uri}, where the job reads it")
    return dataclasses.replace(cfg, data=uri)


def job_args(cfg: TrainConfig) -> list[str]:
    """The trainer's arguments: no --job-dir (the trainer writes to AIP_MODEL_DIR), and
    --resume=auto unless the config names a checkpoint, because Vertex restarts a replica with
    the same command after maintenance or preemption and it must continue, not start over."""
    return dataclasses.replace(cfg, job_dir=None, resume=cfg.resume or "auto").to_cli_args()


def python_package_worker_pools(cfg: TrainConfig, machine: Machine, package_uri: str, *,
                                executor_image_uri: str | None = None, region: str = "us-central1",
                                reduction_server: ReductionServer | None = None) -> list[dict]:
    """Worker pools that pip-install the staged sdist on a prebuilt PyTorch image and run the
    trainer (preflight refuses this path: `images.prebuilt_image_problem`)."""
    image = executor_image_uri or prebuilt_image_uri(local_torch_version(), gpu=machine.has_gpu,
                                                     region=region)
    module, args = _entry(cfg, machine)
    code = {"executor_image_uri": image, "package_uris": [package_uri], "python_module": module,
            "args": args}
    return _pools(machine, "python_package_spec", code, reduction_server)


def container_worker_pools(cfg: TrainConfig, machine: Machine, image_uri: str, *,
                           reduction_server: ReductionServer | None = None) -> list[dict]:
    """Worker pools that run the trainer image, whose ENTRYPOINT is `python -m nli_helpers.task`."""
    module, args = _entry(cfg, machine)
    code = {"image_uri": image_uri, "args": args}
    if module == LAUNCH_MODULE:
        code = {"image_uri": image_uri, "command": ["python", "-m", LAUNCH_MODULE], "args": args}
    return _pools(machine, "container_spec", code, reduction_server)


def _entry(cfg: TrainConfig, machine: Machine) -> tuple[str, list[str]]:
    # Several processes start through torchrun: Vertex's RANK and WORLD_SIZE count nodes.
    if machine.multi_process:
        return LAUNCH_MODULE, ["--", *job_args(cfg)]
    return TASK_MODULE, job_args(cfg)


def _pools(machine: Machine, code_key: str, code: dict,
           reduction_server: ReductionServer | None) -> list[dict]:
    # Vertex wants exactly one replica in pool 0 (the chief); others go in pool 1, reducers in 2.
    pool = {"machine_spec": machine.machine_spec(), code_key: code}
    pools = [{**pool, "replica_count": 1}]
    if machine.replica_count > 1:
        pools.append({**pool, "replica_count": machine.replica_count - 1})
    if reduction_server is not None:
        if len(pools) < 2:
            raise VertexError("a Reduction Server reduces traffic between training nodes: set "
                              "replica_count >= 2 (a chief and at least one worker), or drop "
                              "reduction_server")
        pools.append(reduction_server.worker_pool())
    return pools


def pools_table(worker_pool_specs: list[dict]) -> list[dict]:
    """One row per worker pool (role, replicas, machine, GPUs, what it runs), for a look."""
    rows = []
    for i, pool in enumerate(worker_pool_specs):
        spec = pool.get("machine_spec", {})
        code = pool.get("python_package_spec") or pool.get("container_spec", {})
        runs = (code.get("python_module") or " ".join(code.get("command", []))
                or "(image entry point)")
        gpus = (f"{spec['accelerator_count']} x {spec['accelerator_type']}"
                if spec.get("accelerator_type") else "-")
        rows.append({"pool": f"workerpool{i}", "role": POOL_ROLES[i],
                     "replicas": pool.get("replica_count", 0), "machine": spec.get("machine_type"),
                     "gpus": gpus, "image": code.get("executor_image_uri") or code.get("image_uri"),
                     "runs": runs, "args": " ".join(code.get("args", []))})
    return rows


def spot_worker_pools(worker_pool_specs: list[dict]) -> list[dict]:
    """A copy of the pools for a Spot job: each training pool running the trainer (its args name
    --profile) also checkpoints every SPOT_CHECKPOINT_EVERY_MINUTES, unless its args set
    --checkpoint_every_minutes (0 included). Takes snake_case (SDK) and camelCase (REST) pools."""
    budget = f"--checkpoint_every_minutes={SPOT_CHECKPOINT_EVERY_MINUTES:g}"
    pools = copy.deepcopy(worker_pool_specs)
    for pool in pools[:2]:  # the chief and the workers, not reducers
        for key in ("container_spec", "python_package_spec", "containerSpec", "pythonPackageSpec"):
            args = pool.get(key, {}).get("args") or []
            flags = {a.split("=", 1)[0][2:].replace("-", "_") for a in args if a.startswith("--")}
            if "profile" in flags and "checkpoint_every_minutes" not in flags:
                pool[key]["args"] = [*args, budget]
    return pools


def training_replicas(worker_pool_specs: list[dict]) -> int:
    """How many replicas train (the chief and workers pools; not reducers or evaluators)."""
    return sum(int(pool.get("replica_count", 0)) for pool in worker_pool_specs[:2])

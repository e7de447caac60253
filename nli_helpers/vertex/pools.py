"""A Vertex AI custom job's worker pools, from a `TrainConfig` and a `Machine`: the chief, the
workers and a Reduction Server, each running the trainer (or the torchrun launcher) with the
config's args.

    >>> machine = Machine("g2-standard-8", "NVIDIA_L4", 1, replica_count=2)
    >>> pools = container_worker_pools(job_config("full"), machine, image_uri,
    ...                                reduction_server=ReductionServer(1))
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nli_helpers import files
from nli_helpers.config import TrainConfig, make_config, smoke_real_data

from .errors import VertexError
from .images import registry_host

LAUNCH_MODULE = "nli_helpers.vertex.launch"  # reads CLUSTER_SPEC, starts torchrun on each replica
# Reducers need network bandwidth, not memory, and a VM's bandwidth grows with its vCPUs. Vertex's
# distributed-training page: "We recommend that you use the n1-highcpu-16 machine type for
# Reduction Server nodes", from one of three multi-region copies of the image (us-, europe- and
# asia-docker.pkg.dev): "Choosing the multi-region closest to where you are performing serverless
# training might reduce latency."
REDUCTION_SERVER_IMAGE = "us-docker.pkg.dev/vertex-ai-restricted/training/reductionserver:latest"
REDUCTION_SERVER_MACHINE_TYPE = "n1-highcpu-16"
REDUCTION_SERVER_BUCKET_MB = 64  # DDP's bucket_cap_mb beside reducers (container_worker_pools)
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
    if profile == "smoke" and not overrides.get("data"):
        overrides["data"] = smoke_real_data()
    return make_config(profile, verbose=verbose, **overrides)


def stage_data(cfg: TrainConfig, bucket: str, folder: str | Path) -> TrainConfig:
    """`cfg` with its data where a Vertex job reads it without the hub: a local file or folder is
    uploaded to `bucket`/data/, and so are `mnli-subset`'s or a hub dataset's splits, loaded here
    once and written in `folder` as JSON Lines, one file a split (so every trial of a tuning job
    holds out the same pairs); gs:// and the sample (inside the image) stay as they are."""
    from nli_helpers import data  # lazy: data loads torch

    if not cfg.data or cfg.data == "sample" or files.is_gcs_uri(cfg.data):
        return cfg
    local = Path(cfg.data).expanduser()
    if not local.exists():
        if local.suffix or cfg.data.startswith((".", "/", "~")):
            return cfg  # a file that is not there: preflight says so
        local = Path(folder) / cfg.data.replace("/", "--")
        local.mkdir(parents=True, exist_ok=True)
        splits = data.load_nli_splits(cfg.data, eval_fraction=cfg.eval_fraction, seed=cfg.seed)
        for name, pairs in splits.items():  # through pandas: datasets' to_json draws a bar a split
            pairs.to_pandas().to_json(local / f"{name}.jsonl", orient="records", lines=True,
                                      force_ascii=False)
    return _upload(cfg, "data", local, f"{bucket.rstrip('/')}/data/{local.name}")


def stage_model(cfg: TrainConfig, bucket: str, folder: str | Path) -> TrainConfig:
    """`cfg` with its model where a Vertex job reads it without the hub: a hub model, downloaded
    once into `folder` (its weights, config and tokenizer files), or a local model folder is
    uploaded to `bucket`/models/; gs:// and `minilm-l6` (inside the image) stay as they are."""
    name = cfg.model_name_or_path or "minilm-l6"
    if name == "minilm-l6" or files.is_gcs_uri(name):
        return cfg
    local = Path(name).expanduser()
    if not local.is_dir():
        from huggingface_hub import snapshot_download

        try:
            local = Path(snapshot_download(name, local_dir=Path(folder) / "models" / name,
                                           allow_patterns=MODEL_FILES))
        except Exception as e:  # huggingface_hub raises many types for one cause
            raise VertexError(f"could not download model {name!r} from the Hugging Face hub "
                              f"({type(e).__name__}: {' '.join(str(e).split())[:200]}): check "
                              "the name and the network, or pass a local model folder") from e
    check_model_folder(local)
    return _upload(cfg, "model_name_or_path", local, f"{bucket.rstrip('/')}/models/{local.name}")


# What a model folder needs (from_pretrained): never pickles (.bin), never other frameworks' copies.
MODEL_FILES = ["*.json", "*.safetensors", "*.txt", "*.model"]
# A tokenizer's vocabulary: the file names of VOCAB_FILES_NAMES in transformers 5's
# tokenization_*.py (fast tokenizers, BPE, WordPiece, SentencePiece); without one it builds a
# tokenizer of special tokens only, and every word becomes [UNK].
VOCAB_FILES = {"tokenizer.json", "vocab.json", "vocab.txt", "spiece.model",
               "sentencepiece.bpe.model", "sentencepiece.model", "tokenizer.model"}


def check_model_folder(folder: str | Path) -> None:
    """A folder (local or gs://) that a job or an endpoint loads with `from_pretrained`: config,
    safetensors weights and a tokenizer, or one VertexError naming what is missing, before
    anything is uploaded or registered."""
    fs, path = files.filesystem(folder)
    try:
        names = {Path(entry).name for entry in fs.ls(path, detail=False)}
    except FileNotFoundError:
        names = set()
    needed = {
        "config.json": "config.json" in names,
        "weights (*.safetensors)": any(name.endswith(".safetensors") for name in names),
        "tokenizer (tokenizer.json, vocab.txt, ...)": bool(names & VOCAB_FILES),
    }
    missing = [what for what, found in needed.items() if not found]
    if missing:
        raise VertexError(f"{folder} is not a model folder a job can load: no "
                          f"{', '.join(missing)}. Pass a run's folder, or one written by "
                          "model.save_pretrained(folder) and tokenizer.save_pretrained(folder)")


def _upload(cfg: TrainConfig, field: str, local: Path, uri: str) -> TrainConfig:
    files.put(local, uri)
    print(f"{field}: uploaded {getattr(cfg, field)} to {uri}, where the job reads it")
    return dataclasses.replace(cfg, **{field: uri})


def job_args(cfg: TrainConfig) -> list[str]:
    """The trainer's arguments: no --output_dir (the trainer writes to AIP_MODEL_DIR), and
    --resume_from_checkpoint=auto unless the config names a checkpoint, because Vertex restarts a
    replica with the same command after maintenance or preemption and it must continue."""
    return dataclasses.replace(cfg, output_dir=None, resume_from_checkpoint=(
        cfg.resume_from_checkpoint or "auto")).to_cli_args()


def container_worker_pools(cfg: TrainConfig, machine: Machine, image_uri: str, *,
                           reduction_server: ReductionServer | None = None) -> list[dict]:
    """Worker pools that run the trainer image: its ENTRYPOINT (`nli_helpers.vertex.entry`) on one
    process; on several, the torchrun launcher (Vertex's RANK and WORLD_SIZE count nodes). Beside
    a Reduction Server, DDP's buckets are 64 MB unless the config chose: "The recommended value of
    bucket_cap_mb is 64 (64 MB)" (distributed-training page, "Batch small messages together")."""
    if reduction_server is not None and cfg.ddp_bucket_cap_mb is None:
        cfg = dataclasses.replace(cfg, ddp_bucket_cap_mb=REDUCTION_SERVER_BUCKET_MB)
    code = {"image_uri": image_uri, "args": job_args(cfg)}
    if machine.multi_process:
        code = {"image_uri": image_uri, "command": ["python", "-m", LAUNCH_MODULE],
                "args": ["--", *job_args(cfg)]}
    # Vertex wants exactly one replica in pool 0 (the chief); others go in pool 1, reducers in 2.
    pool = {"machine_spec": machine.machine_spec(), "container_spec": code}
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


def spot_worker_pools(worker_pool_specs: list[dict]) -> list[dict]:
    """A copy of the pools for a Spot job: each training pool running the trainer (its args name
    --profile) also checkpoints every SPOT_CHECKPOINT_EVERY_MINUTES, unless its args set
    --checkpoint_every_minutes (0 included)."""
    budget = f"--checkpoint_every_minutes={SPOT_CHECKPOINT_EVERY_MINUTES:g}"
    pools = copy.deepcopy(worker_pool_specs)
    for pool in pools[:2]:  # the chief and the workers, not reducers
        args = pool.get("container_spec", {}).get("args") or []
        flags = {a.split("=", 1)[0][2:].replace("-", "_") for a in args if a.startswith("--")}
        if "profile" in flags and "checkpoint_every_minutes" not in flags:
            pool["container_spec"]["args"] = [*args, budget]
    return pools


def training_replicas(worker_pool_specs: list[dict]) -> int:
    """How many replicas train (the chief and workers pools; not reducers or evaluators)."""
    return sum(int(pool.get("replica_count", 0)) for pool in worker_pool_specs[:2])

"""Run the trainer on Vertex AI: build the job from a `TrainConfig`, check it, submit it, watch it, fetch its outputs.

Every job runs the trainer image built from docker/Dockerfile (`images`): its entry point is
`python -m nli_helpers.task` with `cfg.to_cli_args()`, or `python -m nli_helpers.launch --` (which starts torchrun)
when the job has more than one training process. No prebuilt PyTorch training image can run this package
(`images.prebuilt_image_problem` says why), so the python-package path is built (`python_package_worker_pools`)
but refused by `preflight`.

    >>> cloud = init_vertex("my-project", "us-central1", "gs://my-staging-bucket")            # jobs
    >>> machine = Machine("g2-standard-8", "NVIDIA_L4", 1)                                      # pools
    >>> pools = container_worker_pools(job_config("full"), machine, trainer_image_uri("my-project", "us-central1"))
    >>> preflight(region="us-central1", staging_bucket="gs://my-staging-bucket", machine=machine, image_uri=...)
    >>> print(estimate_job_cost(pools, hours=3))                                                # pricing
    >>> job = submit_custom_job(pools, base_output_dir="gs://my-staging-bucket/nli-jobs/run-1", spot=True)
    >>> watch_job(job)                          # a line per state; raises JobFailedError with the logs link
    >>> metrics = fetch_outputs(job, "runs/vertex-run-1")

Multi-worker: `Machine(..., replica_count=N)` gives a chief pool (1 replica) and a worker pool (N-1); pass
`reduction_server=ReductionServer(replica_count=K)` for Google's Reduction Server pool (workerpool2, GPUs only).
Vertex gives the job base_output_dir/model/, /checkpoints/ and /logs/ as AIP_MODEL_DIR, AIP_CHECKPOINT_DIR and
AIP_TENSORBOARD_LOG_DIR; the job args carry no --job-dir, so the trainer writes to AIP_MODEL_DIR.

The modules: `images` (which image), `pools` (the worker pools), `preflight` (checks before money is spent),
`jobs` (submit, watch, fetch), `errors`. Everything public is importable from `nli_helpers.vertex`.
"""

from nli_helpers.packaging import build_sdist, stage_package
from nli_helpers.vertex.pricing import CostEstimate, JobCostEstimate, estimate_cost, estimate_job_cost

from .errors import JobFailedError, NoPrebuiltImageError, PreflightError, VertexError
from .images import (
    DEFAULT_TORCH_CUDA,
    GPU_COMPUTE_CAPABILITY,
    IMAGES_SOURCE,
    IMAGES_TABLE_DATE,
    PREBUILT_PYTORCH_IMAGES,
    TORCH_CUDA_BUILDS,
    PrebuiltImage,
    TorchCudaBuild,
    image_gpu_problem,
    image_torch_cuda,
    image_torch_version,
    local_torch_version,
    newest_prebuilt_image_uri,
    package_torch_requirement,
    prebuilt_image,
    prebuilt_image_problem,
    prebuilt_image_uri,
    prebuilt_images_table,
    torch_minor,
    trainer_image_build_commands,
    trainer_image_uri,
)
from .jobs import (
    API_ENDPOINT_ENV,
    VertexSettings,
    aiplatform_sdk,
    check_vertex_tensorboard,
    fetch_outputs,
    init_vertex,
    logs_url,
    queued_help,
    submit_custom_job,
    watch_job,
)
from .pools import (
    LAUNCH_MODULE,
    REDUCTION_SERVER_IMAGE,
    REDUCTION_SERVER_MACHINE_TYPE,
    SPOT_CHECKPOINT_EVERY_MINUTES,
    TASK_MODULE,
    Machine,
    ReductionServer,
    container_worker_pools,
    job_args,
    job_config,
    pools_table,
    python_package_worker_pools,
    spot_worker_pools,
    training_replicas,
)
from .preflight import Check, bucket_location_check, preflight
from .tuning import validate_search_space

__all__ = ["aiplatform_sdk", "API_ENDPOINT_ENV", "bucket_location_check", "build_sdist", "Check", "check_vertex_tensorboard",
           "container_worker_pools", "CostEstimate", "estimate_cost", "estimate_job_cost",
           "DEFAULT_TORCH_CUDA", "fetch_outputs", "GPU_COMPUTE_CAPABILITY", "image_gpu_problem",
           "image_torch_cuda", "image_torch_version", "IMAGES_SOURCE", "IMAGES_TABLE_DATE", "init_vertex", "VertexSettings",
           "job_args", "job_config", "JobCostEstimate", "JobFailedError", "LAUNCH_MODULE", "local_torch_version",
           "logs_url", "Machine", "newest_prebuilt_image_uri", "NoPrebuiltImageError",
           "package_torch_requirement", "pools_table", "prebuilt_image", "prebuilt_image_problem",
           "prebuilt_image_uri", "prebuilt_images_table", "PREBUILT_PYTORCH_IMAGES", "PrebuiltImage", "preflight",
           "PreflightError", "python_package_worker_pools", "queued_help", "REDUCTION_SERVER_IMAGE",
           "REDUCTION_SERVER_MACHINE_TYPE", "ReductionServer", "SPOT_CHECKPOINT_EVERY_MINUTES",
           "spot_worker_pools", "stage_package", "submit_custom_job", "TASK_MODULE", "TORCH_CUDA_BUILDS",
           "torch_minor", "TorchCudaBuild", "trainer_image_build_commands", "trainer_image_uri", "training_replicas",
           "validate_search_space", "VertexError", "watch_job"]

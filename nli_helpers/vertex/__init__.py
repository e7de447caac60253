"""Run the trainer on Vertex AI: build a job from a `TrainConfig`, check it, submit it, watch it,
fetch its outputs. The [vertex] extra; the trainer never imports it.

    >>> cloud = init_vertex("my-project", "us-central1", "gs://my-staging-bucket")     # jobs
    >>> machine = Machine("g2-standard-8", "NVIDIA_L4", 1)                               # pools
    >>> pools = container_worker_pools(job_config("full"), machine, cloud.image_uri)
    >>> preflight(region="us-central1", staging_bucket="gs://my-staging-bucket",
    ...           machine=machine, image_uri=cloud.image_uri)                          # checks
    >>> print(estimate_job_cost(pools, hours=3))                                         # pricing
    >>> job = submit_custom_job(pools, base_output_dir="gs://my-staging-bucket/run-1", spot=True)
    >>> watch_job(job)              # a line per state; raises JobFailedError with the logs link
    >>> metrics = fetch_outputs(job, "runs/vertex-run-1")

Every job runs the trainer image docker/Dockerfile builds (`images`): `python -m
nli_helpers.vertex.entry`, or `python -m nli_helpers.vertex.launch --` (torchrun) for several
processes. `Machine(..., replica_count=N)` gives a chief and N-1 workers;
`reduction_server=ReductionServer(K)` adds Google's reducers. Vertex gives the job AIP_MODEL_DIR,
AIP_CHECKPOINT_DIR and AIP_TENSORBOARD_LOG_DIR under base_output_dir. No prebuilt PyTorch image
can run this package (`prebuilt_image_problem`, which preflight gives for one), so a job always
runs the trainer image. The same image serves a trained model folder: `python -m
nli_helpers.vertex.serve`, the HTTP server of Vertex AI's custom-container contract (`serve`).
"""

from nli_helpers import lazy_attributes

# Names load on first use (PEP 562): the trainer image runs `python -m nli_helpers.vertex.entry`,
# which needs none of the submission side (google-cloud-aiplatform) that these modules import.
_MODULES = {
    ".errors": "JobFailedError NotSubmitted PreflightError VertexError",
    ".images": "DEFAULT_TORCH_CUDA GPU_COMPUTE_CAPABILITY PREBUILT_PYTORCH_IMAGES "
               "TORCH_CUDA_BUILDS image_gpu_problem image_torch_cuda newest_prebuilt_image_uri "
               "package_torch_requirement prebuilt_image_problem "
               "trainer_image_build_commands trainer_image_uri",
    ".jobs": "API_ENDPOINT_ENV CLOUDS TIMEOUT_PER_EXPECTED_HOUR TUTORIAL_LABELS VertexSettings "
             "check_cloud confirm_submit fetch_outputs "
             "init_vertex logs_url queued_help remove_endpoints submit_custom_job watch_job",
    ".pools": "REDUCTION_SERVER_BUCKET_MB REDUCTION_SERVER_IMAGE REDUCTION_SERVER_MACHINE_TYPE "
              "SPOT_CHECKPOINT_EVERY_MINUTES "
              "Machine ReductionServer check_model_folder container_worker_pools job_args "
              "job_config reduction_server_image spot_worker_pools stage_data stage_model",
    ".pricing": "PREDICTION_PRICE_SOURCE estimate_cost estimate_job_cost prediction_hourly_price",
    ".checks": "bucket_location_check preflight",  # the module is not named preflight: no clash
    ".tuning": "validate_search_space",
}
_WHERE = {name: module for module, names in _MODULES.items() for name in names.split()}
# What the notebooks, README, docs, localcloud and tests call; the rest stays in its module.
__all__ = sorted(_WHERE)

__getattr__ = lazy_attributes(__name__, _WHERE)

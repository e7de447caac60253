"""Vertex AI's contract with a custom training container, spelled once: the environment it sets,
the exit codes it retries, and the marker files that carry a preemption through torchrun. Plain
constants (no torch), so the launcher reads them at start-up.

Sources: "Prepare training code" (https://cloud.google.com/vertex-ai/docs/training/
code-requirements) for AIP_*; "Use Vertex AI TensorBoard with custom training"
(https://cloud.google.com/vertex-ai/docs/experiments/tensorboard-training); "Distributed training"
(https://cloud.google.com/vertex-ai/docs/training/distributed-training) for CLUSTER_SPEC; "Handle
common errors" (https://docs.cloud.google.com/vertex-ai/docs/training/understanding-training-service)
for the exit codes.
"""

MODEL_DIR_ENV = "AIP_MODEL_DIR"  # base_output_dir/model: the run folder
CHECKPOINT_DIR_ENV = "AIP_CHECKPOINT_DIR"  # base_output_dir/checkpoints: set, a restart resumes
TENSORBOARD_ENV = "AIP_TENSORBOARD_LOG_DIR"  # base_output_dir/logs: what Vertex TensorBoard reads
TRIAL_ID_ENV = "CLOUD_ML_TRIAL_ID"  # set in a hyperparameter tuning trial
METRIC_TAG_ENV = "CLOUD_ML_HP_METRIC_TAG"  # the legacy AI Platform name of the metric to report
CLUSTER_SPEC_ENV = "CLUSTER_SPEC"  # the worker pools and this replica's place among them

# In a custom container Vertex AI restarts a job (up to three times) after exit 134 or 139 only:
# 134 after a SIGTERM that left a checkpoint; 143 (128 + SIGTERM) when nothing can resume.
RESTARTABLE_EXIT_CODE = 134
PERMANENT_STOP_EXIT_CODE = 143

# Each trainer process that stops for a SIGTERM leaves a file `rank-<RANK>` in this folder
# (entry.stopped_exit); the launcher creates LAUNCHER_SIGTERM there when it passes one on.
PREEMPTED_MARKERS_ENV = "NLI_PREEMPTED_MARKERS"
LAUNCHER_SIGTERM = "launcher-sigterm"

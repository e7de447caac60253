"""Which GPUs the trainer image can run: one table of torch's CUDA builds (nli_helpers.vertex.TORCH_CUDA_BUILDS),
from which preflight refuses a GPU before anything is created, and the trainer refuses one at start."""

from __future__ import annotations

import pytest
from google.auth.credentials import AnonymousCredentials

from nli_helpers import vertex
from nli_helpers.config import make_config
from nli_helpers.distributed import gpu_kernel_problem
from nli_helpers.vertex import Machine, pricing

pytest_plugins = ["tests.fake_vertex"]

PROJECT, REGION = "test-project", "us-central1"
CU126 = vertex.trainer_image_uri(PROJECT, REGION)
CU130 = vertex.trainer_image_uri(PROJECT, REGION, torch_cuda="cu130")


def _preflight(bucket: str, machine: Machine, image_uri: str, **kwargs):
    return vertex.preflight(region=REGION, staging_bucket=f"gs://{bucket}", machine=machine, image_uri=image_uri,
                            cfg=make_config("smoke", data="sample"), verbose=False, **kwargs)


def test_the_image_tag_names_its_cuda_build():
    assert CU126.endswith(":0.1.0-cu126") and vertex.image_torch_cuda(CU126) == "cu126"
    assert vertex.image_torch_cuda("gcr.io/p/trainer:1") is None
    assert "--substitutions=_IMAGE=" + CU130 + ",_TORCH_CUDA=cu130" in vertex.trainer_image_build_commands(CU130)


@pytest.mark.parametrize("gpu, runs_on", [
    ("NVIDIA_TESLA_V100", {"cu126"}), ("NVIDIA_TESLA_P100", {"cu126"}), ("NVIDIA_TESLA_P4", {"cu126"}),
    ("NVIDIA_TESLA_T4", {"cu126", "cu130", "cu132"}), ("NVIDIA_L4", {"cu126", "cu130", "cu132"}),
    ("NVIDIA_H100_80GB", {"cu126", "cu130", "cu132"}), ("NVIDIA_H200_141GB", {"cu126", "cu130", "cu132"}),
    ("NVIDIA_B200", {"cu130", "cu132"}), ("NVIDIA_RTX_PRO_6000", {"cu130", "cu132"}),
    ("NVIDIA_TESLA_K80", set()), ("NVIDIA_GB200", set()),
])
def test_each_gpu_runs_on_the_builds_with_its_kernels(gpu, runs_on):
    # From the RELEASE.md support matrix: 12.6 has sm_50..sm_90, 13.x sm_75..sm_120 + PTX. L4 (8.9) runs sm_86
    # cubins; B200 (10.0) has no kernel in 12.6; GB200 hosts are Arm, the image x86-64.
    assert {tag for tag in vertex.TORCH_CUDA_BUILDS if vertex.image_gpu_problem(gpu, tag) is None} == runs_on


def test_every_gpu_a_machine_can_carry_is_in_the_table():
    gpus = {gpu for _, gpu, _ in pricing.ATTACHED_GPUS} | set(pricing.N1_GPU_COUNTS)
    assert gpus <= set(vertex.GPU_COMPUTE_CAPABILITY)


def test_preflight_refuses_a_gpu_the_image_has_no_kernels_for_before_anything_is_created(fake_vertex, gcs_bucket):
    vertex.init_vertex(PROJECT, REGION, f"gs://{gcs_bucket}", credentials=AnonymousCredentials(),
                       api_endpoint=fake_vertex.endpoint)
    with pytest.raises(vertex.PreflightError) as err:
        _preflight(gcs_bucket, Machine("a4-highgpu-8g", "NVIDIA_B200", 8), CU126)
    (line,) = [line for line in str(err.value).splitlines() if "image/torch" in line]
    assert "cannot run NVIDIA_B200 (compute capability 10.0): rebuild the image with " \
           "--substitutions=_TORCH_CUDA=cu130" in line
    with pytest.raises(vertex.PreflightError, match="cannot run NVIDIA_TESLA_V100 .compute capability 7.0.: "
                                                    "rebuild the image with --substitutions=_TORCH_CUDA=cu126"):
        _preflight(gcs_bucket, Machine("n1-standard-8", "NVIDIA_TESLA_V100", 1), CU130)
    assert fake_vertex.created_bodies == []


def test_preflight_passes_the_default_image_on_an_l4_and_warns_what_it_cannot_know(gcs_bucket):
    l4 = Machine("g2-standard-8", "NVIDIA_L4", 1)
    (image,) = [c for c in _preflight(gcs_bucket, l4, CU126) if c.name == "image/torch"]
    assert image.status == "ok" and "torch cu126 (CUDA 12.6.3), which runs NVIDIA_L4" in image.message
    (image,) = [c for c in _preflight(gcs_bucket, l4, CU130) if c.name == "image/torch"]
    assert image.status == "warn" and "needs an NVIDIA driver >= 580" in image.message
    (image,) = [c for c in _preflight(gcs_bucket, l4, "gcr.io/p/trainer:1") if c.name == "image/torch"]
    assert image.status == "warn" and "taken as docker/Dockerfile's default cu126" in image.message


@pytest.mark.parametrize("arch_list, capability, runs", [
    (["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"], (8, 9), True),  # L4 on cu126
    (["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"], (10, 0), False),  # B200 on cu126
    (["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120", "compute_120"], (7, 0), False),  # V100 on cu130
    (["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120", "compute_120"], (12, 1), True),  # PTX
])
def test_the_trainer_refuses_a_gpu_its_torch_has_no_kernels_for(arch_list, capability, runs):
    problem = gpu_kernel_problem(arch_list, capability)
    assert (problem is None) == runs
    if not runs:
        assert f"the GPU is compute capability {capability[0]}.{capability[1]}" in problem

"""The GPU and multi-process paths, on this CPU: what only a real GPU or a real failure would otherwise show.

Each test pins one defect found by reading torch 2.13 and transformers 5.23 against the code: GPU capability and
CUDA availability are patched where the hardware is missing; the fp16 grad scaler runs for real (CPU autocast
has fp16); the multi-process cases are real torchrun processes over gloo.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback
from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from nli_helpers import distributed
from nli_helpers.config import ConfigError, make_config
from nli_helpers.vertex.environment import ClusterSpec
from tests.helpers import ROOT, VERTEX_ENTRY, free_port, run_task

CUDA = torch.device("cuda", 0)
# The GPU check (benchmarks/device_check.sh) runs this file where the [vertex] extra is not installed: the tests of
# Vertex AI's entry point skip there, saying so.
NO_GPU = {"CUDA_VISIBLE_DEVICES": ""}  # a test of the CPU path runs on a GPU machine too


def vertex_entry():
    pytest.importorskip("hypertune", reason="Vertex AI's entry point needs the [vertex] extra (cloudml-hypertune)")
    from nli_helpers.vertex import entry

    return entry


def fake_gpu(monkeypatch, name: str, capability: tuple[int, int]) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)


# -- 1. precision follows compute capability ---------------------------------------------------------------------
@pytest.mark.parametrize("name, capability, auto", [
    ("Tesla T4", (7, 5), "fp16"), ("Tesla V100-SXM2-16GB", (7, 0), "fp16"),
    ("NVIDIA A100-SXM4-40GB", (8, 0), "bf16"), ("NVIDIA L4", (8, 9), "bf16"), ("NVIDIA H100 80GB HBM3", (9, 0), "bf16"),
])
def test_auto_precision_is_bf16_only_where_the_gpu_computes_it(monkeypatch, name, capability, auto):
    fake_gpu(monkeypatch, name, capability)
    assert distributed.resolve_precision("auto", CUDA) == auto
    if auto == "fp16":  # torch.cuda.is_bf16_supported() says True here: it counts emulation
        with pytest.raises(ConfigError, match=r"compute capability 7\.\d.*emulated, several times slower.*fp16"):
            distributed.resolve_precision("bf16", CUDA)
    assert distributed.resolve_precision("fp16", CUDA) == "fp16"


# -- 2. no GPU, no `full` run ---------------------------------------------------------------------------------------
def test_full_profile_without_a_gpu_stops_at_once_before_loading_anything(tmp_path):
    start = time.monotonic()
    proc = run_task("--profile", "full", "--output_dir", str(tmp_path / "job"), env={"CUDA_VISIBLE_DEVICES": ""})
    took = time.monotonic() - start
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "profile full trains roberta-base on 393k pairs, which needs a CUDA GPU" in proc.stderr
    assert "--profile smoke" in proc.stderr and "--allow-cpu" in proc.stderr and "Traceback" not in proc.stderr
    assert "data:" not in proc.stdout and not (tmp_path / "job").exists()  # nothing loaded, nothing written
    assert took < 60, took  # the interpreter and torch's import, then the check


def test_bf16_gradient_compression_without_a_gpu_is_refused_before_anything_loads():
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is here: the NCCL hook runs")
    with pytest.raises(ConfigError, match="ddp_bf16_compress needs CUDA GPUs: .* NCCL only.*Leave it off here"):
        distributed.check_accelerator(make_config("smoke", ddp_bf16_compress=True))


def test_a_vertex_replica_that_asked_for_gpus_refuses_to_train_on_the_cpu(tmp_path, tiny_model_dir):
    spec = {"cluster": {"workerpool0": ["127.0.0.1:2222"]}, "task": {"type": "workerpool0", "index": 0},
            "job": {"worker_pool_specs": [{"machine_spec": {"machine_type": "g2-standard-8",
                                                            "accelerator_type": "NVIDIA_L4", "accelerator_count": 1},
                                           "replica_count": "1"}]}}
    replica_gpus = vertex_entry().replica_gpus
    env = {"CLUSTER_SPEC": json.dumps(spec), **NO_GPU}
    args = ("--profile", "smoke", "--data", "sample", "--model_name_or_path", tiny_model_dir, "--num_train_epochs", "1",
            "--max_train_samples", "16", "--overwrite_output_dir", "--output_dir", str(tmp_path / "job"))
    proc = run_task(*args, env=env, module=VERTEX_ENTRY)
    assert proc.returncode == 2 and "asked for 1 x NVIDIA_L4, but torch sees no CUDA GPU" in proc.stderr
    assert replica_gpus(ClusterSpec.parse(json.dumps({**spec, "job": json.dumps(spec["job"])}))) == "1 x NVIDIA_L4"
    assert run_task(*args, env=env).returncode == 0  # the trainer command itself knows nothing of Vertex
    forced = run_task(*args, "--allow-cpu", env=env, module=VERTEX_ENTRY)
    assert forced.returncode == 0, forced.stderr[-2000:]


def test_the_gpu_guard_reads_the_rest_spelling_of_the_job_and_says_when_it_cannot_read_it(capsys):
    """CLUSTER_SPEC's `job` is the CustomJobSpec "represented as a dictionary" (distributed-training page), in a
    spelling the page does not give: the REST API's camelCase reads as the SDK's snake_case."""
    replica_gpus = vertex_entry().replica_gpus
    task = {"cluster": {"workerpool0": ["h:2222"], "workerpool1": ["w:2222"]}, "task": {"type": "workerpool1", "index": 0}}
    pools = [{"machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": "1"},
             {"machineSpec": {"machineType": "a2-highgpu-2g", "acceleratorType": "NVIDIA_TESLA_A100",
                              "acceleratorCount": 2}, "replicaCount": "1"}]
    assert replica_gpus(ClusterSpec.parse({**task, "job": {"workerPoolSpecs": pools}})) == "2 x NVIDIA_TESLA_A100"
    assert replica_gpus(ClusterSpec.parse({**task, "job": json.dumps({"workerPoolSpecs": pools})})) == \
        "2 x NVIDIA_TESLA_A100"
    assert capsys.readouterr().err == ""
    assert replica_gpus(ClusterSpec.parse({**task, "job": {"pools": pools}})) is None
    assert "cannot read this replica's GPUs from CLUSTER_SPEC's job (KeyError" in capsys.readouterr().err
    assert replica_gpus(None) is None and capsys.readouterr().err == ""  # not on Vertex AI: nothing to say


# -- 3. an fp16 step the scaler skips moves neither the schedule nor the step count -------------------------------
def test_a_skipped_fp16_step_does_not_advance_the_schedule(tiny_model_dir):
    from nli_helpers import train
    from nli_helpers.data import load_nli_splits
    from nli_helpers.model import load_model_and_tokenizer, tokenize_splits

    cfg = make_config("smoke", model_name_or_path=tiny_model_dir, num_train_epochs=1, per_device_train_batch_size=8,
                      max_train_samples=64, max_eval_samples=16, logging_steps=1, warmup_ratio=0.25, progress=False,
                      save_total_limit=0)

    def run(poison: bool):
        torch.manual_seed(0)
        model, tokenizer = load_model_and_tokenizer(tiny_model_dir)
        splits = load_nli_splits("sample", max_train_samples=64, max_eval_samples=16)
        tokenized = tokenize_splits(splits, tokenizer, 64)
        if poison:  # an overflow in the first backward: the grad scaler must skip that update
            calls = []
            param = next(model.parameters())
            param.register_hook(lambda g: (calls.append(1), g * float("inf") if len(calls) == 1 else g)[1])
        return train.train(cfg, model, tokenizer, tokenized, device=torch.device("cpu"),
                           precision="fp16")  # CPU autocast has fp16

    clean, skipped = run(False), run(True)
    assert clean.metrics["train"]["skipped_steps"] == 0 and skipped.metrics["train"]["skipped_steps"] == 1
    assert skipped.metrics["train"]["steps"] == clean.metrics["train"]["steps"] == 8  # 64 pairs / 8
    # The schedule is the same at every applied step: the skipped one did not consume a learning-rate step.
    assert [r["lr"] for r in skipped.history] == [r["lr"] for r in clean.history]
    assert [r["step"] for r in skipped.history] == list(range(1, 9))


# -- 4. the model trains in fp32 whatever it was saved in; an architecture without SDPA still loads ----------------
def test_a_model_saved_in_half_precision_loads_in_fp32(tmp_path, tiny_model_dir):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from nli_helpers.model import load_model_and_tokenizer

    AutoModelForSequenceClassification.from_pretrained(tiny_model_dir).half().save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(tmp_path)
    model, _ = load_model_and_tokenizer(str(tmp_path))
    assert {p.dtype for p in model.parameters()} == {torch.float32}


def test_an_architecture_without_sdpa_loads_with_eager_attention(tmp_path, tiny_model_dir):
    from transformers import AutoTokenizer, DebertaV2Config, DebertaV2ForSequenceClassification

    from nli_helpers.model import load_model_and_tokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    config = DebertaV2Config(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=1,
                             num_attention_heads=2, intermediate_size=64, num_labels=3)
    DebertaV2ForSequenceClassification(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    model, tok = load_model_and_tokenizer(str(tmp_path))  # DeBERTa has no SDPA in transformers 5.23
    assert model.config._attn_implementation == "eager"
    assert model(**tok(["a premise"], ["a hypothesis"], return_tensors="pt")).logits.shape == (1, 3)


# -- 5. a resume that would change the run is refused --------------------------------------------------------------
def torchrun(*args: str, nproc: int = 2, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
                           f"--master-port={free_port()}", "--module", "nli_helpers.task", *args],
                          capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1", **NO_GPU},
                          cwd=ROOT, timeout=timeout)


def test_resume_with_another_number_of_processes_is_refused(tmp_path, tiny_model_dir):
    args = ("--profile", "smoke", "--data", "sample", "--model_name_or_path", tiny_model_dir, "--num_train_epochs",
            "1", "--per_device_train_batch_size", "8", "--max_train_samples", "48", "--precision", "fp32",
            "--save_steps", "2", "--no-progress", "--output_dir", str(tmp_path / "job"))
    one = run_task(*args, env=NO_GPU)  # checkpoints at steps 2 and 4 of 6, written by one process (gloo's CPU path)
    assert one.returncode == 0, one.stderr[-2000:]
    (tmp_path / "job" / "metrics.json").unlink()  # as a run killed before its final save leaves it
    resumed = torchrun(*args, "--resume_from_checkpoint", "auto")  # the same flags: only the process count differs
    assert resumed.returncode != 0, resumed.stderr[-3000:]  # torchrun: 1 when a rank failed
    assert "error: cannot resume from " in resumed.stderr and "checkpoint-00000004" in resumed.stderr
    assert "the number of processes (1 -> 2" in resumed.stderr
    # torchrun's report: the rank that refused first ended with its error: line (exit 2). The other refuses at the
    # same step, but torchrun may stop it first (a SIGTERM) once one rank failed: under load it often does.
    assert resumed.stderr.count("exitcode  : 2") >= 1


def test_resume_in_another_precision_is_refused():
    from nli_helpers.checkpoint import CheckpointError, check_resumable, identity

    cfg = make_config("smoke", data="sample")
    saved = {**identity(cfg, 1, "bf16", None), "rng": [{}]}
    with pytest.raises(CheckpointError, match=r"cannot resume from ckpt: precision \(bf16 -> fp16: .*--precision"):
        check_resumable("ckpt", saved, identity(cfg, 1, "fp16", None))
    check_resumable("ckpt", saved, identity(cfg, 1, "bf16", None))  # the same precision resumes


def test_rng_of_a_checkpoint_from_a_machine_with_more_gpus_restores_on_this_one():
    from nli_helpers.checkpoint import rng_state, set_rng_state

    state = rng_state(torch.device("cpu"))
    torch.rand(3)
    old_format = {"torch": state["torch"], "cuda": [torch.zeros(16, dtype=torch.uint8)] * 8}  # 8 saved GPUs
    set_rng_state(old_format, torch.device("cpu"))  # once indexed every saved GPU: fails without them
    torch.set_rng_state(state["torch"])
    expected = torch.rand(3)
    set_rng_state(state, torch.device("cpu"))
    assert torch.equal(torch.rand(3), expected)


# -- 5b. DDP on every torch the package allows ---------------------------------------------------------------------
@pytest.mark.device_check
def test_ddp_takes_the_bucket_size_the_config_names_and_this_torchs_buffer_keyword(tmp_path):
    """--ddp_bucket_cap_mb reaches DistributedDataParallel (64 beside a Reduction Server, vertex.pools); buffers are
    synced before each forward only where a checkpoint saves them, under the keyword this torch has (2.13 deprecates
    broadcast_buffers for forward_sync_buffers, which 2.11, the GPU check's torch, lacks), with no warning."""
    import warnings

    import torch.distributed as torch_dist

    torch_dist.init_process_group("gloo", store=torch_dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", FutureWarning)
            for chosen, cap in ((None, 25 * 2**20), (64, 64 * 2**20)):  # torch's default, then the config's
                net = distributed.wrap_ddp(torch.nn.Linear(4, 3), torch.device("cpu"), distributed.DistInfo(0, 0, 2),
                                           make_config("smoke", ddp_bucket_cap_mb=chosen))
                assert net.bucket_bytes_cap == cap
                assert getattr(net, "forward_sync_buffers", getattr(net, "broadcast_buffers", None)) is False
            norm = distributed.wrap_ddp(torch.nn.BatchNorm1d(3), torch.device("cpu"), distributed.DistInfo(0, 0, 2),
                                        make_config("smoke"))
            # running statistics: a checkpoint saves them
            assert getattr(norm, "forward_sync_buffers", getattr(norm, "broadcast_buffers", None)) is True
    finally:
        torch_dist.destroy_process_group()


@pytest.mark.device_check
def test_ddp_takes_broadcast_buffers_on_a_torch_older_than_2_13(monkeypatch):
    """torch before 2.13 has no forward_sync_buffers (pyproject allows torch >= 2.6): DDP gets the older keyword."""
    class OlderDDP:  # torch 2.11's signature, in the part that matters here
        def __init__(self, module, device_ids=None, broadcast_buffers=True, bucket_cap_mb=None,
                     gradient_as_bucket_view=False):
            self.broadcast_buffers = broadcast_buffers

    monkeypatch.setattr(distributed, "DDP", OlderDDP)
    for module, drifting in ((torch.nn.Linear(4, 3), False), (torch.nn.BatchNorm1d(3), True)):
        net = distributed.wrap_ddp(module, torch.device("cpu"), distributed.DistInfo(0, 0, 2), make_config("smoke"))
        assert net.broadcast_buffers is drifting


# -- 6. a failure on rank 0 ends every rank within seconds, with rank 0's message ----------------------------------
def test_a_failed_checkpoint_on_rank_0_stops_every_rank_at_once(tmp_path, tiny_model_dir):
    # A checkpoint dir of 4,065 bytes: the check before training (a probe file, /.nli-write-check-<pid>, 25 bytes at
    # most) and the lock pass, but a checkpoint's files (/checkpoint-<step>/config.json, 32 bytes) push the path past
    # PATH_MAX (4,096 bytes with its NUL): the write fails on rank 0 only, at the first one.
    root = str(tmp_path)
    while len(root) < 4065 - 201:
        root += "/" + "d" * 200
    root += "/" + "d" * (4065 - len(root) - 1)
    start = time.monotonic()
    proc = torchrun("--profile", "smoke", "--data", "sample", "--model_name_or_path", tiny_model_dir,
                    "--num_train_epochs", "2", "--per_device_train_batch_size", "8", "--max_train_samples", "32",
                    "--precision", "fp32", "--no-progress", "--output_dir", str(tmp_path / "job"),
                    "--checkpoint_dir", root)
    took = time.monotonic() - start
    assert proc.returncode != 0
    assert "rank 0 failed, so rank 1 stops too: CheckpointError: could not write checkpoint" in proc.stderr
    assert "(File name too long)" in proc.stderr
    assert took < 120, took  # not the 30-minute collective timeout


def test_torchrun_stopping_the_survivors_is_not_taken_for_a_preemption(monkeypatch, tmp_path):
    stopped_by_torchrun_after_a_failure = vertex_entry().stopped_by_torchrun_after_a_failure

    monkeypatch.delenv("NLI_PREEMPTED_MARKERS", raising=False)
    assert not stopped_by_torchrun_after_a_failure()  # plain torchrun or no launcher: a SIGTERM is a preemption
    monkeypatch.setenv("NLI_PREEMPTED_MARKERS", str(tmp_path))
    assert stopped_by_torchrun_after_a_failure()  # the launcher got no SIGTERM: torchrun is stopping us
    (tmp_path / "launcher-sigterm").touch()
    assert not stopped_by_torchrun_after_a_failure()


# -- 7. the global batch: per-device batch x processes x accumulation, as Trainer's ----------------------------------
def test_the_global_batch_is_the_per_device_batch_times_the_processes(tmp_path, tiny_model_dir):
    args = ("--profile", "smoke", "--data", "sample", "--model_name_or_path", tiny_model_dir, "--num_train_epochs",
            "1", "--per_device_train_batch_size", "4", "--max_train_samples", "64", "--precision", "fp32",
            "--no-progress")
    two = torchrun(*args, "--output_dir", str(tmp_path / "two"))
    assert two.returncode == 0, two.stderr[-2000:]
    assert "batch: 8 pairs per optimizer step = 2 process(es) x 4 x 1 accumulation step(s)" in two.stdout
    train = json.loads((tmp_path / "two" / "metrics.json").read_text())["train"]
    assert (train["global_batch"], train["per_process_batch"], train["processes"], train["steps"]) == (8, 4, 2, 8)


# -- 9. on a real GPU: every host sync in a step is a named one ----------------------------------------------------
@pytest.mark.device_check
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_every_host_sync_in_a_training_step_is_a_named_one(tmp_path, precision):
    """benchmarks/find_syncs.py under torch.cuda.set_sync_debug_mode: no sync beyond those NAMED (and README.md says
    why each stays), none more often than NAMED allows. Runs wherever CUDA exists; first run on an H200."""
    if not torch.cuda.is_available():
        pytest.skip("the sync debug mode needs a CUDA GPU (benchmarks/README.md has the H200 run)")
    if precision == "bf16" and not torch.cuda.is_bf16_supported(including_emulation=False):
        pytest.skip("this GPU has no native bf16")
    out = tmp_path / "syncs.json"
    # The GPU check carries MiniLM's tokenizer files and names them here: its machine lacks the [smoke] extra.
    tokenizer = os.environ.get("NLI_CHECK_TOKENIZER", "minilm-l6")
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "find_syncs.py"), "--precision", precision,
                           "--steps", "24", "--warmup-steps", "4", "--data", "sample", "--out", str(out),
                           "--tokenizer", tokenizer],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from find_syncs import NAMED

    sites = json.loads(out.read_text())["sites"]
    for key, site in sites.items():
        function = key.rsplit(" in ", 1)[-1]
        assert function in NAMED, f"a host sync nobody named: {key}\n" + "\n".join(site["stack"])
        assert site["per_step"] <= NAMED[function] + 1e-9, (key, site["per_step"])


# -- 10. on this CPU: no tensor read into Python inside a step but the named ones ----------------------------------
class ScalarReads(TorchDispatchMode):
    """Each tensor read into a Python number (`item()`, `bool()`, `int()`), by the innermost function outside torch
    that asked: on a GPU each is a host sync. What a CUDA run's sync debug mode finds (test 9), found on a CPU."""

    def __init__(self):
        super().__init__()
        self.sites: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            frames = [f for f in traceback.extract_stack()[:-1] if f"{os.sep}torch{os.sep}" not in f.filename]
            self.sites[frames[-1].name] += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("precision, attention", [("fp32", "sdpa"), ("bf16", "sdpa"), ("fp16", "sdpa"),
                                                  ("fp32", "eager")])
def test_a_training_step_reads_no_tensor_but_the_named_ones(tiny_model_dir, precision, attention):
    """transformers' `padding_mask.all()` (one a forward) and GradScaler.get_scale (two an fp16 step) read tensors
    into Python; a step now passes a mask the model takes as it is and compares the loss scale once. Left: the fp16
    step's skipped-step check (find_syncs.NAMED), and once an epoch on the CPU, outside any step: the DataLoader
    drawing its epoch's seed, and the length-grouped order choosing its longest batch."""
    from nli_helpers import train
    from nli_helpers.data import load_nli_splits
    from nli_helpers.model import load_model_and_tokenizer, tokenize_splits

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from find_syncs import NAMED

    cfg = make_config("smoke", model_name_or_path=tiny_model_dir, num_train_epochs=2, per_device_train_batch_size=8,
                      max_train_samples=96, max_eval_samples=16, logging_steps=100, progress=False,
                      save_total_limit=0)
    model, tokenizer = load_model_and_tokenizer(tiny_model_dir)
    model.config._attn_implementation = attention
    tokenized = tokenize_splits(load_nli_splits("sample", max_train_samples=96, max_eval_samples=16), tokenizer, 64)
    reads = ScalarReads()
    with reads:
        result = train.train(cfg, model, tokenizer, tokenized, device=torch.device("cpu"), precision=precision)
    steps = result.metrics["train"]["steps"]
    assert steps == 24 and result.metrics["train"]["final_loss"] < 1.2
    assert reads.sites.pop("train", 0) == cfg.num_train_epochs, "the epoch seed, drawn once an epoch on the CPU"
    # transformers' length grouping puts the longest batch first (an argmax of CPU lengths), once an epoch
    assert reads.sites.pop("get_length_grouped_indices", 0) == cfg.num_train_epochs
    assert set(reads.sites) <= set(NAMED), reads.sites
    assert reads.sites == ({"optimizer_step": steps} if precision == "fp16" else {}), reads.sites

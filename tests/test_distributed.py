"""Multi-worker training: CLUSTER_SPEC parsing, the torchrun command, and a real 2-process gloo run."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from nli_helpers.config import NLIError
from nli_helpers.vertex import launch
from nli_helpers.vertex.launch import (
    ClusterSpecError,
    avoid_a_small_shm,
    check_reduction_server_plugin,
    cluster_layout,
    torchrun_command,
)
from tests.helpers import ROOT, free_port


def spec(task_type, index=0, workers=0, reducers=0):
    cluster = {"workerpool0": ["chief-0:2222"]}
    if workers:
        cluster["workerpool1"] = [f"worker-{i}:2222" for i in range(workers)]
    if reducers:
        cluster["workerpool2"] = [f"reducer-{i}:2222" for i in range(reducers)]
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index},
                       "environment": "cloud", "job": "{}"})


def test_chief_only():
    layout = cluster_layout(spec("workerpool0"))
    assert (layout.nnodes, layout.node_rank, layout.master_addr, layout.master_port, layout.role) == (
        1, 0, "chief-0", 2222, "chief")


def test_chief_and_workers_number_nodes_chief_first():
    assert cluster_layout(spec("workerpool0", workers=3)).node_rank == 0
    layout = cluster_layout(spec("workerpool1", index=2, workers=3))
    assert (layout.nnodes, layout.node_rank, layout.master_addr, layout.role) == (4, 3, "chief-0", "worker")


def test_reduction_servers_are_not_torch_nodes():
    assert cluster_layout(spec("workerpool1", index=0, workers=1, reducers=4)).nnodes == 2
    assert cluster_layout(spec("workerpool2", index=1, workers=1, reducers=4)).role == "reduction_server"


def test_no_cluster_spec_is_one_node_and_bad_spec_is_an_error():
    assert cluster_layout(None, env={}).nnodes == 1
    with pytest.raises(ClusterSpecError, match="CLUSTER_SPEC is malformed"):
        cluster_layout('{"cluster": {}}')


def test_torchrun_command_line():
    layout = cluster_layout(spec("workerpool1", index=0, workers=1))
    cmd = torchrun_command(layout, 4, ["--profile", "full"], rendezvous_timeout_s=900)
    assert cmd[1:3] == ["-m", "torch.distributed.run"]
    for arg in ("--nnodes=2", "--node-rank=1", "--nproc-per-node=4", "--master-addr=chief-0",
                "--master-port=2222", "--rdzv-conf=timeout=900"):
        assert arg in cmd
    assert cmd[-4:] == ["--module", "nli_helpers.vertex.entry", "--profile", "full"]


def test_launcher_dry_run_reads_cluster_spec_and_refuses_reduction_servers():
    env = {**os.environ, "CLUSTER_SPEC": spec("workerpool1", index=0, workers=2)}
    run = subprocess.run([sys.executable, "-m", "nli_helpers.vertex.launch", "--dry-run", "--", "--epochs", "1"],
                         capture_output=True, text=True, env=env, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    assert "worker node 1/3" in run.stdout and "--nproc-per-node=1" in run.stdout
    env["CLUSTER_SPEC"] = spec("workerpool2", workers=2, reducers=1)
    run = subprocess.run([sys.executable, "-m", "nli_helpers.vertex.launch", "--dry-run"], capture_output=True,
                         text=True, env=env, cwd=ROOT)
    assert run.returncode == 2 and "Reduction Server pool" in run.stderr
    env["CLUSTER_SPEC"] = spec("workerpool1", workers=1, reducers=2)  # a training node, beside two reducers
    run = subprocess.run([sys.executable, "-m", "nli_helpers.vertex.launch", "--dry-run"], capture_output=True,
                         text=True, env=env, cwd=ROOT)
    # On this CPU gloo reduces: no NCCL, no plugin to check (a GPU node's check: the next test).
    assert run.returncode == 0 and "2 Reduction Server replica(s), but no CUDA GPU here" in run.stderr, run.stderr


def fake_plugin(folder, name: str, symbol: str) -> str:
    """A shared library that exports `symbol`, as an NCCL network plugin exports its API struct."""
    if not shutil.which("cc"):
        pytest.skip("building a fake NCCL plugin needs a C compiler (cc)")
    source = folder / f"{name}.c"
    source.write_text(f"const int {symbol} = 1;\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(folder / f"lib{name}.so"), str(source)], check=True)
    return str(folder / f"lib{name}.so")


def test_a_training_node_beside_reducers_stops_unless_nccl_loads_its_network_plugin(monkeypatch, capsys, tmp_path):
    """NCCL loads libnccl-net.so, or libnccl-net-$NCCL_NET_PLUGIN.so (NVIDIA/nccl ext-net/README.md), through the
    newest `ncclNetPlugin_vN` symbol it supports (src/plugin/net.cc): 6 to 11 in NCCL 2.28."""
    monkeypatch.setattr(os, "environ", {})  # what the launcher sets for NCCL stays in this test
    libraries = {"nccl-net": fake_plugin(tmp_path, "nccl-net", "ncclNetPlugin_v8"),
                 "nccl-net-old": fake_plugin(tmp_path, "nccl-net-old", "ncclNetPlugin_v5")}
    monkeypatch.setattr(launch.ctypes.util, "find_library", libraries.get)
    monkeypatch.setattr(launch, "image_nccl_version", lambda: (2, 28, 9))
    monkeypatch.setattr(launch, "visible_gpus", lambda: 1)  # a GPU node
    check_reduction_server_plugin(cluster_layout(spec("workerpool0", workers=1)))  # no reducers: nothing to say
    assert capsys.readouterr().err == "" and os.environ == {}
    check_reduction_server_plugin(cluster_layout(spec("workerpool0", workers=1, reducers=2)))
    assert "2 Reduction Server replica(s): NCCL's network plugin libnccl-net.so loads" in capsys.readouterr().err
    assert os.environ == {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}  # NCCL says which it loads
    os.environ.update(NCCL_DEBUG="WARN", NCCL_NET_PLUGIN="old")  # the user's choices stand
    with pytest.raises(NLIError, match=r"2 Reduction Server replica\(s\) would be billed for nothing: .*"
                                       r"libnccl-net-old.so exports none of the ncclNetPlugin_v6..v11 symbols "
                                       r"that NCCL 2.28.9 loads"):
        check_reduction_server_plugin(cluster_layout(spec("workerpool1", workers=1, reducers=2)))
    assert os.environ["NCCL_DEBUG"] == "WARN"
    os.environ["NCCL_NET_PLUGIN"] = "gib"
    with pytest.raises(NLIError, match=r"there is no libnccl-net-gib.so here"):
        check_reduction_server_plugin(cluster_layout(spec("workerpool1", workers=1, reducers=2)))


def test_the_image_build_check_fails_on_a_plugin_the_image_s_nccl_does_not_load(monkeypatch, capsys, tmp_path):
    """docker/Dockerfile runs `python -m nli_helpers.vertex.launch --check-nccl-plugin` after installing the plugin."""
    plugin = fake_plugin(tmp_path, "nccl-net", "ncclNetPlugin_v12")
    monkeypatch.setattr(launch.ctypes.util, "find_library", {"nccl-net": plugin}.get)
    monkeypatch.setattr(launch, "image_nccl_version", lambda: (2, 30, 7))
    assert launch.main(["--check-nccl-plugin"]) == 0
    assert "NCCL 2.30.7 loads the Reduction Server's network plugin" in capsys.readouterr().out
    monkeypatch.setattr(launch, "image_nccl_version", lambda: (2, 28, 3))  # v12 came with 2.30.3
    assert launch.main(["--check-nccl-plugin"]) == 2
    assert "exports none of the ncclNetPlugin_v6..v11 symbols that NCCL 2.28.3 loads" in capsys.readouterr().err
    monkeypatch.setattr(launch, "image_nccl_version", lambda: ())  # a torch without NCCL: the check cannot tell
    assert launch.main(["--check-nccl-plugin"]) == 2
    assert "this torch's NCCL (none) is older than 2.27.0" in capsys.readouterr().err


def train_args(job_dir, per_device_batch, model_dir, *extra):
    return ["--profile", "smoke", "--data", "sample", "--model_name_or_path", model_dir, "--num_train_epochs", "2",
            "--per_device_train_batch_size", str(per_device_batch), "--max_train_samples", "192",
            "--logging_steps", "1", "--precision", "fp32", "--no-progress",
            *(["--output_dir", str(job_dir)] if job_dir else []), *extra]


def read_run(job_dir):
    history = [json.loads(line) for line in (job_dir / "history.jsonl").read_text().splitlines()]
    return history, json.loads((job_dir / "metrics.json").read_text())


ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def one_process(tmp_path_factory, tiny_model_dir):
    """The single-process run that two processes at the same global batch must match."""
    job_dir = tmp_path_factory.mktemp("one")
    one = subprocess.run([sys.executable, "-m", "nli_helpers.task", *train_args(job_dir, 16, tiny_model_dir)],
                         capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=600)
    assert one.returncode == 0, one.stderr
    return read_run(job_dir)


def torchrun(args, cwd):
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
                           f"--master-port={free_port()}", "--module", "nli_helpers.task", *args],
                          capture_output=True, text=True, env=ENV, cwd=cwd, timeout=600)


def test_two_gloo_processes_match_one_process_at_the_same_global_batch(tmp_path, tiny_model_dir, one_process):
    # The same global batch (2 processes x 8 pairs per device = 1 x 16: 12 steps an epoch); and a time budget
    # for checkpoints (6 ms: due after every step), which rank 0's clock decides for both ranks at their
    # agreement every --sync_every steps: a rank that disagreed would hang in the checkpoint.
    # Without --output_dir (run from tmp_path): rank 0 names runs/train-<time> for both ranks.
    two_args = train_args(None, 8, tiny_model_dir, "--checkpoint_every_minutes=0.0001", "--sync_every=3")
    two = torchrun(two_args, tmp_path)
    assert two.returncode == 0, two.stderr[-3000:]
    [two_dir] = (tmp_path / "runs").iterdir()  # one folder, the two ranks' run
    assert two_dir.name.startswith("train-")
    (h1, m1), (h2, m2) = one_process, read_run(two_dir)
    assert [r["step"] for r in h1] == [r["step"] for r in h2]
    assert [r["loss"] for r in h2] == pytest.approx([r["loss"] for r in h1], abs=2e-4)  # mean, not 2x
    for split in ("validation_matched", "validation_mismatched"):
        assert m2[split]["n"] == m1[split]["n"] == sum(map(sum, m1[split]["confusion_matrix"]))
        assert m2[split]["confusion_matrix"] == m1[split]["confusion_matrix"]
        assert m2[split]["accuracy"] == m1[split]["accuracy"]
    assert (m2["train"]["processes"], m2["train"]["global_batch"], m2["train"]["per_process_batch"]) == (2, 16, 8)
    assert (m1["train"]["processes"], m1["train"]["global_batch"], m1["train"]["steps"]) == (1, 16, 24)
    timed = re.findall(r"checkpoint at step (\d+): .* \(--checkpoint_every_minutes 0.0001\)",
                       two.stdout)
    # logged by rank 0, at the agreements (every 3rd step), between epoch ends
    assert timed and all(int(step) % 12 and int(step) % 3 == 0 for step in timed), timed
    kept = sorted((two_dir / "checkpoints").glob("checkpoint-*"))
    assert [p.name for p in kept] == [f"checkpoint-{int(step):08d}" for step in timed[-2:]]
    assert two.stdout.count("eval step") == len(m2["eval_history"])  # one line per evaluation: only rank 0 logs
    assert two.stdout.count("done in") == two.stdout.count("saved to") == 1


def test_two_compiled_gloo_processes_match_one_eager_process(tmp_path, tiny_model_dir, one_process):
    # torch.compile over DDP: DDP's own forward runs outside the graphs (its hooks and logger, 2 graph breaks in
    # each of 2 compiles), and dynamo splits the model's graph at DDP's gradient buckets. 192 pairs in global
    # batches of 16 leave no short batch to drop, so the steps are the eager ones.
    two = torchrun(train_args(tmp_path / "two", 8, tiny_model_dir, "--torch_compile"), ROOT)
    assert two.returncode == 0, two.stderr[-3000:]
    (h1, m1), (h2, m2) = one_process, read_run(tmp_path / "two")
    assert [r["loss"] for r in h2] == pytest.approx([r["loss"] for r in h1], abs=1e-3)
    assert m2["validation_matched"]["confusion_matrix"] == m1["validation_matched"]["confusion_matrix"]
    compile_counts = m2["train"]["compile"]
    assert compile_counts["graphs"] <= 2 and compile_counts["recompiles"] <= 2, compile_counts
    assert compile_counts["dropped_per_epoch"] == 0 and compile_counts["cudagraph_skips"] == 0


def test_the_launcher_turns_nccls_shared_memory_off_where_dev_shm_is_a_containers_64_mb(tmp_path, monkeypatch,
                                                                                          capsys):
    shm = tmp_path / "shm"
    shm.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(shm)], capture_output=True).returncode:
        pytest.skip("mounting a 64 MB tmpfs needs root")
    monkeypatch.setenv("NCCL_SHM_DISABLE", "unset at the end")
    try:
        monkeypatch.delenv("NCCL_SHM_DISABLE")
        avoid_a_small_shm(1, str(shm))  # one process per node: no NCCL peers on it
        assert "NCCL_SHM_DISABLE" not in os.environ
        avoid_a_small_shm(2, str(tmp_path))  # a disk's size: room enough
        assert "NCCL_SHM_DISABLE" not in os.environ
        avoid_a_small_shm(2, str(shm))
        assert os.environ["NCCL_SHM_DISABLE"] == "1"
        assert f"[launch] {shm} holds 64 MB" in capsys.readouterr().err
    finally:
        subprocess.run(["umount", str(shm)], check=True)


def test_a_two_rank_tuning_trial_on_gloo_reports_its_metric_once_per_evaluation(tmp_path, tiny_model_dir):
    """A multi-GPU tuning trial, as Vertex AI starts one (only CLOUD_ML_TRIAL_ID and CLOUD_ML_HP_METRIC_FILE say so),
    through the launcher on 2 CPU processes: every rank builds the hypertune callback, and cloudml-hypertune's
    HyperTune() makes the metric file's folder without exist_ok; only the main process may make it and report."""
    metric_file = tmp_path / "hypertune" / "output.metrics"
    env = {**ENV, "CLOUD_ML_TRIAL_ID": "3", "CLOUD_ML_HP_METRIC_FILE": str(metric_file)}
    env.pop("CLUSTER_SPEC", None)
    run = subprocess.run([sys.executable, "-m", "nli_helpers.vertex.launch", "--nproc-per-node", "2", "--",
                          *train_args(tmp_path / "trial", 8, tiny_model_dir, "--eval_steps", "12",
                                      "--save_total_limit", "0")],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    reports = [json.loads(line) for line in metric_file.read_text().splitlines()]
    _, metrics = read_run(tmp_path / "trial" / "trial-3")  # a trial's own folder under the one its args name
    assert len(reports) == len(metrics["eval_history"]) >= 2  # once per evaluation, not once per rank
    assert float(reports[-1]["validation_matched_accuracy"]) == metrics["validation_matched"]["accuracy"]

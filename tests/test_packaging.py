"""The trainer's sdist, installed the way docker/Dockerfile installs it into the trainer image, trains on smoke.

The image's stand-in (`trainer_image_python`, shared with the Vertex tests) is a venv that first held only the
pinned torch; the sdist went in on top, with its [smoke] extra, under constraints.txt, and must have left that
torch alone. `localcloud.image.image_venv` caches it by the sdist's content, so it was built from exactly this package,
and notebook 03, the local Vertex fake's jobs and these tests share it.
"""

from __future__ import annotations

import functools
import http.server
import json
import shutil
import subprocess
import sys
import tarfile
import threading
import zipfile

from localcloud import image
from nli_helpers.config import make_config
from tests.helpers import ROOT, free_port

pytest_plugins = ["tests.fake_vertex"]  # fixtures: trainer_image_python, sdist_path


def test_sdist_holds_the_package_and_its_sample_and_nothing_else(tmp_path):
    modules = {f"nli_helpers/{p.name}" for p in (ROOT / "nli_helpers").glob("*.py")}
    sdist = image.build_sdist(tmp_path)  # a fresh build: the session's may predate a module added since
    with tarfile.open(sdist) as tar:  # less the top folder, nli_helpers-0.1.0/
        names = {m.name.split("/", 1)[1] for m in tar.getmembers() if m.isfile() and "/" in m.name}
    assert modules <= names, f"modules missing from the sdist: {sorted(modules - names)}"
    assert "nli_helpers/sample/mnli_sample.jsonl" in names
    assert "pyproject.toml" in names
    unwanted = sorted(n for n in names if n.split("/")[0] in ("tests", "runs", ".venv", "notebooks", "dist", "build",
                                                               "benchmarks", "docker", ".git"))
    assert not unwanted, f"the sdist should hold only the package: {unwanted}"


def test_the_wheel_holds_the_package_and_its_license_and_nothing_else(tmp_path):
    """`pip wheel .` in a copy of the checkout (setuptools leaves build/ behind, and a stale build/lib would go into
    the next wheel): localcloud/ (the practice stand-ins) is a project of its own."""
    tree = shutil.copytree(ROOT, tmp_path / "checkout", ignore=shutil.ignore_patterns(
        ".*", "runs", "build", "dist", "*.egg-info", "__pycache__", "notebooks", "benchmarks", "tests"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--wheel-dir", str(tmp_path), str(tree)], check=True)
    [wheel] = tmp_path.glob("nli_helpers-*.whl")
    tops = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert tops == {"nli_helpers", "nli_helpers-0.1.0.dist-info"}, tops
    assert "nli_helpers-0.1.0.dist-info/licenses/LICENSE" in zipfile.ZipFile(wheel).namelist()


def test_sdist_installs_over_the_image_torch_and_trains(trainer_image_python, sdist_path, tmp_path):
    python = trainer_image_python
    torch_there = image.installed_version(python, "torch", cwd=tmp_path)
    assert torch_there.split("+")[0] == image.pinned_torch(), "installing the sdist replaced the image's torch"
    assert image.installed_version(python, "nli-helpers", cwd=tmp_path) == "0.1.0"
    check = image.run_module(python, "pip", ["check"], cwd=tmp_path)
    assert check.returncode == 0, check.stdout

    where = image.run_module(python, "nli_helpers.task", ["--help"], cwd=tmp_path)
    assert where.returncode == 0 and "--max_train_samples" in where.stdout
    located = image.run_module(python, "pip", ["show", "-f", "nli-helpers"], cwd=tmp_path).stdout
    assert "site-packages" in located and str(ROOT) not in located  # the installed copy, not the checkout

    # The image carries the smoke model (the [smoke] extra): a job on the default path trains real weights. The
    # data is the sample the image carries: mnli-subset found beside this checkout is not beside the installed copy.
    cfg = make_config("smoke", data="sample", max_train_samples=64, num_train_epochs=1,
                      output_dir=str(tmp_path / "job"))
    assert cfg.model_name_or_path == "minilm-l6"
    run = image.run_module(python, "nli_helpers.vertex.entry", [*cfg.to_cli_args(), "--no-progress"],
                           cwd=tmp_path, env=image.OFFLINE_ENV)
    assert run.returncode == 0, run.stderr[-3000:]
    metrics = json.loads((tmp_path / "job" / "metrics.json").read_text())
    assert metrics["train"]["examples"] == 64
    assert metrics["parameters"] > 20e6  # MiniLM-L6, not the tiny random model
    assert 0 <= metrics["validation_matched"]["accuracy"] <= 1


def test_the_image_venv_is_built_once_per_package_content(trainer_image_python, sdist_path, tmp_path):
    again = image.image_venv(sdist_path)
    assert (again.python, again.reused) == (trainer_image_python, True)
    assert again.torch.split("+")[0] == image.pinned_torch()
    # Two builds of one tree differ in timestamps only: the same key, so notebook 03 reuses the fake's venv.
    rebuilt = image.build_sdist(tmp_path)
    assert image.sdist_digest(rebuilt) == image.sdist_digest(sdist_path)
    # Anything else that goes into the venv changes the key.
    assert image.sdist_digest(sdist_path, b"smoke") != image.sdist_digest(sdist_path, b"")


def test_old_image_venvs_go_but_the_newest_and_a_build_under_way_stay(tmp_path, monkeypatch):
    import os

    from filelock import FileLock

    monkeypatch.setenv("NLI_CACHE_DIR", str(tmp_path))
    venvs = tmp_path / "image-venv"
    for age, key in enumerate(["newest", "second", "third", "killed-build", "building"]):
        (venvs / key / "venv").mkdir(parents=True)
        (venvs / f"{key}.lock").touch()
        if "build" not in key:
            (venvs / key / "image.json").write_text("{}")
            os.utime(venvs / key / "image.json", (1e9 - age, 1e9 - age))
    with FileLock(str(venvs / "building") + ".lock"):  # another process is building this one
        assert image.remove_image_venvs(keep=image.KEEP_IMAGE_VENVS) == 2
    assert sorted(p.name for p in venvs.iterdir() if p.is_dir()) == ["building", "newest", "second"]
    assert not (venvs / "third.lock").exists()
    assert image.remove_image_venvs() == 3  # notebook 03's clean-up: every finished one


def test_the_image_stand_in_takes_torch_from_the_cpu_index_when_it_answers(tmp_path, monkeypatch):
    """As `make venv` does: PyPI's default Linux torch is the CUDA build with several GB of nvidia-* wheels."""
    monkeypatch.setattr(image.shutil, "which", lambda name: None)  # no nvidia-smi
    monkeypatch.setattr(image.sys, "platform", "linux")
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "index.html").write_text("<a>torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl</a>")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        index = f"http://127.0.0.1:{server.server_port}"
        assert image.torch_index(index) == ["--index-url", index]
    finally:
        server.shutdown()
    assert image.torch_index(f"http://127.0.0.1:{free_port()}") == []  # nothing answers: PyPI's default

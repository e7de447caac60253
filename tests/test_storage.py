"""nli_helpers.storage against a real local Cloud Storage (gcp-storage-emulator), no mocks.

Needs the fixtures in tests/gcs_emulator.py (registered by tests/conftest.py, or run
`python -m pytest -p tests.gcs_emulator tests/test_storage.py`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from google.cloud import storage as gcs

from nli_helpers import storage
from nli_helpers.config import NLIError
from nli_helpers.storage import (
    StorageError,
    _local_path_under,
    copy,
    crc32c_of_file,
    download,
    exists,
    get_client,
    is_gcs_uri,
    list_uris,
    split_gcs_uri,
    upload,
    verify_upload,
)
from tests.helpers import ROOT

if TYPE_CHECKING:
    from tests.gcs_emulator import GcsEmulator

# Sizes around google-cloud-storage's 8 MiB switch from one-shot to resumable uploads.
FILE_SIZES = [0, 1_000, 9 * 1024 * 1024]
NESTED_TREE = {
    "config.json": b'{"labels": 3}',
    "checkpoint-1/model.safetensors": os.urandom(50_000),
    "checkpoint-1/optimizer/state.pt": os.urandom(3_000),
    "logs/with space.txt": b"epoch 1\n",
    "empty.bin": b"",
}


def write_tree(root: Path, tree: dict[str, bytes]) -> Path:
    for relative, content in tree.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_bytes(content)
    return root


def read_tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def put(bucket: str, name: str, content: bytes = b"x") -> None:
    get_client().bucket(bucket).blob(name).upload_from_string(content)


# --- URIs -------------------------------------------------------------------------------------

@pytest.mark.parametrize("uri, expected", [
    ("gs://b/a/b.txt", ("b", "a/b.txt")),
    ("gs://b", ("b", "")),
    ("gs://b/", ("b", "")),
    ("gs://b/dir/", ("b", "dir/")),
])
def test_split_gcs_uri(uri: str, expected: tuple[str, str]) -> None:
    assert is_gcs_uri(uri)
    assert split_gcs_uri(uri) == expected


@pytest.mark.parametrize("uri", ["gs://", "gs:///x", "s3://b/x", "b/x", "/tmp/x"])
def test_malformed_uri_raises_storage_error(uri: str) -> None:
    with pytest.raises(StorageError, match="gs://BUCKET/PATH"):
        split_gcs_uri(uri)


def test_local_paths_are_not_gcs_uris() -> None:
    assert not is_gcs_uri("runs/x")
    assert not is_gcs_uri(Path("gs:/b"))  # what Path("gs://b") collapses to
    assert issubclass(StorageError, NLIError)


# --- round trips ------------------------------------------------------------------------------

@pytest.mark.parametrize("size", FILE_SIZES)
def test_file_round_trip_is_byte_identical(gcs_bucket: str, tmp_path: Path, size: int) -> None:
    source = tmp_path / "model.bin"
    source.write_bytes(os.urandom(size))
    uri = f"gs://{gcs_bucket}/runs/model.bin"

    assert upload(source, uri) == [uri]
    landed = download(uri, tmp_path / "back" / "model.bin")

    assert landed == tmp_path / "back" / "model.bin"
    assert landed.read_bytes() == source.read_bytes()


def test_file_upload_to_prefix_and_download_into_directory_keep_name(gcs_bucket: str, tmp_path: Path) -> None:
    source = tmp_path / "metrics.json"
    source.write_text("{}")
    assert upload(source, f"gs://{gcs_bucket}/runs/") == [f"gs://{gcs_bucket}/runs/metrics.json"]
    (tmp_path / "out").mkdir()
    landed = download(f"gs://{gcs_bucket}/runs/metrics.json", tmp_path / "out")
    assert landed == tmp_path / "out" / "metrics.json"


def test_nested_directory_round_trip_is_byte_identical(gcs_bucket: str, tmp_path: Path) -> None:
    source = write_tree(tmp_path / "run", NESTED_TREE)
    uri = f"gs://{gcs_bucket}/jobs/run-1"

    uploaded = upload(source, uri)
    landed = download(uri, tmp_path / "back")

    assert uploaded == sorted(f"{uri}/{name}" for name in NESTED_TREE)
    assert landed == tmp_path / "back"
    assert read_tree(landed) == NESTED_TREE


# --- listing and existence --------------------------------------------------------------------

def test_list_uris_is_sorted_and_respects_directory_boundaries(gcs_bucket: str) -> None:
    for name in ["runs/b.txt", "runs/a/x.txt", "runs-old/y.txt", "runs/folder/", "other.txt"]:
        put(gcs_bucket, name)

    expected = [f"gs://{gcs_bucket}/runs/a/x.txt", f"gs://{gcs_bucket}/runs/b.txt"]
    assert list_uris(f"gs://{gcs_bucket}/runs") == expected
    assert list_uris(f"gs://{gcs_bucket}/runs/") == expected
    assert list_uris(f"gs://{gcs_bucket}/runs/b.txt") == [expected[1]]
    assert len(list_uris(f"gs://{gcs_bucket}")) == 4  # the console's "folder/" placeholder is skipped
    assert list_uris(f"gs://{gcs_bucket}/nothing") == []


@pytest.mark.parametrize("path, expected", [
    ("runs/a.txt", True),     # an object
    ("runs", True),           # a "directory"
    ("runs/", True),
    ("run", False),           # a prefix of a name, not a directory
    ("runs/a", False),
    ("missing.txt", False),
    ("empty-folder", False),
    ("", True),               # the bucket itself
])
def test_exists(gcs_bucket: str, path: str, expected: bool) -> None:
    put(gcs_bucket, "runs/a.txt")
    put(gcs_bucket, "empty-folder/")  # a console placeholder: no content, so not "existing"
    assert exists(f"gs://{gcs_bucket}/{path}") is expected


def test_exists_is_false_for_a_missing_bucket(gcs_emulator: GcsEmulator) -> None:
    assert not exists("gs://no-such-bucket-xyz/a.txt")
    assert not exists("gs://no-such-bucket-xyz")


# --- errors a user can meet -------------------------------------------------------------------

def test_download_of_missing_object_names_the_uri(gcs_bucket: str, tmp_path: Path) -> None:
    uri = f"gs://{gcs_bucket}/runs/nope.bin"
    with pytest.raises(StorageError, match=f"{uri} does not exist"):
        download(uri, tmp_path / "nope.bin")
    assert list(tmp_path.iterdir()) == []


def test_download_from_missing_bucket_names_it_and_role(gcs_emulator: GcsEmulator, tmp_path: Path) -> None:
    with pytest.raises(StorageError, match=r"bucket gs://no-such-bucket-xyz does not exist.*objectViewer"):
        download("gs://no-such-bucket-xyz/model.bin", tmp_path / "model.bin")
    with pytest.raises(StorageError, match="gs://no-such-bucket-xyz"):
        list_uris("gs://no-such-bucket-xyz/runs")


def test_upload_to_missing_bucket_names_it_and_role(gcs_emulator: GcsEmulator, tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("a")
    with pytest.raises(StorageError, match=r"bucket gs://no-such-bucket-xyz does not exist.*objectUser"):
        upload(tmp_path / "a.txt", "gs://no-such-bucket-xyz/a.txt")


def test_upload_of_missing_local_path(gcs_bucket: str, tmp_path: Path) -> None:
    with pytest.raises(StorageError, match="no such file or directory"):
        upload(tmp_path / "absent", f"gs://{gcs_bucket}/x")


def test_download_refuses_object_names_that_escape_the_target(tmp_path: Path) -> None:
    # Real Cloud Storage allows names like "runs/../../x"; the emulator refuses to store them,
    # so this checks the guard that download() applies to every object name directly.
    inside = _local_path_under(tmp_path, "a/b.txt", "gs://b/runs")
    assert inside == tmp_path / "a" / "b.txt"
    with pytest.raises(StorageError, match="escapes"):
        _local_path_under(tmp_path / "target", "../../escaped.txt", "gs://b/runs")


# --- integrity: CRC32C and atomic downloads ---------------------------------------------------

def test_crc32c_of_file_matches_standard_vector_and_server(gcs_bucket: str, tmp_path: Path) -> None:
    check = tmp_path / "check.txt"
    check.write_bytes(b"123456789")
    assert crc32c_of_file(check) == "4waSgw=="  # CRC-32C check value 0xE3069283, base64

    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(3 * 1024 * 1024 + 7))  # several read chunks
    upload(big, f"gs://{gcs_bucket}/big.bin")
    assert get_client().bucket(gcs_bucket).get_blob("big.bin").crc32c == crc32c_of_file(big)


def test_verify_upload_accepts_the_same_bytes_and_rejects_others(gcs_bucket: str, tmp_path: Path) -> None:
    good, other = tmp_path / "good.bin", tmp_path / "other.bin"
    good.write_bytes(b"weights v1")
    other.write_bytes(b"weights v2")
    upload(good, f"gs://{gcs_bucket}/w.bin")

    fresh_handle = get_client().bucket(gcs_bucket).blob("w.bin")  # no metadata: verify must reload
    verify_upload(good, fresh_handle)
    assert fresh_handle.crc32c == crc32c_of_file(good)
    with pytest.raises(StorageError, match="corrupt.*upload it again"):
        verify_upload(other, fresh_handle)


def test_verify_upload_catches_corruption_on_the_server(
    gcs_emulator: GcsEmulator, gcs_bucket: str, tmp_path: Path
) -> None:
    source = tmp_path / "w.bin"
    source.write_bytes(b"weights")
    upload(source, f"gs://{gcs_bucket}/w.bin")
    gcs_emulator.corrupt_checksums(gcs_bucket, "w.bin")
    with pytest.raises(StorageError, match="corrupt"):
        verify_upload(source, get_client().bucket(gcs_bucket).blob("w.bin"))


def test_corrupt_download_leaves_old_file_and_no_temp_files(
    gcs_emulator: GcsEmulator, gcs_bucket: str, tmp_path: Path
) -> None:
    put(gcs_bucket, "model.bin", b"new weights")
    gcs_emulator.corrupt_checksums(gcs_bucket, "model.bin")
    dest = tmp_path / "model.bin"
    dest.write_bytes(b"old weights")

    with pytest.raises(StorageError, match="corrupt"):
        download(f"gs://{gcs_bucket}/model.bin", dest)

    assert dest.read_bytes() == b"old weights"
    assert [p.name for p in tmp_path.iterdir()] == ["model.bin"]


def test_directory_download_leaves_no_temp_files(gcs_bucket: str, tmp_path: Path) -> None:
    upload(write_tree(tmp_path / "run", NESTED_TREE), f"gs://{gcs_bucket}/run")
    landed = download(f"gs://{gcs_bucket}/run", tmp_path / "back")
    all_names = {p.relative_to(landed).as_posix() for p in landed.rglob("*") if p.is_file()}
    assert all_names == set(NESTED_TREE)


# --- copy() dispatch --------------------------------------------------------------------------

def test_copy_in_every_supported_direction(gcs_bucket: str, tmp_path: Path) -> None:
    source = write_tree(tmp_path / "run", NESTED_TREE)
    uri = f"gs://{gcs_bucket}/copied"

    assert len(copy(source, uri)) == len(NESTED_TREE)                       # local -> gs
    written = copy(uri, tmp_path / "from-gcs")                               # gs -> local
    assert sorted(written) == sorted(str(tmp_path / "from-gcs" / n) for n in NESTED_TREE)
    copy(tmp_path / "from-gcs", tmp_path / "local-copy")                    # local -> local, dir
    copy(source / "config.json", tmp_path / "single" / "config.json")       # local -> local, file
    copy(str(source / "config.json"), f"{uri}-file/config.json")            # str paths too
    copy(f"{uri}-file/config.json", str(tmp_path / "single-back.json"))

    assert read_tree(tmp_path / "local-copy") == NESTED_TREE
    assert (tmp_path / "single" / "config.json").read_bytes() == NESTED_TREE["config.json"]
    assert (tmp_path / "single-back.json").read_bytes() == NESTED_TREE["config.json"]


def test_copy_rejects_bucket_to_bucket_and_missing_local_source(gcs_bucket: str, tmp_path: Path) -> None:
    with pytest.raises(StorageError, match="gcloud storage cp"):
        copy(f"gs://{gcs_bucket}/a", f"gs://{gcs_bucket}/b")
    with pytest.raises(StorageError, match="no such file"):
        copy(tmp_path / "absent", tmp_path / "dst")


# --- clients and credentials ------------------------------------------------------------------

def test_client_is_cached_per_emulator_and_project(gcs_emulator: GcsEmulator) -> None:
    client = get_client()
    assert isinstance(client, gcs.Client)
    assert get_client() is client
    assert get_client("other-project") is not client
    get_client.cache_clear()
    assert get_client() is not client


def test_client_without_credentials_explains_how_to_log_in(tmp_path: Path) -> None:
    # A fresh process with no emulator, no ADC file and no GCE metadata server to ask.
    env = {k: v for k, v in os.environ.items()
           if k not in {"STORAGE_EMULATOR_HOST", "GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT"}}
    env.update(HOME=str(tmp_path), CLOUDSDK_CONFIG=str(tmp_path / "gcloud"),
               NO_GCE_CHECK="true",  # google.auth compares with the lowercase string
               GCE_METADATA_HOST="127.0.0.1:9", GCE_METADATA_IP="127.0.0.1:9")
    script = textwrap.dedent("""
        from nli_helpers.storage import StorageError, get_client
        try:
            get_client()
        except StorageError as err:
            print(err)
        else:
            raise SystemExit("expected StorageError")
    """)
    result = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "gcloud auth application-default login" in result.stdout
    assert "GOOGLE_APPLICATION_CREDENTIALS" in result.stdout


def test_local_copy_gives_a_gs_object_as_a_local_file_and_removes_it_afterwards(gcs_bucket, tmp_path):
    source = tmp_path / "pairs.jsonl"
    source.write_text('{"premise": "a", "hypothesis": "b", "label": 0}\n')
    upload(source, f"gs://{gcs_bucket}/data/pairs.jsonl")
    with storage.local_copy(f"gs://{gcs_bucket}/data/pairs.jsonl") as local:
        assert local.name == "pairs.jsonl" and local.read_text() == source.read_text()
    assert not local.exists() and not local.parent.exists()  # the temporary folder is gone
    with storage.local_copy(source) as same:  # a local path passes through untouched
        assert same == source
    assert source.exists()


def test_staged_output_uploads_on_success_only_and_cleans_up(gcs_bucket, tmp_path):
    target = f"gs://{gcs_bucket}/runs/ok"
    with storage.staged_output(target) as folder:
        (folder / "metrics.json").write_text("{}")
        (folder / "sub").mkdir()
        (folder / "sub" / "x.txt").write_text("x")
    assert sorted(storage.list_uris(target)) == [f"{target}/metrics.json", f"{target}/sub/x.txt"]
    assert not folder.exists()
    with pytest.raises(RuntimeError), storage.staged_output(f"gs://{gcs_bucket}/runs/failed") as folder:
        (folder / "half.txt").write_text("half")
        raise RuntimeError("the run failed")
    assert storage.list_uris(f"gs://{gcs_bucket}/runs/failed") == [] and not folder.exists()
    with storage.staged_output(tmp_path / "local" / "run") as here:  # a local target is written in place
        (here / "a.txt").write_text("a")
    assert (tmp_path / "local" / "run" / "a.txt").read_text() == "a"


def test_an_unreachable_endpoint_is_one_clear_error_within_the_retry_budget(monkeypatch):
    import socket
    import time

    from nli_helpers import storage

    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{port}")
    monkeypatch.setattr(storage, "RETRY", storage.DEFAULT_RETRY.with_timeout(2.0))  # the 30 s budget, shortened
    storage.get_client.cache_clear()
    start = time.monotonic()
    try:
        with pytest.raises(storage.StorageError, match=f"cannot reach Cloud Storage at http://127.0.0.1:{port}"):
            storage.list_uris("gs://some-bucket/runs/")
    finally:
        storage.get_client.cache_clear()
    assert time.monotonic() - start < 15

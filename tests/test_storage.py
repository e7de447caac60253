"""nli_helpers.storage against a real local Cloud Storage (gcp-storage-emulator), no mocks.

Needs the fixtures in tests/gcs_emulator.py (registered by tests/conftest.py, or run
`python -m pytest -p tests.gcs_emulator tests/test_storage.py`).
"""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

import gcsfs.retry
import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage as gcs

from nli_helpers import storage
from nli_helpers.config import NLIError
from nli_helpers.storage import (
    StorageError,
    _local_path_under,
    delete,
    download,
    exists,
    is_gcs_uri,
    list_uris,
    split_gcs_uri,
    upload,
)
from tests.helpers import error_without_credentials

if TYPE_CHECKING:
    from tests.gcs_emulator import GcsEmulator

# Sizes around gcsfs's 5 MiB switch from one-shot to resumable uploads (gcsfs/core.py, _put_file).
FILE_SIZES = [0, 1_000, 6 * 1024 * 1024]
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
    """Write an object with google-cloud-storage, not gcsfs: what another client wrote, as the code reads it."""
    client = gcs.Client(project="local-test", credentials=AnonymousCredentials())  # reads STORAGE_EMULATOR_HOST
    client.bucket(bucket).blob(name).upload_from_string(content)


# --- URIs -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "uri, expected",
    [
        ("gs://b/a/b.txt", ("b", "a/b.txt")),
        ("gs://b", ("b", "")),
        ("gs://b/", ("b", "")),
        ("gs://b/dir/", ("b", "dir/")),
    ],
)
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


def test_file_upload_to_prefix_and_download_into_directory_keep_name(
    gcs_bucket: str, tmp_path: Path
) -> None:
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
    assert (
        len(list_uris(f"gs://{gcs_bucket}")) == 4
    )  # the console's "folder/" placeholder is skipped
    assert list_uris(f"gs://{gcs_bucket}/nothing") == []


@pytest.mark.parametrize(
    "path, expected",
    [
        ("runs/a.txt", True),  # an object
        ("runs", True),  # a "directory"
        ("runs/", True),
        ("run", False),  # a prefix of a name, not a directory
        ("runs/a", False),
        ("missing.txt", False),
        ("empty-folder", False),
        ("", True),  # the bucket itself
    ],
)
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


def test_download_from_missing_bucket_names_it_and_role(
    gcs_emulator: GcsEmulator, tmp_path: Path
) -> None:
    with pytest.raises(
        StorageError, match=r"bucket gs://no-such-bucket-xyz does not exist.*objectViewer"
    ):
        download("gs://no-such-bucket-xyz/model.bin", tmp_path / "model.bin")
    with pytest.raises(StorageError, match="gs://no-such-bucket-xyz"):
        list_uris("gs://no-such-bucket-xyz/runs")


def test_upload_to_missing_bucket_names_it_and_role(
    gcs_emulator: GcsEmulator, tmp_path: Path
) -> None:
    (tmp_path / "a.txt").write_text("a")
    with pytest.raises(
        StorageError, match=r"bucket gs://no-such-bucket-xyz does not exist.*objectUser"
    ):
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


# --- integrity: checksums and atomic downloads ------------------------------------------------


@pytest.fixture
def retry_waits(monkeypatch) -> list[float]:
    """gcsfs's backoff waits between retries, recorded instead of slept: counted, not spent."""
    waits: list[float] = []

    async def record(seconds: float) -> None:
        waits.append(seconds)

    monkeypatch.setattr(gcsfs.retry, "asyncio", SimpleNamespace(sleep=record))  # gcsfs.retry's only
    return waits


@pytest.mark.parametrize("size", [1_000, 6 * 1024 * 1024])  # both sides of gcsfs's 5 MiB switch
def test_an_upload_that_arrives_corrupt_is_an_error(
    gcs_emulator: GcsEmulator, gcs_bucket: str, tmp_path: Path, monkeypatch, size: int
) -> None:
    # The emulator stores other bytes than it got and reports their MD5, as a bad transfer would.
    emulator_storage = gcs_emulator.server._storage
    store = emulator_storage.create_file

    def store_flipped(bucket, name, content, obj, *args):
        content = bytes([content[0] ^ 1]) + content[1:]
        obj["md5Hash"] = base64.b64encode(hashlib.md5(content).digest()).decode()
        return store(bucket, name, content, obj, *args)

    monkeypatch.setattr(emulator_storage, "create_file", store_flipped)
    source = tmp_path / "w.bin"
    source.write_bytes(os.urandom(size))
    with pytest.raises(StorageError, match="upload of .*w.bin .* is corrupt.*try again"):
        upload(source, f"gs://{gcs_bucket}/w.bin")


def test_corrupt_download_leaves_old_file_and_no_temp_files(
    gcs_emulator: GcsEmulator, gcs_bucket: str, tmp_path: Path, retry_waits: list[float]
) -> None:
    put(gcs_bucket, "model.bin", b"new weights")
    gcs_emulator.corrupt_checksums(gcs_bucket, "model.bin")
    dest = tmp_path / "model.bin"
    dest.write_bytes(b"old weights")

    with pytest.raises(StorageError, match="corrupt"):
        download(f"gs://{gcs_bucket}/model.bin", dest)

    assert dest.read_bytes() == b"old weights"
    assert [p.name for p in tmp_path.iterdir()] == ["model.bin"]
    assert len(retry_waits) == 5  # gcsfs fetched it again before giving up


def test_a_composite_object_without_md5_still_downloads(
    gcs_emulator: GcsEmulator, gcs_bucket: str, tmp_path: Path
) -> None:
    # gcloud's parallel composite uploads leave an object with a CRC32C and no MD5.
    put(gcs_bucket, "train.jsonl", b"{}\n")
    gcs_emulator.server._storage.objects[gcs_bucket]["train.jsonl"]["md5Hash"] = None
    landed = download(f"gs://{gcs_bucket}/train.jsonl", tmp_path / "t.jsonl")
    assert landed.read_bytes() == b"{}\n"


def test_directory_download_leaves_no_temp_files(gcs_bucket: str, tmp_path: Path) -> None:
    upload(write_tree(tmp_path / "run", NESTED_TREE), f"gs://{gcs_bucket}/run")
    landed = download(f"gs://{gcs_bucket}/run", tmp_path / "back")
    all_names = {p.relative_to(landed).as_posix() for p in landed.rglob("*") if p.is_file()}
    assert all_names == set(NESTED_TREE)


# --- deleting ---------------------------------------------------------------------------------


def test_delete_removes_a_directory_and_nothing_beside_it(gcs_bucket: str) -> None:
    for name in ["runs/a.txt", "runs/[1]*.txt", "runs/sub/b.txt", "runs-old/c.txt", "runs/1x.txt"]:
        put(gcs_bucket, name)
    assert delete(f"gs://{gcs_bucket}/runs/[1]*.txt") == 1  # a name, never a glob
    assert list_uris(f"gs://{gcs_bucket}/runs/1x.txt") == [f"gs://{gcs_bucket}/runs/1x.txt"]
    assert delete(f"gs://{gcs_bucket}/runs") == 3
    assert list_uris(f"gs://{gcs_bucket}") == [f"gs://{gcs_bucket}/runs-old/c.txt"]
    assert delete(f"gs://{gcs_bucket}/runs") == 0


# --- clients and credentials ------------------------------------------------------------------


def test_no_credentials_explain_how_to_log_in(tmp_path: Path) -> None:
    shown = error_without_credentials(tmp_path, "from nli_helpers.storage import exists", "exists(\"gs://some-bucket/x\")")
    assert shown.count("gcloud auth application-default login") == 1
    assert "GOOGLE_APPLICATION_CREDENTIALS" in shown


def test_local_copy_gives_a_gs_object_as_a_local_file_and_removes_it_afterwards(
    gcs_bucket, tmp_path
):
    source = tmp_path / "pairs.jsonl"
    source.write_text('{"premise": "a", "hypothesis": "b", "label": 0}\n')
    upload(source, f"gs://{gcs_bucket}/data/pairs.jsonl")
    with storage.local_copy(f"gs://{gcs_bucket}/data/pairs.jsonl") as local:
        assert local.name == "pairs.jsonl" and local.read_text() == source.read_text()
    assert not local.exists() and not local.parent.exists()  # the temporary folder is gone
    with storage.local_copy(source) as same:  # a local path passes through untouched
        assert same == source
    assert source.exists()


def test_local_copy_reads_in_place_where_vertex_mounts_the_bucket(
    gcs_bucket, tmp_path, monkeypatch
):
    # On Vertex AI, Cloud Storage FUSE shows gs://BUCKET/PATH as /gcs/BUCKET/PATH: no download.
    monkeypatch.setattr(storage, "FUSE_ROOT", tmp_path / "gcs")
    write_tree(tmp_path / "gcs" / gcs_bucket, {"data/pairs.jsonl": b"{}\n"})
    mounted = tmp_path / "gcs" / gcs_bucket / "data" / "pairs.jsonl"
    with storage.local_copy(f"gs://{gcs_bucket}/data/pairs.jsonl") as local:
        assert local == mounted
    assert mounted.exists()  # never removed: it is the bucket
    upload(mounted, f"gs://{gcs_bucket}/data/other.jsonl")  # not in the mount (yet): downloaded
    with storage.local_copy(f"gs://{gcs_bucket}/data/other.jsonl") as local:
        assert local.read_bytes() == b"{}\n" and not local.is_relative_to(tmp_path / "gcs")
    missing = f"gs://{gcs_bucket}/data/missing.jsonl"
    with (
        pytest.raises(StorageError, match=f"{missing} does not exist"),
        storage.local_copy(missing),
    ):
        pass


def test_staged_output_uploads_on_success_only_and_cleans_up(gcs_bucket, tmp_path):
    target = f"gs://{gcs_bucket}/runs/ok"
    with storage.staged_output(target) as folder:
        (folder / "metrics.json").write_text("{}")
        (folder / "sub").mkdir()
        (folder / "sub" / "x.txt").write_text("x")
    assert sorted(storage.list_uris(target)) == [f"{target}/metrics.json", f"{target}/sub/x.txt"]
    assert not folder.exists()
    with (
        pytest.raises(RuntimeError),
        storage.staged_output(f"gs://{gcs_bucket}/runs/failed") as folder,
    ):
        (folder / "half.txt").write_text("half")
        raise RuntimeError("the run failed")
    assert storage.list_uris(f"gs://{gcs_bucket}/runs/failed") == [] and not folder.exists()
    with storage.staged_output(
        tmp_path / "local" / "run"
    ) as here:  # a local target is written in place
        (here / "a.txt").write_text("a")
    assert (tmp_path / "local" / "run" / "a.txt").read_text() == "a"


def test_an_unreachable_endpoint_is_one_clear_error_after_the_retry_budget(
    monkeypatch, retry_waits, caplog
):
    import socket

    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{port}")
    with pytest.raises(
        StorageError, match=f"cannot reach Cloud Storage at http://127.0.0.1:{port}"
    ) as err:
        storage.list_uris("gs://some-bucket/runs/")
    assert "retried about 31 s" in str(err.value) and "Traceback" not in str(err.value)
    assert not [r for r in caplog.records if r.name.startswith("gcsfs")]  # no second, noisy report
    # gcsfs's own backoff is the budget: 1 + 2 + 4 + 8 + 16 s, each plus up to 1 s of jitter.
    assert len(retry_waits) == 5 and storage.RETRY_S <= sum(retry_waits) < storage.RETRY_S + 5

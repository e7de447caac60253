"""A stand-in for the Hugging Face hub's file endpoint, serving MultiNLI's validation_matched split in the layout the
real repository has, so the package's hub path runs on machines that cannot reach the hub (HF_ENDPOINT points here).

    python -m localcloud.hub --data ../shared/data/mnli_dev_matched.jsonl      # prints HF_ENDPOINT=..., serves

    with HubStandIn(dev_matched_jsonl, folder) as endpoint:                    # tests: http://127.0.0.1:PORT
        env = {"HF_ENDPOINT": endpoint, "HF_HOME": ...}

What it follows, and where from:
* The repository: huggingface.co/datasets/nyu-mll/multi_nli at commit da70db2 ("Convert dataset to Parquet (#5)")
  holds data/{train,validation_matched,validation_mismatched}-00000-of-00001.parquet; its README's dataset_info lists
  the columns promptID (int32), pairID, premise, premise_binary_parse, premise_parse, hypothesis,
  hypothesis_binary_parse, hypothesis_parse, genre (strings) and label, a ClassLabel with names
  {0: entailment, 1: neutral, 2: contradiction}. Only validation_matched is served: it is all the package reads.
* The protocol: huggingface_hub's hf_hub_download sends HEAD, then GET, to
  {HF_ENDPOINT}/datasets/{repo}/resolve/{revision}/{path}; it requires the X-Repo-Commit and ETag headers (the ETag
  names the cached blob), takes the size from Content-Length, downloads over plain HTTP when no X-Xet-Hash header is
  sent, and maps an X-Error-Code header to its errors (huggingface_hub file_download.get_hf_file_metadata and
  utils/_http.hf_raise_for_status).
What it cannot follow: the copy of dev_matched this project tests with has premise, hypothesis and label only, so the
ids are made up (one promptID per premise), the parse columns are empty and genre is null (the real file has the five
matched genres).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

# Written out from the hub's pages, not imported from nli_helpers.mnli: a stand-in that copied the package's own
# constants would agree with any mistake in them.
REPO = "nyu-mll/multi_nli"
FILE = "data/validation_matched-00000-of-00001.parquet"
LABELS = ("entailment", "neutral", "contradiction")
COMMIT = re.compile(r"[0-9a-f]{40}")
MAIN_COMMIT = "da70db2af9d09693783c3320c4249840212ee221"  # what the stand-in answers for "main"


def write_split(dev_matched_jsonl: str | Path, out: str | Path) -> Path:
    """validation_matched as the hub's parquet file, with its columns and ClassLabel, from a dev_matched file."""
    from datasets import ClassLabel, Dataset, Features, Value, disable_progress_bars

    disable_progress_bars()
    rows = [json.loads(line) for line in Path(dev_matched_jsonl).read_text(encoding="utf-8").splitlines() if line]
    prompt_ids: dict[str, int] = {}
    suffix = {"entailment": "e", "neutral": "n", "contradiction": "c"}
    columns: dict[str, list] = {name: [] for name in (
        "promptID", "pairID", "premise", "premise_binary_parse", "premise_parse", "hypothesis",
        "hypothesis_binary_parse", "hypothesis_parse", "genre", "label")}
    for row in rows:
        prompt = prompt_ids.setdefault(row["premise"], 100000 + len(prompt_ids))
        values = {"promptID": prompt, "pairID": f"{prompt}{suffix[row['label']]}", "premise": row["premise"],
                  "premise_binary_parse": "", "premise_parse": "", "hypothesis": row["hypothesis"],
                  "hypothesis_binary_parse": "", "hypothesis_parse": "", "genre": None,
                  "label": LABELS.index(row["label"])}
        for name, value in values.items():
            columns[name].append(value)
    features = Features({**{name: Value("string") for name in columns}, "promptID": Value("int32"),
                         "label": ClassLabel(names=list(LABELS))})
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    Dataset.from_dict(columns, features=features).to_parquet(str(out))
    return out


class HubStandIn:
    """The resolve endpoint for one file of one dataset repository, on a free loopback port."""

    def __init__(self, dev_matched_jsonl: str | Path, folder: str | Path) -> None:
        self.file = write_split(dev_matched_jsonl, Path(folder) / FILE)
        self.data = self.file.read_bytes()
        self.etag = hashlib.sha256(self.data).hexdigest()
        self.requests: list[str] = []  # "HEAD /datasets/...": what the client asked, for tests
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def do_HEAD(self) -> None:
                self._answer(body=False)

            def do_GET(self) -> None:
                self._answer(body=True)

            def _answer(self, body: bool) -> None:
                hub.requests.append(f"{self.command} {self.path}")
                found = re.fullmatch(rf"/datasets/{re.escape(REPO)}/resolve/([^/]+)/(.+)", self.path.split("?")[0])
                if not found:
                    return self._error(404, "RepoNotFound", f"{self.path}: no such repository here")
                revision, path = found.groups()
                if path != FILE:
                    return self._error(404, "EntryNotFound", f"{path} is not in {REPO}")
                if revision != "main" and not COMMIT.fullmatch(revision):
                    return self._error(404, "RevisionNotFound", f"no revision {revision}")
                self.send_response(200)
                self.send_header("X-Repo-Commit", revision if COMMIT.fullmatch(revision) else MAIN_COMMIT)
                self.send_header("ETag", f'"{hub.etag}"')
                self.send_header("Content-Length", str(len(hub.data)))
                self.send_header("Content-Type", "application/octet-stream")
                self.end_headers()
                if body:
                    self.wfile.write(hub.data)

            def _error(self, status: int, code: str, message: str) -> None:
                payload = json.dumps({"error": message}).encode()
                self.send_response(status)
                self.send_header("X-Error-Code", code)
                self.send_header("X-Error-Message", message)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(payload)

            def log_message(self, *args) -> None:  # quiet: the requests list is the log
                pass

        return Handler

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> str:
        return self.endpoint

    def __exit__(self, *exc) -> None:
        self.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m localcloud.hub", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="MultiNLI dev_matched as JSON Lines (premise, hypothesis, label)")
    parser.add_argument("--folder", default=None, help="where to write the parquet file (default: a temporary folder)")
    args = parser.parse_args(argv)
    import tempfile

    folder = args.folder or tempfile.mkdtemp(prefix="nli-hub-")
    hub = HubStandIn(args.data, folder)
    print(f"HF_ENDPOINT={hub.endpoint}", flush=True)
    try:
        hub.thread.join()
    except KeyboardInterrupt:
        pass
    finally:
        hub.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

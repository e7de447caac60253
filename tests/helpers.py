"""Helpers the tests import (`from tests.helpers import ROOT, run_task`).

They live here, not in conftest.py: notebooks/ has a conftest.py too, and `from conftest import`
picks whichever was imported first when pytest collects both folders in one run.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_task(*args: str, env: dict | None = None, cwd: Path | None = None, timeout: int = 600):
    """Run `python -m nli_helpers.task` as a user would, returning the CompletedProcess."""
    import subprocess

    return subprocess.run([sys.executable, "-m", "nli_helpers.task", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, cwd=cwd or ROOT, timeout=timeout)

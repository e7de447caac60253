"""Progress where a person watches, plain log lines where logs are collected.

A live tqdm bar redraws itself with carriage returns. In a terminal or a Jupyter kernel that is what
you want; in a log file, and on Vertex AI, where every byte of stdout/stderr becomes Cloud Logging
entries line by line, it is noise: a 277-step run becomes one line of tens of kilobytes and no loss
is readable. So:

    >>> live_progress()     # True in a terminal or a Jupyter/papermill kernel, False when output is a file or pipe
    >>> quiet_library_bars()  # off with the datasets/transformers bars when not live

The training loop asks `live_progress()` once: live, it shows the bar; not live, it prints one line per
log interval and one per evaluation (`log_line`), flushed at once.
"""

from __future__ import annotations

import sys


def in_jupyter_kernel() -> bool:
    """True inside an IPython kernel (JupyterLab, nbval, papermill), where tqdm.auto draws a widget."""
    shell = sys.modules.get("IPython") and sys.modules["IPython"].get_ipython()
    return bool(shell) and "IPKernelApp" in getattr(shell, "config", {})


def live_progress(stream=None) -> bool:
    """Whether a redrawn progress bar can be seen: stderr is a terminal, or we run in a Jupyter kernel."""
    stream = sys.stderr if stream is None else stream
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):  # a closed or fake stream
        tty = False
    return tty or in_jupyter_kernel()


def quiet_library_bars() -> None:
    """Switch off the progress bars of datasets (map, load) and transformers (downloads) when not live."""
    if live_progress():
        return
    import datasets
    import transformers

    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()


def log_line(text: str) -> None:
    """One line to stdout, flushed at once, so that a collected log has it when it is printed."""
    print(text, file=sys.stdout, flush=True)

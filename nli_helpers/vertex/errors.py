"""The errors of the Vertex AI helpers: each message says what to do."""

from __future__ import annotations

from nli_helpers.config import NLIError


class VertexError(NLIError):
    """A Vertex AI step failed in a way the user can fix; the message says how."""


class PreflightError(VertexError):
    """One or more preflight checks failed: the job was not submitted."""


class JobFailedError(VertexError):
    """The job ended FAILED, CANCELLED or EXPIRED."""


class NotSubmitted(VertexError):
    """A job that would bill Google Cloud was not submitted: the user has not said yes. In a
    notebook it ends Run All at that cell with its message alone (`_render_traceback_`)."""

    def _render_traceback_(self) -> list[str]:
        return [f"Not submitted. {self}"]

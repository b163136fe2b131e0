"""Errors the pipeline raises to its caller.

    PipelineError
    ├── PolicyError       a policy key is unknown, of the wrong type or out of its bounds
    ├── RequestRejected   the request cannot be sent as it is (``code`` says why)
    └── StoreError        the offload store could not keep an object (stages then keep
                          the content in place)

A stage that fails for any other reason never surfaces here: the runner counts the failure
and carries on with the request as it was (fail-open). ``RequestRejected`` is the one
exception a stage raises on purpose, and the runner lets it through.
"""

from __future__ import annotations

__all__ = ["PipelineError", "PolicyError", "RequestRejected", "StoreError"]


class PipelineError(Exception):
    """Base of every error the pipeline raises on purpose."""


class PolicyError(PipelineError, ValueError):
    """A policy value that cannot be used; ``key`` names it."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"policy key {key!r}: {message}")
        self.key = key


class RequestRejected(PipelineError):
    """The request must not be forwarded; ``code`` is a stable machine-readable reason
    (``payload_too_large``, ``context_length_exceeded``)."""

    def __init__(self, code: str, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.param = param


class StoreError(PipelineError):
    """The offload store did not acknowledge a write (down, full, or the object too big)."""

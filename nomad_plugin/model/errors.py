"""Errors every layer can raise and every layer can understand."""

from __future__ import annotations


class PluginError(Exception):
    """Base class: the message is meant for an operator or a job author."""


class BackendUnavailable(PluginError):
    """The backend cannot be reached right now (retryable); ``kind`` names the cause
    ("socket-missing", "connection-refused", "permission-denied", "timeout", ...)."""

    def __init__(self, message: str, kind: str = "unavailable") -> None:
        super().__init__(message)
        self.kind = kind


class SchemaMismatch(BackendUnavailable):
    """XDM answers in a schema the plugin cannot bind or trust: cards go unhealthy and Reserve is
    refused with this message, so nothing could grant a wrong card."""

    def __init__(self, message: str) -> None:
        super().__init__(message, kind="schema-mismatch")


class BackendRefused(PluginError):
    """The backend answered and refused (XDM's own status/message)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class GrantMismatch(PluginError):
    """A grant does not match what was asked for (wrong card or amount)."""


class ReservationRejected(PluginError):
    """Nomad's device IDs cannot form one valid request."""

"""User-facing errors: each says what is wrong, where, and what to do about it.

The CLI prints `EosError`s without a traceback and exits non-zero; anything else is a
bug and keeps its traceback.
"""

from __future__ import annotations


class EosError(Exception):
    """An error the user can act on."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"


class ConfigError(EosError):
    """The pipeline file (or a command-line argument) is invalid."""

    exit_code = 2


class EnvironmentProblem(EosError):
    """Something outside eos is missing or broken: Java, Maven, a port, a broker."""


class CheckpointError(EosError):
    """The checkpoint does not belong to this pipeline, is corrupt, or was changed unsafely."""


class EpochFailed(EosError):
    """An epoch could not be committed within its allowed attempts."""

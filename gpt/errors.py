"""User-facing errors: a mistake the user can fix, reported as one line without a traceback."""

from __future__ import annotations


class UserError(Exception):
    """A problem with the user's input (config, files, environment) rather than a bug.

    The entry points print ``error: <message>`` and exit with code 2; ``hint`` is printed beneath it.
    """

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


class ConfigError(UserError, ValueError):
    """An invalid configuration value; also a ValueError so library callers can catch it as one."""


def check_positive(config: object, *names: str, optional: bool = False, prefix: str = "") -> None:
    """Refuse any of ``config``'s named fields that is not a positive number (NaN too; None too unless optional)."""
    for name in names:
        value = getattr(config, name)
        if value is None and optional:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value == float("inf"):
            raise ConfigError(f"{prefix}{name} must be positive{' or null' if optional else ''}, got {value!r}")

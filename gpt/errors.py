"""User-facing errors: a mistake the user can fix, reported as one line without a traceback."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import NoReturn, TypeVar

T = TypeVar("T")


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


def report_user_errors(fn: Callable[[], T]) -> T:
    """Run fn; a UserError prints ``error: <message>`` (and its hint) to stderr and exits 2.

    Ctrl-C (and SIGTERM outside training, see :func:`hydra_entry`) exits 130 with one line: every writer of this
    project replaces files only once complete and removes its temporary file, so nothing already written is
    touched. The training loop saves and stops by itself. Any other exception is a bug and keeps its traceback.
    HYDRA_FULL_ERROR=1 shows the traceback of user errors too.
    """
    try:
        return fn()
    except KeyboardInterrupt as err:  # raised with a message by writers that know what they kept (data preparation)
        said = str(err)
        if said in ("", "SIGINT", "SIGTERM"):
            said = f"interrupted ({said or 'Ctrl-C'}); files already written are as they were"
        print(f"\nerror: {said}", file=sys.stderr)
        sys.exit(130)
    except UserError as err:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        fail(err)


def fail(err: UserError) -> NoReturn:
    """Print ``error: <message>`` and its hint to stderr, exit 2."""
    print(f"error: {err}", file=sys.stderr)
    if err.hint:
        print(f"hint: {err.hint}", file=sys.stderr)
    sys.exit(2)

"""What every entry point shares: one place where user errors become a one-line message and exit code 2."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import TypeVar

from gpt.errors import UserError

T = TypeVar("T")


def report_user_errors(fn: Callable[[], T]) -> T:
    """Run fn; a UserError prints ``error: <message>`` (and its hint) to stderr and exits 2.

    Ctrl-C outside the training loop (which saves and stops by itself) exits 130 with one line: every
    writer of this project replaces files only once complete, so nothing already written is touched.
    Any other exception is a bug and keeps its traceback. HYDRA_FULL_ERROR=1 shows the traceback of
    user errors too.
    """
    try:
        return fn()
    except KeyboardInterrupt as err:  # raised with a message by writers that know what they kept (data preparation)
        print(f"\nerror: {str(err) or 'interrupted (Ctrl-C); files already written are as they were'}", file=sys.stderr)
        sys.exit(130)
    except UserError as err:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        print(f"error: {err}", file=sys.stderr)
        if err.hint:
            print(f"hint: {err.hint}", file=sys.stderr)
        sys.exit(2)

"""What every entry point shares: one place where user errors become a one-line message and exit code 2, and the
one way a Hydra entry script is made (:func:`hydra_entry`), so that every script treats config errors alike."""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from gpt.errors import UserError, fail, report_user_errors  # noqa: F401 (the one-line printer, re-exported for the scripts)

T = TypeVar("T")
CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def bring_designs() -> None:
    """Load GPT_DESIGNS' files first, each failure one ``error:`` line (gpt.designs.loading.bring_designs; imported
    here when called, so a script's start-up does not pay for the registry)."""
    from gpt.designs.loading import bring_designs as bring

    bring()


def hydra_entry(schema: str, config_name: str | None = None) -> Callable[[Callable[[Any], Any]], Callable[..., None]]:
    """Make a script's main() from its body, a function of the typed config (``configs/<config_name>.yaml``, whose
    dataclass gpt.schema.SCHEMAS names ``schema``).

    main() composes the config with the command line's overrides (Hydra: -m, --help and --cfg work), types it
    (gpt.schema.typed) and runs the body, all under :func:`report_user_errors`, with SIGTERM stopping it as Ctrl-C
    does (the training loop installs its own handlers: save, then stop). A config error Hydra meets while
    composing (an unknown key or group, a value of the wrong type, an override it cannot parse) is one ``error:``
    line too, exit 2, in place of Hydra's multi-line report with exit 1.
    """
    def decorate(body: Callable[[Any], Any]) -> Callable[..., None]:
        def main(argv: list[str] | None = None) -> None:
            """Run the script on the command line's arguments (or on ``argv``, from Python)."""
            import hydra

            from gpt.files import sigterm_interrupts
            from gpt.schema import composition_error, register, typed

            asked = os.environ.get("HYDRA_FULL_ERROR")

            def task(cfg: Any) -> Any:
                _set_env("HYDRA_FULL_ERROR", asked)  # composed: from here on, errors are reported as the user asked
                with sigterm_interrupts():  # SIGTERM stops like Ctrl-C: temporary files removed, exit 130
                    return report_user_errors(lambda: body(typed(cfg)))

            as_command = argv is None  # this process is the command: it ends when main() does
            if as_command:
                gc.freeze()  # start-up's objects (torch, Hydra, this package) live as long as the process
                if asked != "1":  # a Rust library's panic the project reports as one error (gpt.tokenizers) prints
                    os.environ["RUST_BACKTRACE"] = "0"  # its note, not its stack (read once, at the first panic)
            bring_designs()
            os.environ["HYDRA_FULL_ERROR"] = "1"  # while composing, Hydra raises config errors instead of printing
            command = sys.argv
            if argv is not None:
                sys.argv = [sys.argv[0], *argv]
            try:
                register(schema)  # also respells the command line's renamed keys (gpt.schema.RENAMED)
                hydra.main(config_path=str(CONFIGS), config_name=config_name or schema, version_base=None)(task)()
            except Exception as err:
                problem = composition_error(err)
                if problem is None or asked == "1":
                    raise
                fail(problem)
            finally:
                sys.argv = command
                _set_env("HYDRA_FULL_ERROR", asked)
                if as_command:
                    skip_final_collection()

        return main

    return decorate


def skip_final_collection() -> None:
    """Freeze every object left, for a process about to end: its last collections (the interpreter's, pytest's)
    would otherwise walk them all (torch's hundreds of thousands: about 1 s) only for the process to free them."""
    gc.freeze()


def _set_env(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value

"""What every entry point shares: one place where user errors become a one-line message and exit code 2, and the
one way a Hydra entry script is made (:func:`hydra_entry`), so that every script treats config errors alike."""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from gpt.errors import UserError

T = TypeVar("T")
CONFIGS = Path(__file__).resolve().parent.parent / "configs"


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


def bring_designs() -> None:
    """Load the attention designs GPT_DESIGNS names, before anything reads the registry: every entry point calls
    this first, so a design file that fails on import is one ``error:`` line, exit 2, wherever it is used (the
    registry's first read would otherwise load it inside Hydra's start-up or a module's import, a traceback)."""
    from gpt.designs import loading
    from gpt.model import design as registry

    report_user_errors(lambda: (registry.available(), loading.load_environment()))


def fail(err: UserError) -> NoReturn:
    """Print ``error: <message>`` and its hint to stderr, exit 2."""
    print(f"error: {err}", file=sys.stderr)
    if err.hint:
        print(f"hint: {err.hint}", file=sys.stderr)
    sys.exit(2)


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

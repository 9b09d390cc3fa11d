"""Bring your own design: import a user's Python file, package or module that registers attention designs.

Two ways, for every entry point: ``designs=[path/to/my_design.py]`` on a script's command line (or in its config
file; gpt.schema loads them before the config is checked), or the GPT_DESIGNS environment variable (files, package
folders or module names, separated by os.pathsep), which anything reading the registry honours (a notebook, the
lm-eval model, a server). Whatever was loaded is added to GPT_DESIGNS, so processes started from this one (the
arena's, a forkserver's) load it too. A checkpoint never names a module: it records the design's name
(``model.designs``), and loading it without the design gives one error saying how to bring it.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
import traceback
from pathlib import Path

from gpt.errors import UserError
from gpt.model import design as registry

ENV = "GPT_DESIGNS"
_loaded: dict[str, list[str]] = {}  # each source loaded (a resolved path or a module name) -> the designs it added


def load(source: str) -> list[str]:
    """Import ``source`` once (a .py file, a package folder, or an importable module name); the design names it
    registered. A missing file, an error inside it, or a file registering nothing is one UserError."""
    key = _key(source)
    if key in _loaded:
        return _loaded[key]
    before = set(registry.available())  # the built-ins (and GPT_DESIGNS) first, so only this source's are new
    try:
        _import(key)
    except BaseException as err:
        for name in set(registry.available()) - before:  # a file that failed half-way registers nothing
            registry.unregister(name)
        if isinstance(err, UserError) or not isinstance(err, (Exception, SystemExit)):
            raise  # Ctrl-C stays an interrupt (exit 130)
        raise UserError(f"designs: importing {source} failed: {_failure(err, key)}",
                        hint="fix that error in the design's module") from None
    names = [name for name in registry.available() if name not in before]
    if not names:
        raise UserError(f"designs: {source} registered no attention design",
                        hint="call gpt.designs.register(MyDesign()) at the top level of that module")
    _loaded[key] = names
    _remember(key)
    return names


def _failure(err: BaseException, key: str) -> str:
    """What went wrong importing a design, and where: a syntax error at its own line, an exception at the deepest
    line of the user's file or package (``key``; else of any real file), a sys.exit() as the exit it asked for (a
    design module must not end the command: it would stop silently, or with exit 0 as if it had worked)."""
    if isinstance(err, SystemExit):
        said = "" if err.code is None else f"({err.code!r})"
        what = f"it called sys.exit{said or '()'}"
    else:
        what = f"{type(err).__name__}: {err.msg if isinstance(err, SyntaxError) else err}"
    if isinstance(err, SyntaxError) and err.filename:
        return f"{what} (at {err.filename}:{err.lineno})"
    frames = [f for f in reversed(traceback.extract_tb(err.__traceback__))
              if not f.filename.startswith("<") and f.filename != __file__]
    mine = Path(key).is_absolute()
    theirs = [f for f in frames if mine and (f.filename == key or f.filename.startswith(key + os.sep))]
    where = next((f"{f.filename}:{f.lineno}" for f in [*theirs, *frames]), "")
    return what + (f" (at {where})" if where else "")


def load_all(sources: list[str]) -> list[str]:
    """load() each source; every design name they registered."""
    return [name for source in sources for name in load(str(source))]


def load_environment() -> None:
    """Load what GPT_DESIGNS names (when the registry is first read; every entry point calls it again first, through
    gpt.cli.bring_designs, so a file failing on import is its one error line; loaded sources are not reloaded)."""
    for source in os.environ.get(ENV, "").split(os.pathsep):
        if source.strip():
            load(source.strip())


def _key(source: str) -> str:
    """A file or folder as its absolute path (it must exist); anything else is a module name."""
    path = Path(source).expanduser()
    if source.endswith(".py") or os.sep in source or "/" in source or path.exists():
        if not path.exists():
            raise UserError(f"designs: {source} does not exist", hint="give the path of a .py file or a package folder")
        if path.is_dir() and not (path / "__init__.py").is_file():
            raise UserError(f"designs: {source} is a folder without __init__.py",
                            hint="give a .py file, or a package folder (with __init__.py)")
        return str(path.resolve())
    return source


def _import(key: str) -> None:
    """Import a file or package folder under a name of its own (in sys.modules, so forks and pickles find it),
    or a module by name."""
    path = Path(key)
    if not path.is_absolute():
        try:
            importlib.import_module(key)
        except ModuleNotFoundError as err:
            if err.name and key.startswith(err.name):
                raise UserError(f"designs: no module named {key}",
                                hint="give a file path, or put the package on PYTHONPATH") from None
            raise
        return
    name = f"gpt_user_design_{path.stem}_{hashlib.sha1(key.encode()).hexdigest()[:8]}"
    if path.is_dir():
        spec = importlib.util.spec_from_file_location(name, path / "__init__.py", submodule_search_locations=[key])
    else:
        spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise


def _remember(key: str) -> None:
    """Add a loaded source to GPT_DESIGNS, for processes this one starts."""
    listed = [s for s in os.environ.get(ENV, "").split(os.pathsep) if s]
    if key not in listed and not any(_same(s, key) for s in listed):
        os.environ[ENV] = os.pathsep.join([*listed, key])


def _same(source: str, key: str) -> bool:
    try:
        return _key(source) == key
    except UserError:
        return False

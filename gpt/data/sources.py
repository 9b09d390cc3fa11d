"""Where raw text comes from: the Python standard library, a user's files, or a URL downloaded once."""

from __future__ import annotations

import hashlib
import os
import platform
import sysconfig
import urllib.request
import warnings
from dataclasses import dataclass
from pathlib import Path

from gpt.data.config import DataConfig
from gpt.errors import UserError

# Standard-library folders left out: tests (large and repetitive) and third-party packages.
STDLIB_SKIP = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}


@dataclass
class Corpus:
    documents: list[tuple[str, str]]  # (name, text), in a deterministic order
    description: str

    def fingerprint(self) -> str:
        digest = hashlib.sha256()
        for name, text in self.documents:
            digest.update(name.encode() + b"\0" + text.encode("utf-8", "surrogatepass") + b"\0")
        return digest.hexdigest()


def stdlib_corpus() -> Corpus:
    """Every .py file of the running interpreter's standard library, tests excluded, sorted by path."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(
        p for p in root.rglob("*.py") if not STDLIB_SKIP.intersection(p.relative_to(root).parts[:-1])
    )
    docs = [(str(p.relative_to(root)), read_text(p)) for p in files]
    return Corpus(docs, f"Python {platform.python_version()} standard library at {root} ({len(docs)} files)")


def path_corpus(path: str | None) -> Corpus:
    """A text file, or every non-hidden text file below a folder (sorted), as documents."""
    if not path:
        raise UserError("data.path is not set", hint="pass data.path=<a text file or a folder of text files>")
    root = Path(path).expanduser()
    if not root.exists():
        raise UserError(f"data.path {str(root)!r} does not exist", hint="check the path, relative to where you run")
    if root.is_file():
        files, base = [root], root.parent
    else:
        files = sorted(
            p
            for p in root.rglob("*")
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)
        )
        base = root
    docs = [(str(p.relative_to(base)), text) for p in files if (text := read_text(p, skip_binary=True)) is not None]
    if not docs:
        raise UserError(f"no text files found under data.path {str(root)!r}", hint="point it at .txt or other text files")
    if not any(text for _, text in docs):
        raise UserError(f"data.path {str(root)!r} holds only empty files", hint="point it at files with text in them")
    return Corpus(docs, f"{root} ({len(docs)} file{'s' if len(docs) != 1 else ''})")


def url_corpus(url: str | None, cache_dir: Path) -> Corpus:
    """The text at ``url``, downloaded once into ``cache_dir/source.txt``."""
    if not url:
        raise UserError("data.url is not set", hint="pass data.url=<address of a text file>")
    target = cache_dir / "source.txt"
    if not target.exists():
        cache_dir.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(".part")
        try:
            with urllib.request.urlopen(url, timeout=60) as response, open(partial, "wb") as out:
                out.write(response.read())
        except OSError as err:
            partial.unlink(missing_ok=True)
            raise UserError(
                f"could not download {url}: {err}",
                hint="check the network, or download the file yourself and use data.source=path data.path=<file>",
            ) from None
        os.replace(partial, target)
    text = read_text(target)
    return Corpus([(url, text)], url)


def read_text(path: Path, skip_binary: bool = False) -> str | None:
    """UTF-8 text of a file; invalid bytes become U+FFFD with a warning. None for binary files if asked."""
    data = path.read_bytes()
    if skip_binary and b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        warnings.warn(f"{path}: bytes that are not UTF-8 were replaced by U+FFFD", stacklevel=2)
        return data.decode("utf-8", errors="replace")


def load_corpus(cfg: DataConfig) -> Corpus:
    if cfg.source == "stdlib":
        return stdlib_corpus()
    if cfg.source == "path":
        return path_corpus(cfg.path)
    if cfg.source == "url":
        return url_corpus(cfg.url, Path(cfg.root) / cfg.name)
    raise UserError(f"unknown data.source {cfg.source!r}", hint="use stdlib, path or url")

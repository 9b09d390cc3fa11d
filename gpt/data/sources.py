"""Where documents come from: the Python standard library, files (text, JSONL, parquet), a URL, Hugging Face datasets.

A Source is cheap to build: it lists and stats files (or names a dataset) without reading any text, and its
manifest (paths, sizes, modification times; a dataset's name, revision or on-disk fingerprint) decides whether
prepared data is up to date. ``documents()`` then streams the text of every document, one at a time, in a
fixed order, so preparation never holds the corpus in memory.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import platform
import sysconfig
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpt.data.config import DataConfig
from gpt.data.formats import file_format, looks_binary, read_documents
from gpt.errors import UserError

# Standard-library folders left out: tests (large and repetitive) and third-party packages.
STDLIB_SKIP = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}


@dataclass
class Source:
    kind: str
    description: str
    manifest: dict[str, Any]  # what identifies the corpus, learnt without reading it
    read: Callable[[], Iterator[str]]  # the documents' text, in a fixed order; "" for an empty document
    total: int | None = None  # the number of documents, where known before reading
    binary: list[Path] = field(default_factory=list)  # files the last read() skipped as binary (not text)
    raw: Callable[[], Iterator[tuple[Path, bytes]]] | None = None  # text files: each file's bytes, as stored

    def fingerprint(self) -> str:
        """sha256 of the manifest: equal fingerprints mean the same corpus (by size and modification time)."""
        return hashlib.sha256(json.dumps(self.manifest, sort_keys=True).encode()).hexdigest()

    def documents(self) -> Iterator[str]:
        return self.read()


def file_entries(files: list[Path], base: Path) -> list[list[Any]]:
    """[relative path, size, mtime_ns] of each file: the manifest of a set of files."""
    entries = []
    for path in files:
        stat = path.stat()
        entries.append([str(path.relative_to(base)), stat.st_size, stat.st_mtime_ns])
    return entries


def files_source(files: list[Path], base: Path, kind: str, description: str, fmt: str, text_field: str,
                 skip_binary: bool) -> Source:
    """A Source reading each file in turn with its format's reader."""

    def read() -> Iterator[str]:
        source.binary.clear()
        for path in files:
            form = file_format(path, fmt)
            if skip_binary and form == "text" and looks_binary(path):
                source.binary.append(path)  # skipped: its absence is said if nothing else holds text
                continue
            yield from read_documents(path, form, text_field)

    manifest = {"kind": kind, "root": str(base.resolve()), "files": file_entries(files, base)}

    def raw() -> Iterator[tuple[Path, bytes]]:  # the files read() makes documents of, as they are stored
        for path in files:
            if not (skip_binary and looks_binary(path)):
                yield path, path.read_bytes()

    text_only = all(file_format(p, fmt) == "text" for p in files)
    source = Source(kind, description, manifest, read, len(files) if text_only else None,
                    raw=raw if text_only else None)
    return source


def stdlib_source() -> Source:
    """Every .py file of the running interpreter's standard library, tests excluded, sorted by path."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = [d for d in subfolders if d not in STDLIB_SKIP]  # pruned: never walked
        files.extend(Path(folder) / n for n in names if n.endswith(".py"))
    files.sort()
    description = f"Python {platform.python_version()} standard library at {root} ({len(files)} files)"
    return files_source(files, root, "stdlib", description, "text", "text", skip_binary=False)


def list_files(path: str | None, option: str = "data.path") -> tuple[list[Path], Path]:
    """The files named by ``path`` (a file, every non-hidden file below a folder, or a glob), sorted, and their base."""
    if not path:
        raise UserError(f"{option} is not set", hint=f"pass {option}=<a file, a folder or a glob>")
    if any(ch in path for ch in "*?["):
        files = sorted(Path(p) for p in glob.glob(os.path.expanduser(path), recursive=True) if Path(p).is_file())
        if not files:
            raise UserError(f"{option} {path!r} matches no files", hint="check the pattern, relative to where you run")
        return files, Path(os.path.commonpath([p.parent for p in files]))
    root = Path(path).expanduser()
    if not root.exists():
        raise UserError(f"{option} {str(root)!r} does not exist", hint="check the path, relative to where you run")
    if root.is_file():
        return [root], root.parent
    files = sorted(p for p in root.rglob("*")
                   if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts))
    return files, root


def path_source(cfg: DataConfig) -> Source:
    """source=path (data=text): text files only, one document each; binary files are skipped."""
    files, base = list_files(cfg.path)
    if not files:
        raise UserError(f"no text files found under data.path {cfg.path!r}",
                        hint="point it at .txt or other text files")
    plural = "s" if len(files) != 1 else ""
    return files_source(files, base, "path", f"{cfg.path} ({len(files)} file{plural})", "text", "text", True)


def format_source(cfg: DataConfig) -> Source:
    """source=files (data=files): text, JSONL or parquet files, by extension or as data.format says."""
    files, base = list_files(cfg.path)
    if not files:
        raise UserError(f"no files found under data.path {cfg.path!r}", hint="point it at text, JSONL or parquet files")
    formats = sorted({file_format(p, cfg.format) for p in files})
    description = f"{cfg.path} ({len(files)} {'/'.join(formats)} file{'s' if len(files) != 1 else ''})"
    source = files_source(files, base, "files", description, cfg.format, cfg.text_field, skip_binary=True)
    source.manifest["format"], source.manifest["text_field"] = cfg.format, cfg.text_field
    return source


def url_source(url: str | None, cache_dir: Path) -> Source:
    """The text at ``url``, downloaded once into ``cache_dir/source.txt``: one document."""
    if not url:
        raise UserError("data.url is not set", hint="pass data.url=<address of a text file>")
    target = cache_dir / "source.txt"
    if not target.exists():
        download(url, target)
    return files_source([target], cache_dir, "url", url, "text", "text", skip_binary=False)


def download(url: str, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".part")
    try:
        with urllib.request.urlopen(url, timeout=60) as response, open(partial, "wb") as out:
            while chunk := response.read(1 << 20):
                out.write(chunk)
    except BaseException as err:  # a failed or interrupted download leaves nothing behind
        partial.unlink(missing_ok=True)
        if not isinstance(err, OSError):
            raise
        raise UserError(f"could not download {url}: {err}",
                        hint="check the network, or download the file yourself and use data=text data.path=<file>",
                        ) from None
    os.replace(partial, target)

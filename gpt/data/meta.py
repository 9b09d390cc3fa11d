"""meta.json of a prepared data set, read and checked before any token is trusted.

A prepared folder is accepted only if meta.json is an object of format version 2 with the expected
types, its tokenizer entry is complete (the vocabulary size agrees with the vocabulary), its dtype is
the one preparation picks for that vocabulary, every shard file is present with exactly its recorded
tokens, and the token ids are within the vocabulary: the largest id recorded at preparation, and the
ids in a few small evenly spaced slices of every shard. Each refusal is one UserError naming the file.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from gpt.errors import UserError
from gpt.tokenizers import tokenizer as tok
from gpt.validate import Record, read_json

FORMAT_VERSION = 2
SPLITS = ("train", "val")
REBUILD_HINT = "the prepared data is damaged or was edited: re-prepare it with data.rebuild=true"
SAMPLE_SLICES, SAMPLE_TOKENS = 8, 4096  # per shard: ids read to check the vocabulary (a few pages each)

Fail = Callable[[str], UserError]  # a problem -> the UserError naming meta.json that reports it


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned dtype that holds every token id: uint16 up to 65536 tokens, else uint32."""
    if vocab_size <= np.iinfo(np.uint16).max + 1:
        return np.dtype(np.uint16)
    if vocab_size <= np.iinfo(np.uint32).max + 1:
        return np.dtype(np.uint32)
    raise UserError(f"a vocabulary of {vocab_size} tokens does not fit in uint32 token files")


def read_meta(data_dir: Path) -> dict[str, Any] | None:
    """The parsed meta.json of ``data_dir`` (None if there is none); a UserError if it is not a JSON object."""
    path = data_dir / "meta.json"
    if not path.exists():
        return None
    meta = read_json(path, hint=REBUILD_HINT)
    if not isinstance(meta, dict):
        raise UserError(f"{path} holds a JSON {type(meta).__name__}, not an object", hint=REBUILD_HINT)
    return meta


def check_version(meta: dict[str, Any], data_dir: Path) -> None:
    """Refuse data in another format (version 1: train.bin/val.bin, documents not separated)."""
    if meta.get("version") != FORMAT_VERSION:
        raise UserError(f"{data_dir} holds data prepared in format version {meta.get('version')}, "
                        f"this framework reads version {FORMAT_VERSION} (sharded, documents separated)",
                        hint="re-prepare it: add data.rebuild=true (or force=true to scripts/prepare.py)")


def check_meta(meta: dict[str, Any], data_dir: Path) -> None:
    """Refuse a meta.json whose schema, types, tokenizer, dtype or split entries are not those preparation writes."""
    path = data_dir / "meta.json"
    check_version(meta, data_dir)
    record = Record(meta, str(path), REBUILD_HINT)

    def fail(problem: str) -> UserError:
        return record.error(problem)

    vocab = check_tokenizer(meta.get("tokenizer"), fail)
    dtype = record.str("dtype", choices=("uint16", "uint32"))
    if np.dtype(dtype) != token_dtype(vocab):
        raise fail(f"dtype {dtype} is not the {token_dtype(vocab).name} of a {vocab}-token vocabulary")
    source = record.record("source", {})
    source.record("settings", {})
    for key in ("description", "fingerprint"):
        source.str(key, None)
    splits = record.record("splits")
    for split in SPLITS:
        check_split(splits.record(split), vocab)


def check_tokenizer(entry: Any, fail: Fail) -> int:
    """The vocabulary size of a complete tokenizer entry (char: its characters; gpt2: r50k_base)."""
    problem = tok.description_problem(entry)
    if problem:
        raise fail(problem)
    return entry["vocab_size"]


def check_split(entry: Record, vocab: int) -> None:
    """One split's entry: shard names and counts, totals that add up, and its largest token id within ``vocab``."""
    split = entry.field.removeprefix("splits.")
    shards = entry.list("shards", nonempty=True)
    for i, shard in enumerate(shards):
        if (not isinstance(shard, dict) or not is_count(shard.get("tokens"))
                or not isinstance(shard.get("file"), str)
                or not re.fullmatch(rf"{split}_\d{{6}}\.bin", shard["file"])):
            raise entry.error(f"splits.{split}.shards[{i}] must be {{\"file\": \"{split}_NNNNNN.bin\", "
                              "\"tokens\": <count>}")
    for key in ("tokens", "bytes", "documents"):
        entry.int(key)
    if entry.value["tokens"] != sum(s["tokens"] for s in shards):
        raise entry.error(f"splits.{split}.tokens is {entry.value['tokens']}, its shards hold "
                          f"{sum(s['tokens'] for s in shards)}")
    # max_token is absent in data prepared before it was recorded: the sampled check still runs
    entry.int("max_token", None, high=vocab - 1)


def is_count(value: Any) -> bool:
    """A non-negative int (JSON booleans excluded)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def check_shards(meta: dict[str, Any], data_dir: Path) -> None:
    """Every shard present with exactly its recorded tokens, and sampled ids within the vocabulary (cheap: a stat
    and a few pages per shard)."""
    dtype, vocab = np.dtype(meta["dtype"]), meta["tokenizer"]["vocab_size"]
    for split in SPLITS:
        for shard in meta["splits"][split]["shards"]:
            path = data_dir / shard["file"]
            if not path.is_file():
                raise UserError(f"{path} is missing (meta.json lists it)", hint=REBUILD_HINT)
            size, expected = path.stat().st_size, shard["tokens"] * dtype.itemsize
            if size != expected:
                raise UserError(f"{path} holds {size} bytes, meta.json says {shard['tokens']} {dtype.name} tokens "
                                f"({expected} bytes)", hint=REBUILD_HINT)
            if shard["tokens"]:
                top = sampled_max(np.memmap(path, dtype=dtype, mode="r"))
                if top >= vocab:
                    raise UserError(f"{path} holds token id {top}, outside the {vocab}-token vocabulary",
                                    hint=REBUILD_HINT)


def sampled_max(ids: np.ndarray) -> int:
    """The largest id in SAMPLE_SLICES evenly spaced slices of SAMPLE_TOKENS ids (all of ``ids`` if that is less)."""
    if len(ids) <= SAMPLE_SLICES * SAMPLE_TOKENS:
        return int(ids.max())
    starts = np.linspace(0, len(ids) - SAMPLE_TOKENS, SAMPLE_SLICES).astype(np.int64)
    return max(int(ids[s : s + SAMPLE_TOKENS].max()) for s in starts)


def open_meta(data_dir: Path) -> dict[str, Any]:
    """The checked meta.json of a prepared folder whose shards are all present and of the right size."""
    meta = read_meta(data_dir)
    if meta is None:
        raise UserError(f"no prepared data in {data_dir} (meta.json missing)", hint="run scripts/prepare.py first")
    check_meta(meta, data_dir)
    check_shards(meta, data_dir)
    return meta

"""Turn a corpus into data/<name>/{train,val}.bin (flat token ids) plus meta.json describing them."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from gpt import tokenizer as tok
from gpt.checkpoint import atomic_write
from gpt.data.config import DataConfig
from gpt.data.sources import Corpus, load_corpus
from gpt.errors import UserError

FORMAT_VERSION = 1


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned dtype that holds every token id: uint16 up to 65536 tokens, else uint32."""
    if vocab_size <= np.iinfo(np.uint16).max + 1:
        return np.dtype(np.uint16)
    if vocab_size <= np.iinfo(np.uint32).max + 1:
        return np.dtype(np.uint32)
    raise UserError(f"a vocabulary of {vocab_size} tokens does not fit in uint32 token files")


def encode_char(tokenizer: tok.CharTokenizer, text: str) -> np.ndarray:
    """Vectorised character encoding: code points through a lookup table (a Python loop is 50x slower)."""
    codepoints = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    table = np.full(max(ord(c) for c in tokenizer.chars) + 1, -1, dtype=np.int64)
    table[[ord(c) for c in tokenizer.chars]] = np.arange(tokenizer.vocab_size)
    ids = table[np.minimum(codepoints, len(table) - 1)]
    if (ids < 0).any() or (codepoints >= len(table)).any():
        bad = text[int(np.argmax((ids < 0) | (codepoints >= len(table))))]
        raise UserError(f"character {bad!r} is not in the character vocabulary")
    return ids


def split_documents(corpus: Corpus, val_fraction: float) -> tuple[str, str]:
    """Train and validation text. Ten or more documents: every k-th whole document is held out
    (k = round(1/val_fraction)); fewer: the last val_fraction of the concatenated text."""
    if not 0.0 < val_fraction < 1.0:
        raise UserError(f"data.val_fraction must be in (0, 1), got {val_fraction}")
    docs = [text for _, text in corpus.documents]
    k = max(2, round(1 / val_fraction))
    if len(docs) >= k:
        val = "".join(t for i, t in enumerate(docs) if i % k == k - 1)
        train = "".join(t for i, t in enumerate(docs) if i % k != k - 1)
        return train, val
    text = "".join(docs)
    cut = int(len(text) * (1 - val_fraction))
    return text[:cut], text[cut:]


def encode(tokenizer: tok.Tokenizer, text: str) -> np.ndarray:
    if isinstance(tokenizer, tok.CharTokenizer):
        return encode_char(tokenizer, text)
    return np.asarray(tokenizer.encode(text), dtype=np.int64)


def read_meta(data_dir: Path) -> dict[str, Any] | None:
    path = data_dir / "meta.json"
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise UserError(f"{path} is unreadable ({err})", hint=f"delete {data_dir} and run again to re-prepare") from None


def prepare(cfg: DataConfig, force: bool = False, log=print) -> Path:
    """Prepare the data set described by cfg unless an up-to-date copy exists; returns its folder.

    Up to date means meta.json names the same tokenizer and the same source fingerprint. A folder
    prepared from another source or tokenizer is refused unless force (or data.rebuild) is set, so
    nothing prepared is silently replaced. The new files are written to a temporary folder that
    replaces the old one only once complete: a failure midway leaves the old data as it was.
    """
    data_dir = Path(cfg.root) / cfg.name
    corpus = load_corpus(cfg)
    fingerprint = corpus.fingerprint()
    meta = read_meta(data_dir)
    if meta is not None and not (force or cfg.rebuild):
        same_source = meta.get("source", {}).get("fingerprint") == fingerprint
        same_tokenizer = meta.get("tokenizer", {}).get("kind") == cfg.tokenizer
        if same_source and same_tokenizer and meta.get("version") == FORMAT_VERSION:
            return data_dir
        was = f"{meta.get('source', {}).get('description', 'another source')} with the {meta.get('tokenizer', {}).get('kind')} tokenizer"
        raise UserError(
            f"{data_dir} was prepared from {was}, not from {corpus.description} with the {cfg.tokenizer} tokenizer",
            hint="pass data.name=<another folder> to keep both, or data.rebuild=true to replace it",
        )
    log(f"preparing {data_dir} from {corpus.description} with the {cfg.tokenizer} tokenizer")
    train_text, val_text = split_documents(corpus, cfg.val_fraction)
    tokenizer = tok.build(cfg.tokenizer, train_text + val_text)
    dtype = token_dtype(tokenizer.vocab_size)
    staging = data_dir.with_name(f".{cfg.name}.preparing")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        counts = {}
        for split, text in (("train", train_text), ("val", val_text)):
            ids = encode(tokenizer, text)
            atomic_write(staging / f"{split}.bin", ids.astype(dtype).tofile, what="prepared data")
            counts[f"{split}_tokens"] = int(ids.size)
        meta = {
            "version": FORMAT_VERSION,
            "tokenizer": tokenizer.to_meta(),
            "dtype": dtype.name,
            **counts,
            "source": {"kind": cfg.source, "description": corpus.description, "fingerprint": fingerprint,
                       "documents": len(corpus.documents)},
        }
        atomic_write(staging / "meta.json", lambda f: f.write(json.dumps(meta, indent=1, ensure_ascii=False).encode()),
                     what="prepared data")
        data_dir.mkdir(parents=True, exist_ok=True)
        (data_dir / "meta.json").unlink(missing_ok=True)
        for name in ("train.bin", "val.bin", "meta.json"):  # meta.json last: it marks the folder complete
            os.replace(staging / name, data_dir / name)
    except OSError as err:
        raise UserError(f"could not write prepared data to {data_dir}: {err.strerror or err}",
                        hint="free disk space or choose another data.root") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log(f"wrote {counts['train_tokens']:,} train and {counts['val_tokens']:,} val tokens ({dtype.name}) to {data_dir}")
    return data_dir

"""Train a byte-level BPE tokenizer on any corpus the project reads: the body of scripts/train_tokenizer.py.

The documents stream from the data source (files, JSONL, parquet, Hugging Face datasets, the built-in corpora)
in batches into the ``tokenizers`` library's BPE trainer, which keeps counts of distinct words, not the text, so
a corpus larger than memory works. Only the training split is read (the documents preparation would put in
validation are held out), so the tokenizer can be judged on text it has not seen. The special tokens get ids
0..k-1, then the 256 bytes, then the merges. The folder written opens with ``AutoTokenizer.from_pretrained``
and with ``data.tokenizer=<folder>``.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from gpt.data.config import DataConfig
from gpt.data.encode import route
from gpt.data.prepare import load_source
from gpt.data.sources import Source
from gpt.errors import ConfigError, UserError
from gpt.files import atomic_write
from gpt.model.config import MISSING
from gpt.tokenizers import bpe
from gpt.tokenizers.files import tokenizer_files
from gpt.tokenizers.tokenizer import BPETokenizer, valid_unicode

BATCH_CHARS = 1 << 20  # text handed to the trainer at a time
REPORT = "report.json"

Log = Callable[[str], None]


@dataclass
class BPEConfig:
    """The ``tokenizer`` group: the vocabulary to learn."""

    vocab_size: int = 4096  # every token: the special tokens, the 256 bytes and the merges learnt
    special_tokens: list[str] = field(default_factory=lambda: list(bpe.DEFAULT_SPECIAL_TOKENS))  # ids 0..k-1
    min_frequency: int = 2  # a pair seen fewer times is never merged
    max_chars: Optional[int] = None  # learn from the first N characters of the training documents (None: all)

    def __post_init__(self) -> None:
        specials = list(self.special_tokens)
        if any(not isinstance(s, str) or not s for s in specials) or len(set(specials)) != len(specials):
            raise ConfigError(f"tokenizer.special_tokens must be distinct non-empty strings, got {specials}")
        least = 256 + len(specials) + 1
        if not least <= self.vocab_size <= 1 << 32:
            raise ConfigError(f"tokenizer.vocab_size must be at least {least} (the 256 bytes, {len(specials)} "
                              f"special tokens and one merge), got {self.vocab_size}")
        if self.min_frequency < 0:
            raise ConfigError(f"tokenizer.min_frequency must be >= 0, got {self.min_frequency}")
        if self.max_chars is not None and self.max_chars < 1:
            raise ConfigError(f"tokenizer.max_chars must be positive or null, got {self.max_chars}")


@dataclass
class TrainTokenizerConfig:
    """scripts/train_tokenizer.py's settings (configs/train_tokenizer.yaml)."""

    data: DataConfig = field(default_factory=DataConfig)  # the corpus (its tokenizer and name are not used)
    tokenizer: BPEConfig = field(default_factory=BPEConfig)
    out: str = MISSING  # the folder to write: tokenizer.json, its transformers config, report.json
    overwrite: bool = False  # replace a tokenizer already in out
    evaluate: bool = True  # afterwards, compare bytes per token with GPT-2's BPE and characters (one more pass)


def run(cfg: TrainTokenizerConfig, log: Log = print) -> Path:
    """Train, write the folder, then (if asked) evaluate; returns the folder."""
    out = Path(cfg.out).expanduser()
    check_out(out, cfg.overwrite)
    source = load_source(cfg.data)
    log(f"training a {cfg.tokenizer.vocab_size:,}-token byte-level BPE on {source.description}")
    started = time.perf_counter()
    tokenizer, read = train(source, cfg.tokenizer, cfg.data.val_fraction)
    seconds = time.perf_counter() - started
    if tokenizer.vocab_size < cfg.tokenizer.vocab_size:
        log(f"note: the corpus gave only {tokenizer.vocab_size:,} tokens (no pair left seen "
            f"{cfg.tokenizer.min_frequency} times)")
    log(f"learnt {tokenizer.vocab_size:,} tokens from {read['documents']:,} documents "
        f"({read['characters']:,} characters) in {seconds:.1f} s")
    report: dict[str, Any] = {"source": {"kind": source.kind, "description": source.description,
                                         "fingerprint": source.fingerprint(), "val_fraction": cfg.data.val_fraction},
                              "settings": vars(cfg.tokenizer) | {"special_tokens": list(cfg.tokenizer.special_tokens)},
                              "vocab_size": tokenizer.vocab_size, "special_tokens": tokenizer.special_tokens,
                              "sha256": tokenizer.sha256, "trained_on": read, "seconds": round(seconds, 2)}
    write(out, tokenizer, report)
    log(f"wrote {out / bpe.FILE_NAME} (use it with data.tokenizer={out})")
    if cfg.evaluate:
        from gpt.evaluation.tokenizer import compare, table

        report["evaluation"] = compare({str(out): tokenizer, "gpt2": "gpt2", "char": "char"}, source,
                                       cfg.data.val_fraction, log)
        log(table(report["evaluation"]))
        write_report(out, report)
    return out


def check_out(out: Path, overwrite: bool) -> None:
    """Refuse an out= that is a file, or a folder holding a tokenizer already unless overwrite=true."""
    if out.exists() and not out.is_dir():
        raise UserError(f"out={out} is a file, not a folder", hint="give out= a folder path (it is created)")
    if (out / bpe.FILE_NAME).exists() and not overwrite:
        raise UserError(f"out={out} already holds a {bpe.FILE_NAME}",
                        hint="pass overwrite=true to replace it, or pick another out=")


def train(source: Source, cfg: BPEConfig, val_fraction: float) -> tuple[BPETokenizer, dict[str, int]]:
    """A BPE learnt from the training split of ``source`` (checked like any tokenizer.json), and what it read."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    library = Tokenizer(models.BPE())
    library.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)  # GPT-2's split
    library.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=cfg.vocab_size, min_frequency=cfg.min_frequency,
                                  special_tokens=list(cfg.special_tokens), show_progress=sys.stderr.isatty(),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # every byte, seen or not
    read = {"documents": 0, "characters": 0}
    in_background(lambda: library.train_from_iterator(training_batches(source, val_fraction, cfg.max_chars, read),
                                                      trainer))
    if not read["characters"]:
        raise UserError(f"{source.description} has no text in its training split",
                        hint="point the data source at files with text in them")
    return BPETokenizer(library.to_str(), "the trained tokenizer"), read


def in_background(work: Callable[[], None]) -> None:
    """Run ``work`` on a daemon thread and wait for it, so that Ctrl-C stops this process at once: the library
    learns the merges in Rust without returning to Python (seconds to minutes), where no signal handler runs."""
    failed: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as err:  # handed to the waiting thread
            failed.append(err)

    thread = threading.Thread(target=run, name="learn tokenizer", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(0.1)
    if failed:
        raise failed[0]


def training_batches(source: Source, val_fraction: float, max_chars: int | None,
                     read: dict[str, int]) -> Iterator[list[str]]:
    """Batches of the training split's documents (validation documents held out, as preparation splits them), up to
    ``max_chars`` characters in all; ``read`` counts the documents and characters given."""
    batch: list[str] = []
    size = 0
    for _, split, text, _ in route(source.documents(), val_fraction):
        if split != "train" or not text:
            continue
        if max_chars is not None:
            text = text[: max_chars - read["characters"]]
        batch.append(text if text.isascii() else valid_unicode(text))
        size += len(text)
        read["documents"] += 1
        read["characters"] += len(text)
        if size >= BATCH_CHARS:
            yield batch
            batch, size = [], 0
        if max_chars is not None and read["characters"] >= max_chars:
            break
    if batch:
        yield batch


def write(out: Path, tokenizer: BPETokenizer, report: dict[str, Any]) -> None:
    """tokenizer.json and the configuration transformers reads beside it, then report.json, each atomically."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"could not create out={out}: {err.strerror or err}") from None
    for name, text in tokenizer_files(tokenizer.to_meta()).items():
        atomic_write(out / name, lambda f, text=text: f.write(text.encode("utf-8")), what=name)
    write_report(out, report)


def write_report(out: Path, report: dict[str, Any]) -> None:
    blob = json.dumps(report, indent=1, ensure_ascii=False).encode("utf-8")
    atomic_write(out / REPORT, lambda f: f.write(blob), what="the training report")

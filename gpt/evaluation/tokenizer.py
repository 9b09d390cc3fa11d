"""How well tokenizers compress a corpus and whether they give it back: the body of scripts/eval_tokenizer.py
(scripts/train_tokenizer.py runs it after training).

One pass over the corpus, split into train and validation documents exactly as preparation splits them (so the
validation documents are held out from a tokenizer trained here), counts each tokenizer's tokens per UTF-8 byte
and checks that every byte-level tokenizer decodes every document back to the same bytes. For a corpus of text
files, files that are not valid UTF-8 (preparation reads them with U+FFFD in place of the bad bytes) are also
encoded from their raw bytes and must decode to exactly those bytes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from gpt.data.config import DataConfig
from gpt.data.encode import route, text_bytes
from gpt.data.prepare import load_source
from gpt.data.sources import Source
from gpt.errors import ConfigError, UserError
from gpt.files import atomic_write
from gpt.tokenizers import tokenizer as tok

SPLITS = ("train", "val")
BATCH_CHARS = 1 << 20
SHOWN_FAILURES = 5

Log = Callable[[str], None]


@dataclass
class EvalTokenizerConfig:
    """scripts/eval_tokenizer.py's settings (configs/eval_tokenizer.yaml)."""

    tokenizers: list[str] = field(default_factory=lambda: ["gpt2", "char"])  # char, gpt2, tokenizer.json or folder
    data: DataConfig = field(default_factory=DataConfig)  # the corpus (its tokenizer and name are not used)
    out: Optional[str] = None  # also write the results to this JSON file

    def __post_init__(self) -> None:
        if not self.tokenizers:
            raise ConfigError("tokenizers is empty", hint="e.g. tokenizers=[tokenizers/mine,gpt2,char]")
        if self.out is not None and not self.out.endswith(".json"):
            raise ConfigError(f"out must name a .json file, got {self.out!r}")


def run(cfg: EvalTokenizerConfig, log: Log = print) -> dict[str, Any]:
    out = Path(cfg.out) if cfg.out else None
    if out is not None and not out.parent.is_dir():
        raise UserError(f"the folder of out={out} does not exist", hint="create it or write elsewhere")
    named = {name: name for name in cfg.tokenizers}
    for name in named:  # a missing file is an error before the corpus is read (gpt2 offline is only noted)
        if name not in ("char", "gpt2"):
            named[name] = tok.BPETokenizer.from_file(name)
    results = compare(named, load_source(cfg.data), cfg.data.val_fraction, log)
    log(table(results))
    if out is not None:
        blob = json.dumps(results, indent=1).encode()
        atomic_write(out, lambda f: f.write(blob), what="tokenizer evaluation")
    return results


@dataclass
class Tally:
    """One tokenizer's counts: tokens per split, documents that did not come back, raw files checked."""

    name: str
    tokenizer: Any  # a Tokenizer, or "char" (one token per character: only the characters are counted)
    tokens: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SPLITS, 0))
    checked: int = 0
    failed: list[str] = field(default_factory=list)

    def add(self, split: str, documents: list[tuple[int, str]]) -> None:
        texts = [text for _, text in documents]
        if self.tokenizer == "char":
            self.tokens[split] += sum(len(t) for t in texts)
            return
        batch = getattr(self.tokenizer, "encode_batch", None)
        rows = batch(texts) if batch else [self.tokenizer.encode(t) for t in texts]
        self.tokens[split] += sum(len(r) for r in rows)
        for (index, text), ids in zip(documents, rows):
            expected = text.encode("utf-8") if text.isascii() else tok.valid_unicode(text).encode("utf-8")
            self.checked += 1
            if tok.decode_bytes(self.tokenizer, ids) != expected:
                self.failed.append(f"document {index}")


def build(named: dict[str, Any], notes: list[str]) -> list[Tally]:
    """A Tally per tokenizer (names char and gpt2 built here; GPT-2 left out, with a note, when it is unavailable)."""
    tallies = []
    for name, tokenizer in named.items():
        if tokenizer == "gpt2":
            try:
                tokenizer = tok.GPT2Tokenizer()
            except UserError as err:
                notes.append(f"gpt2 left out: {err}")
                continue
        tallies.append(Tally(name, tokenizer))
    return tallies


def compare(named: dict[str, Any], source: Source, val_fraction: float, log: Log = print) -> dict[str, Any]:
    """Bytes per token on each split and round-trip exactness, for each of ``named`` (a Tokenizer, or "char"/"gpt2")."""
    notes: list[str] = []
    tallies = build(named, notes)
    n_bytes, documents, chars = dict.fromkeys(SPLITS, 0), dict.fromkeys(SPLITS, 0), set()
    for split, batch in batches(source, val_fraction):
        n_bytes[split] += sum(text_bytes(text) for _, text in batch)
        documents[split] += len(batch)
        for _, text in batch:
            chars.update(text)
        for tally in tallies:
            tally.add(split, batch)
    if not sum(n_bytes.values()):
        raise UserError(f"{source.description} holds no text", hint="point the data source at files with text in them")
    not_utf8 = raw_round_trip(source, [t for t in tallies if t.tokenizer != "char"])
    rows = []
    for t in tallies:
        rows.append({"name": t.name, "kind": "char" if t.tokenizer == "char" else t.tokenizer.kind,
                     "vocab_size": len(chars) if t.tokenizer == "char" else t.tokenizer.vocab_size,
                     "tokens": t.tokens,
                     "bytes_per_token": {s: n_bytes[s] / t.tokens[s] if t.tokens[s] else None for s in SPLITS},
                     "round_trip": None if t.tokenizer == "char" else
                     {"documents": t.checked, "files_not_utf8": not_utf8, "failed": t.failed[:SHOWN_FAILURES],
                      "exact": not t.failed}})
    return {"corpus": source.description, "documents": documents, "bytes": n_bytes, "tokenizers": rows, "notes": notes}


def batches(source: Source, val_fraction: float) -> Iterator[tuple[str, list[tuple[int, str]]]]:
    """(split, [(document index, text), ...]) about BATCH_CHARS at a time, split as preparation splits them."""
    pending: dict[str, list[tuple[int, str]]] = {s: [] for s in SPLITS}
    size = dict.fromkeys(SPLITS, 0)
    for index, split, text, _ in route(source.documents(), val_fraction):
        if not text:
            continue
        pending[split].append((index, text))
        size[split] += len(text)
        if size[split] >= BATCH_CHARS:
            yield split, pending[split]
            pending[split], size[split] = [], 0
    for split in SPLITS:
        if pending[split]:
            yield split, pending[split]


def raw_round_trip(source: Source, tallies: list[Tally]) -> int:
    """Encode each text file that is not valid UTF-8 from its bytes and check it decodes to exactly them (the valid
    ones are their documents, checked already); the number of such files."""
    if source.raw is None:
        return 0
    count = 0
    for path, data in source.raw():
        try:
            data.decode("utf-8")
            continue
        except UnicodeDecodeError:
            count += 1
        for tally in tallies:
            tally.checked += 1
            if tok.decode_bytes(tally.tokenizer, tok.encode_bytes(tally.tokenizer, data)) != data:
                tally.failed.append(f"{path} (raw bytes)")
    return count


def table(results: dict[str, Any]) -> str:
    """The comparison as a Markdown table, with the corpus and any notes."""
    docs, size = results["documents"], results["bytes"]
    lines = [f"{results['corpus']}: train {docs['train']:,} documents ({size['train']:,} bytes), "
             f"val {docs['val']:,} documents ({size['val']:,} bytes)", "",
             "| tokenizer | vocab | train bytes/token | val bytes/token | round trip |", "|---|---|---|---|---|"]
    for row in results["tokenizers"]:
        per = [f"{row['bytes_per_token'][s]:.3f}" if row["bytes_per_token"][s] else "-" for s in SPLITS]
        lines.append(f"| {row['name']} | {row['vocab_size']:,} | {per[0]} | {per[1]} | {round_trip(row)} |")
    return "\n".join(lines + [f"note: {n}" for n in results["notes"]])


def round_trip(row: dict[str, Any]) -> str:
    trip = row["round_trip"]
    if trip is None:
        return "-"
    raw = f", {trip['files_not_utf8']} file(s) not UTF-8 from raw bytes" if trip["files_not_utf8"] else ""
    if trip["exact"]:
        return f"exact ({trip['documents']:,} checked{raw})"
    return f"FAILED: {', '.join(trip['failed'])}"

"""Turn a corpus into data/<name>/: fixed-size token shards per split plus meta.json describing them.

Documents stream from the source (memory does not grow with the corpus), are split into train and
validation by whole documents, encoded in chunks on ``data.num_proc`` threads (while the main thread reads
on) and appended in order to shards of ``data.shard_tokens`` tokens in a staging folder. A checkpoint after
every completed shard lets an interrupted preparation continue from there; the finished folder replaces the
old one only once complete. One process prepares a data set at a time (gpt.data.lock); gpt.data.meta checks
a prepared folder when opened.

meta.json (version 2)::

    {"version": 2, "tokenizer": {...}, "dtype": "uint16",
     "splits": {"train": {"shards": [{"file": "train_000000.bin", "tokens": N}, ...], "tokens": N,
                          "bytes": <UTF-8 bytes of the text behind the split>, "documents": D,
                          "max_token": <largest id, checked against the vocabulary when opened>},
                "val": {...}},
     "source": {"kind", "description", "fingerprint", "settings", "documents", "empty_documents"}}
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np

from gpt.data.config import TOKENIZERS, DataConfig
from gpt.data.encode import Encoder, every_kth, make_encoder, route, text_bytes
from gpt.data.hf import hf_source
from gpt.data.lock import preparation_lock
from gpt.data.meta import FORMAT_VERSION, SPLITS, check_meta, read_meta, token_dtype  # noqa: F401
from gpt.data.progress import Progress
from gpt.data.shards import ShardWriter
from gpt.data.sources import Source, format_source, path_source, stdlib_source, url_source
from gpt.errors import UserError
from gpt.files import atomic_write, signals_deferred, sigterm_interrupts
from gpt.tokenizers import tokenizer as tok
from gpt.validate import Record, read_json

PROGRESS_FILE = "progress.json"
CHUNK_CHARS = 1_000_000  # text per chunk: one thread's unit of work (about 0.07 s of GPT-2 BPE)
CHUNK_DOCS = 4096
WRITE_HINT = "free disk space or choose another data.root"
REPLACE_HINT = "pass data.name=<another folder> to keep both, or data.rebuild=true to replace it"

Log = Callable[[str], None]


def tokenizer_choice(cfg: DataConfig) -> str | tok.BPETokenizer | None:
    """What data.tokenizer asks for: None (the prepared data's, char when preparing now), "char", "gpt2", or the
    byte-level BPE read (and checked) from the tokenizer.json it names."""
    if cfg.tokenizer is None or cfg.tokenizer in TOKENIZERS:
        return cfg.tokenizer
    if not Path(cfg.tokenizer).expanduser().exists():
        raise UserError(f"unknown data.tokenizer {cfg.tokenizer!r}: not char, gpt2 or an existing tokenizer.json "
                        "(or folder holding one)", hint="train one with scripts/train_tokenizer.py, or check the path")
    return tok.BPETokenizer.from_file(cfg.tokenizer)


def settings(cfg: DataConfig, choice: str | tok.BPETokenizer | None = "char") -> dict[str, Any]:
    """The preparation choices, beside the corpus itself, that the prepared files depend on (with choice None, the
    tokenizer's are left out: they are whatever the data was prepared with)."""
    chosen: dict[str, Any] = {"val_fraction": cfg.val_fraction, "shard_tokens": cfg.shard_tokens}
    if choice is not None:
        ends = choice == "gpt2" or (isinstance(choice, tok.BPETokenizer) and choice.eot_token is not None)
        chosen = {"tokenizer": choice if isinstance(choice, str) else choice.kind, "val_fraction": cfg.val_fraction,
                  "document_end": "<|endoftext|>" if ends else "none", "shard_tokens": cfg.shard_tokens}
    if cfg.source in ("files", "hf"):
        chosen["text_field"] = cfg.text_field
    if cfg.source == "files":
        chosen["format"] = cfg.format
    return chosen


def same_tokenizer(meta: dict[str, Any], choice: str | tok.BPETokenizer | None) -> bool:
    """Whether prepared data's tokenizer description is the one asked for (a BPE: the same tokenizer.json)."""
    if choice is None:
        return True
    if isinstance(choice, str):
        return meta["kind"] == choice
    return meta["kind"] == "bpe" and meta.get("sha256") == choice.sha256


def tokenizer_label(tokenizer: dict[str, Any] | str | tok.BPETokenizer | None) -> str:
    """``char``, ``gpt2`` or ``4096-token BPE 1a2b3c4d`` (its sha256), for messages."""
    if isinstance(tokenizer, tok.BPETokenizer):
        tokenizer = tokenizer.to_meta()
    if isinstance(tokenizer, dict):
        if tokenizer.get("kind") != "bpe":
            return str(tokenizer.get("kind"))
        return f"{tokenizer.get('vocab_size'):,}-token BPE {str(tokenizer.get('sha256'))[:8]}"
    return tokenizer or "char"


def up_to_date(meta: dict[str, Any], data_dir: Path, source: Source, cfg: DataConfig,
               choice: str | tok.BPETokenizer | None = None) -> bool:
    """True if ``meta`` describes this source, tokenizer (``choice``, see tokenizer_choice) and these settings; a
    UserError when it describes other data.

    A setting that a meta.json written before it was recorded lacks (shard_tokens) is not held against it.
    """
    check_meta(meta, data_dir)
    was = meta.get("source", {})
    was_settings, was_tokenizer = was.get("settings", {}), meta["tokenizer"]
    if was.get("description") != source.description or not same_tokenizer(was_tokenizer, choice):
        asked = tokenizer_label(choice) + (f" ({cfg.tokenizer})" if isinstance(choice, tok.BPETokenizer) else "")
        raise UserError(f"{data_dir} was prepared from {was.get('description', 'another source')} with the "
                        f"{tokenizer_label(was_tokenizer)} tokenizer, not from {source.description} with the "
                        f"{asked} tokenizer", hint=REPLACE_HINT)
    differ = [f"data.{k}={was_settings[k]}, not {v}" for k, v in settings(cfg, choice).items()
              if k in was_settings and was_settings[k] != v]
    if differ:
        raise UserError(f"{data_dir} was prepared with {', '.join(differ)}", hint=REPLACE_HINT)
    if was.get("fingerprint") != source.fingerprint():
        raise UserError(f"{data_dir} was prepared from {source.description} as it was then, not from "
                        f"{source.description} as it is now (its files changed since)", hint=REPLACE_HINT)
    return True


def load_source(cfg: DataConfig) -> Source:
    """The documents of data.source, read lazily (nothing is fetched or opened until iteration)."""
    if cfg.source == "stdlib":
        return stdlib_source()
    if cfg.source == "path":
        return path_source(cfg)
    if cfg.source == "files":
        return format_source(cfg)
    if cfg.source == "url":
        return url_source(cfg.url, Path(cfg.root) / cfg.name)
    if cfg.source == "hf":
        return hf_source(cfg)
    raise UserError(f"unknown data.source {cfg.source!r}", hint="use stdlib, path, files, url or hf")


def prepare(cfg: DataConfig, force: bool = False, log: Log = print) -> Path:
    """Prepare the data set described by cfg unless an up-to-date copy exists; returns its folder.

    Up to date is decided from meta.json and the source's manifest (file sizes and modification times,
    a dataset's name and revision), without reading the corpus. A folder prepared from another source,
    tokenizer or setting is refused unless force (or data.rebuild) is set, so nothing is silently replaced.
    One process prepares a data set at a time: another one waits for it, then reuses its result.
    """
    data_dir = Path(cfg.root) / cfg.name
    source = load_source(cfg)
    choice = tokenizer_choice(cfg)
    rebuild = force or cfg.rebuild
    if not rebuild and is_prepared(data_dir, source, cfg, choice):
        return data_dir
    with preparation_lock(data_dir, log) as waited:
        if (waited or not rebuild) and is_prepared(data_dir, source, cfg, choice, quiet=rebuild):
            return data_dir  # prepared meanwhile by the process this one waited for
        with sigterm_interrupts():
            build(cfg, source, data_dir, log, "char" if choice is None else choice)
    return data_dir


def is_prepared(data_dir: Path, source: Source, cfg: DataConfig, choice: str | tok.BPETokenizer | None,
                quiet: bool = False) -> bool:
    """Whether data_dir holds this data, up to date; a UserError if it holds other data (False instead if quiet)."""
    try:
        meta = read_meta(data_dir)
        return meta is not None and up_to_date(meta, data_dir, source, cfg, choice)
    except UserError:
        if quiet:
            return False
        raise


def build(cfg: DataConfig, source: Source, data_dir: Path, log: Log, choice: str | tok.BPETokenizer = "char") -> None:
    """Prepare into a staging folder (continuing an interrupted run of the same job), then commit it.

    Stopped by Ctrl-C or SIGTERM, it raises KeyboardInterrupt with one line saying what was kept."""
    staging = data_dir.with_name(f".{cfg.name}.preparing")
    job = [FORMAT_VERSION, source.fingerprint(), settings(cfg, choice), cfg.shard_tokens]
    if isinstance(choice, tok.BPETokenizer):
        job.append(choice.sha256)  # which BPE: an interrupted preparation with another one is not continued
    key = hashlib.sha256(json.dumps(job, sort_keys=True).encode()).hexdigest()
    resume = read_progress(staging, key)
    if resume is None:
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
    committed = False
    try:
        log(f"preparing {data_dir} from {source.description} with the {tokenizer_label(choice)} tokenizer")
        tokenizer = make_tokenizer(choice, source)
        meta = encode_corpus(cfg, source, tokenizer, staging, key, resume, log, settings(cfg, choice))
        with signals_deferred():  # a Ctrl-C now stops the process once the new data is complete in data_dir
            commit(staging, data_dir, meta)
            shutil.rmtree(staging, ignore_errors=True)
            committed = True
    except BaseException as err:
        if committed:  # a signal that came while the new data was put in place: it is complete
            raise KeyboardInterrupt(f"preparation stopped ({str(err) or 'Ctrl-C'}) once complete: {data_dir} holds "
                                    "the new data") \
                from None
        kept = read_progress(staging, key)
        if kept is None:
            shutil.rmtree(staging, ignore_errors=True)
        what = (f"the {sum(len(w['shards']) for w in kept['writers'].values())} shard file(s) completed so far are "
                f"kept in {staging}: run the same command again to continue from there" if kept
                else "no shard was complete, nothing kept")
        if isinstance(err, KeyboardInterrupt):
            raise KeyboardInterrupt(f"preparation stopped ({str(err) or 'Ctrl-C'}); {what}; {data_dir} is as it was") \
                from None
        if isinstance(err, OSError):  # a full disk (numpy's short write: "N requested and M written"), a quota
            raise UserError(f"could not write the prepared data in {staging}: {err.strerror or err}; {what}; "
                            f"{data_dir} is as it was", hint=WRITE_HINT) from None
        if kept:
            log(f"preparation stopped; {what}")
        raise
    splits = meta["splits"]
    log(f"wrote {splits['train']['tokens']:,} train and {splits['val']['tokens']:,} val tokens "
        f"({meta['dtype']}, {sum(len(s['shards']) for s in splits.values())} shard files) to {data_dir}"
        + (f"; skipped {meta['source']['empty_documents']:,} empty document(s)" if meta["source"]["empty_documents"]
           else ""))


def read_progress(staging: Path, key: str) -> dict[str, Any] | None:
    """The checkpoint of an interrupted preparation of the same job, if one is in ``staging``; one that is
    unreadable, damaged or of another job is ignored (the preparation starts over)."""
    path = staging / PROGRESS_FILE
    if not path.is_file():
        return None
    try:
        progress = Record(read_json(path), str(path))
        if progress.str("key") != key:
            return None
        progress.int("documents_read")
        progress.int("empty")
        for split in SPLITS:
            stats, writer = progress.record("stats").record(split), progress.record("writers").record(split)
            stats.int("documents")
            stats.int("bytes")
            writer.int("current")
            writer.int("max_token", -1, low=-1)
            for i, shard in enumerate(writer.list("shards", of=dict)):
                Record(shard, str(path)).int("tokens")
                if shard.get("file") != f"{split}_{i:06d}.bin":
                    return None
    except UserError:
        return None
    return progress.value


def make_tokenizer(choice: str | tok.BPETokenizer, source: Source) -> tok.Tokenizer:
    """The tokenizer; a character vocabulary takes one streaming pass over the corpus to collect its characters."""
    if isinstance(choice, tok.BPETokenizer):
        return choice
    if choice != "char":
        return tok.build(choice)
    chars: set[str] = set()
    for text in source.documents():
        chars.update(text)
    return tok.CharTokenizer(sorted(chars))


def encode_corpus(cfg: DataConfig, source: Source, tokenizer: tok.Tokenizer, staging: Path, key: str,
                  resume: dict[str, Any] | None, log: Log, chosen: dict[str, Any]) -> dict[str, Any]:
    """Stream, split, encode and shard every document into ``staging``; the meta.json it ends with."""
    dtype = token_dtype(tokenizer.vocab_size)
    writers = {s: ShardWriter(staging, s, dtype, cfg.shard_tokens, resume and resume["writers"][s]) for s in SPLITS}
    stats = resume["stats"] if resume else {s: {"documents": 0, "bytes": 0} for s in SPLITS}
    empty = resume["empty"] if resume else 0
    start = resume["documents_read"] if resume else 0
    if start:
        log(f"continuing an interrupted preparation after {start:,} documents "
            f"({sum(len(w.shards) for w in writers.values())} shard files done)")

    def written(read: tuple[int, int]) -> None:  # after each batch: a checkpoint once a shard is complete
        if any(w.completed for w in writers.values()) and read[0] >= every_kth(cfg.val_fraction):
            save_progress(staging, {"key": key, "documents_read": read[0], "empty": read[1], "stats": stats,
                                    "writers": {s: w.state() for s, w in writers.items()}})

    pipeline = EncodePipeline(make_encoder(tokenizer, dtype), cfg.num_proc or os.cpu_count() or 1, writers, stats,
                              Progress(source.total, log, done=start), written)
    chunk: Chunk = {s: ([], []) for s in SPLITS}
    size, index = 0, start - 1
    try:
        for index, split, text, end in route(islice(source.documents(), start, None), cfg.val_fraction, start):
            if not text:
                empty += end
                continue
            chunk[split][0].append(text)
            chunk[split][1].append(end)
            size += len(text)
            if size >= CHUNK_CHARS or len(chunk[split][0]) >= CHUNK_DOCS:
                pipeline.submit(chunk, (index + 1, empty))
                chunk, size = {s: ([], []) for s in SPLITS}, 0
        pipeline.submit(chunk, (index + 1, empty))
        pipeline.finish()
    finally:
        pipeline.stop()
    if not stats["train"]["documents"] and not stats["val"]["documents"]:
        if source.binary:
            raise UserError(f"{source.description} holds no text: {len(source.binary)} binary file(s) were skipped "
                            f"(e.g. {source.binary[0]}) and any others are empty",
                            hint="point data.path at text files (or data=files for JSONL and parquet)")
        raise UserError(f"{source.description} holds only empty files or documents",
                        hint="point the data source at files with text in them")
    splits = {}
    for split, writer in writers.items():
        shards = writer.finish()
        splits[split] = {"shards": shards, "tokens": sum(s["tokens"] for s in shards),
                         "max_token": writer.max_token if writer.max_token >= 0 else None, **stats[split]}
    return {"version": FORMAT_VERSION, "tokenizer": tokenizer.to_meta(), "dtype": dtype.name, "splits": splits,
            "source": {"kind": source.kind, "description": source.description, "fingerprint": source.fingerprint(),
                       "settings": chosen, "documents": index + 1, "empty_documents": empty}}


Chunk = dict[str, tuple[list[str], list[bool]]]  # split -> (texts, whether each ends its document)


class EncodePipeline:
    """Encodes chunks of documents on ``num_threads`` threads while the main thread reads on, and appends each
    chunk to the shard writers in reading order once it and every chunk before it are encoded.

    Up to 2 * num_threads + 2 chunks are in flight, so a thread never waits for the others to finish a batch
    (a long document holds up one thread, not all of them) and memory stays bounded."""

    def __init__(self, encoder: Encoder, num_threads: int, writers: dict[str, ShardWriter],
                 stats: dict[str, dict[str, int]], progress: Progress,
                 written: Callable[[tuple[int, int]], None]) -> None:
        self.encoder, self.writers, self.stats, self.progress, self.written = encoder, writers, stats, progress, written
        self.pool = ThreadPoolExecutor(num_threads, thread_name_prefix="encode")
        self.depth = 2 * num_threads + 2
        self.in_flight: deque[tuple[Future, tuple[int, int]]] = deque()

    def submit(self, chunk: Chunk, read: tuple[int, int]) -> None:
        """Start encoding ``chunk``, writing the finished chunks at the head of the queue meanwhile. ``read``: the
        documents read from the source and the empty ones among them once ``chunk`` is written (its resume point)."""
        self.in_flight.append((self.pool.submit(self._encode, {s: job for s, job in chunk.items() if job[0]}), read))
        while self.in_flight and (len(self.in_flight) > self.depth or self.in_flight[0][0].done()):
            self._write_oldest()

    def _encode(self, jobs: Chunk) -> dict[str, tuple[np.ndarray, int, int]]:
        return {split: (self.encoder.encode(texts, ends), sum(text_bytes(t) for t in texts), sum(ends))
                for split, (texts, ends) in jobs.items()}

    def _write_oldest(self) -> None:
        future, read = self.in_flight.popleft()
        documents = tokens = 0
        for split, (ids, n_bytes, n_documents) in future.result().items():
            self.writers[split].append(ids)
            self.stats[split]["bytes"] += n_bytes
            self.stats[split]["documents"] += n_documents
            documents, tokens = documents + n_documents, tokens + ids.size
        self.progress.update(documents, tokens)
        self.written(read)

    def finish(self) -> None:
        """Write the chunks still in flight and close the progress display."""
        while self.in_flight:
            self._write_oldest()
        self.progress.close()

    def stop(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def save_progress(staging: Path, progress: dict[str, Any]) -> None:
    blob = json.dumps(progress).encode()
    atomic_write(staging / PROGRESS_FILE, lambda f: f.write(blob), what="preparation checkpoint", hint=WRITE_HINT)


def commit(staging: Path, data_dir: Path, meta: dict[str, Any]) -> None:
    """Move the finished shards into ``data_dir`` and write meta.json last: it marks the folder complete.

    The old data stays usable until the new is in place: its files are moved aside (meta.json first), and if
    any move fails (a file that cannot be replaced, a read-only folder) every file goes back where it was."""
    blob = json.dumps(meta, indent=1, ensure_ascii=False).encode()
    atomic_write(staging / "meta.json", lambda f: f.write(blob), what="prepared data", hint=WRITE_HINT)
    new = [*(shard["file"] for split in meta["splits"].values() for shard in split["shards"]), "meta.json"]
    aside = staging / "previous"
    moves: list[tuple[Path, Path]] = []  # done so far, undone in reverse on failure
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        aside.mkdir(exist_ok=True)
        old = [p for p in [data_dir / "meta.json", *sorted(data_dir.glob("*.bin"))] if p.exists()]
        for source, target in [*((p, aside / p.name) for p in old), *((staging / n, data_dir / n) for n in new)]:
            os.replace(source, target)
            moves.append((source, target))
    except OSError as err:
        for source, target in reversed(moves):
            with contextlib.suppress(OSError):
                os.replace(target, source)
        raise UserError(f"could not put the prepared data in {data_dir} ({err.filename}: {err.strerror or err}); "
                        "the data that was there is unchanged", hint=WRITE_HINT) from None

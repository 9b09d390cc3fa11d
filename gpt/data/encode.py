"""From documents to token ids: the train/validation split by whole documents, and batch encoders.

Each encoder turns a chunk of documents into one array of ids of the shard dtype, and is safe to call from
several threads at once (gpt.data.prepare encodes chunks on ``data.num_proc`` threads). The GPT-2 encoder
ends every document with <|endoftext|> (id 50256); tiktoken releases the GIL while it encodes. A trained BPE
ends them with its <|endoftext|> too (if it has one), encoding through the tokenizers library, which releases
the GIL as well. The character encoder joins documents with nothing between them, as this framework always
has (a character vocabulary has no end-of-text symbol), and maps code points through a lookup table.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from itertools import chain

import numpy as np

from gpt.errors import UserError
from gpt.tokenizers import tokenizer as tok


def every_kth(val_fraction: float) -> int:
    """k: every k-th document (k = round(1/val_fraction), at least 2) is held out for validation."""
    return max(2, round(1 / val_fraction))


def route(docs: Iterable[str], val_fraction: float, start: int = 0) -> Iterator[tuple[int, str, str, bool]]:
    """(document index, split, text, ends the document) for every document or piece of one.

    k or more documents: every k-th whole document goes to validation. Fewer (known once the stream ends
    before k): the last val_fraction of the joined text, so one long file still gets a validation split;
    a document cut there yields two pieces. ``start`` resumes the k-or-more case after that many documents.
    """
    k = every_kth(val_fraction)
    docs = iter(docs)
    head: list[str] = []
    if start == 0:
        for text in docs:
            head.append(text)
            if len(head) == k:
                break
        if len(head) < k:
            yield from route_by_position(head, val_fraction)
            return
    for index, text in enumerate(chain(head, docs), start):
        yield index, ("val" if index % k == k - 1 else "train"), text, True


def route_by_position(docs: list[str], val_fraction: float) -> Iterator[tuple[int, str, str, bool]]:
    """Fewer than k documents: the joined text is cut at (1 - val_fraction) of its characters."""
    cut = int(sum(len(t) for t in docs) * (1 - val_fraction))
    seen = 0
    for index, text in enumerate(docs):
        here = cut - seen  # where the cut falls within this document
        seen += len(text)
        if here >= len(text):
            yield index, "train", text, True
        elif here <= 0:
            yield index, "val", text, True
        else:
            yield index, "train", text[:here], False
            yield index, "val", text[here:], True


class CharEncoder:
    """Character ids through a code-point lookup table (a Python loop is 50x slower)."""

    def __init__(self, tokenizer: tok.CharTokenizer, dtype: np.dtype) -> None:
        codes = [ord(c) for c in tokenizer.chars]
        self.table = np.full(max(codes, default=0) + 2, -1, dtype=np.int64)  # the last entry: any larger code
        self.table[codes] = np.arange(tokenizer.vocab_size)
        self.dtype = np.dtype(dtype)

    def encode(self, texts: list[str], ends: list[bool]) -> np.ndarray:
        text = "".join(texts)
        codepoints = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
        ids = self.table[np.minimum(codepoints, len(self.table) - 1)]
        if (ids < 0).any():
            bad = text[int(np.argmax(ids < 0))]
            raise UserError(f"character {bad!r} is not in the character vocabulary")
        return ids.astype(self.dtype)


class GPT2Encoder:
    """GPT-2 BPE of a chunk of documents, <|endoftext|> after each document's end, as one array of ``dtype``.

    Each document goes through tiktoken's ``encode_to_numpy`` (its Rust encoder releases the GIL and hands back
    a uint32 buffer: no Python int per token), which gives encode_ordinary's ids: no special token is parsed.
    Each thread encodes with an encoding of its own, built from the same ranks: only the first thread to use
    an encoding gets its regex's fast path; others share a slower one (measured on 50 MB: two threads sharing
    one encoding 1.3x the speed of one thread, with one each 2.0x)."""

    def __init__(self, tokenizer: tok.GPT2Tokenizer, dtype: np.dtype | type = np.uint32) -> None:
        self.encoding, self.dtype = tokenizer.encoding, np.dtype(dtype)
        self.eot = np.array([tokenizer.eot_token], dtype=np.uint32)
        self.local = threading.local()

    def thread_encoding(self) -> tiktoken.Encoding:  # noqa: F821 (imported here: character runs never need it)
        """This thread's copy of the encoding (built on first use, in about 0.05 s)."""
        encoding = getattr(self.local, "encoding", None)
        if encoding is None:
            import tiktoken

            base = self.encoding
            encoding = self.local.encoding = tiktoken.Encoding(
                name=base.name, pat_str=base._pat_str, mergeable_ranks=base._mergeable_ranks,
                special_tokens=base._special_tokens)
        return encoding

    def encode_one(self, text: str) -> np.ndarray:
        encoding = self.thread_encoding()
        try:
            return encoding.encode_to_numpy(text, disallowed_special=())
        except UnicodeEncodeError:  # a lone surrogate (a JSON escape): encode_ordinary substitutes it
            return np.asarray(encoding.encode_ordinary(text), dtype=np.uint32)

    def encode(self, texts: list[str], ends: list[bool]) -> np.ndarray:
        pieces = []
        for text, end in zip(texts, ends):
            pieces.append(self.encode_one(text))
            if end:
                pieces.append(self.eot)
        if not pieces:
            return np.empty(0, dtype=self.dtype)
        return np.concatenate(pieces, dtype=self.dtype, casting="same_kind")  # one copy, cast on the way


class BPEEncoder:
    """A trained byte-level BPE's ids of a chunk of documents (the tokenizers library encodes the chunk in parallel),
    its <|endoftext|> after each document's end when it has one, as one array of ``dtype``."""

    def __init__(self, tokenizer: tok.BPETokenizer, dtype: np.dtype | type = np.uint16) -> None:
        self.tokenizer, self.dtype, self.eot = tokenizer, np.dtype(dtype), tokenizer.eot_token

    def encode(self, texts: list[str], ends: list[bool]) -> np.ndarray:
        rows = self.tokenizer.encode_batch(texts)
        if self.eot is not None:
            rows = [row + [self.eot] if end else row for row, end in zip(rows, ends)]
        return np.fromiter(chain.from_iterable(rows), dtype=self.dtype, count=sum(len(r) for r in rows))


Encoder = CharEncoder | GPT2Encoder | BPEEncoder


def make_encoder(tokenizer: tok.Tokenizer, dtype: np.dtype) -> Encoder:
    """The encoder for ``tokenizer``, giving ids of ``dtype`` (the shards' dtype)."""
    if isinstance(tokenizer, tok.CharTokenizer):
        return CharEncoder(tokenizer, dtype)
    if isinstance(tokenizer, tok.BPETokenizer):
        return BPEEncoder(tokenizer, dtype)
    return GPT2Encoder(tokenizer, dtype)


def text_bytes(text: str) -> int:
    """UTF-8 size of ``text`` (what bits-per-byte divides by)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))

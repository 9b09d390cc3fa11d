"""Tokenizers: character level (vocabulary stored in meta.json), GPT-2 BPE through tiktoken, and byte-level BPEs
trained here (scripts/train_tokenizer.py) or elsewhere, read from their tokenizer.json by the tokenizers library.

Each has a plain-data description (``to_meta()``; ``from_meta()`` rebuilds it) that prepared data, checkpoints
and exports carry, so a model always travels with its tokenizer; two tokenizers are the same when their
descriptions are equal.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Protocol

from gpt.errors import UserError
from gpt.tokenizers import bpe

GPT2_ENCODING = "r50k_base"  # tiktoken's name for GPT-2's byte-pair encoding (50257 tokens)
GPT2_VOCAB_SIZE = 50257
MAX_TEMPLATE_CHARS = 64 * 1024  # a chat template is a few hundred to a few thousand characters


class Tokenizer(Protocol):
    kind: str
    vocab_size: int
    eot_token: int | None  # ends each document in prepared data (None: documents are joined with nothing)
    special_tokens: dict[str, int]  # tokens that stand for no text, by name (chat work asks for CHAT_TOKENS here)

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def token_bytes(self, token: int) -> bytes: ...

    def to_meta(self) -> dict[str, Any]: ...


class AddedTokens:
    """Special tokens added after a tokenizer's own vocabulary (ChatML's, for fine-tuning a base model into a chat
    model: gpt.data.chat.with_chat_tokens), and the description's optional chat template. Their ids follow the
    base vocabulary in order; they stand for no text: encode() never emits them, decode() writes their names."""

    base_size: int
    added: list[str]
    chat_template: str | None

    def add(self, added: list[str] | tuple[str, ...], chat_template: str | None) -> None:
        self.added, self.chat_template = list(added), chat_template
        self.added_ids = {name: self.base_size + i for i, name in enumerate(self.added)}
        self.vocab_size = self.base_size + len(self.added)

    def added_meta(self) -> dict[str, Any]:
        return (({"added_tokens": list(self.added)} if self.added else {})
                | ({"chat_template": self.chat_template} if self.chat_template is not None else {}))

    def added_text(self, token: int) -> str:
        return self.added[token - self.base_size]


class CharTokenizer(AddedTokens):
    """One token per character of a fixed vocabulary (then any added special tokens)."""

    kind = "char"
    eot_token = None

    def __init__(self, chars: list[str], added: list[str] | tuple[str, ...] = (),
                 chat_template: str | None = None) -> None:
        self.chars = list(chars)
        self.stoi = {ch: i for i, ch in enumerate(self.chars)}
        self.base_size = len(self.chars)
        self.add(added, chat_template)
        self.special_tokens = dict(self.added_ids)

    @classmethod
    def from_text(cls, text: str) -> CharTokenizer:
        return cls(sorted(set(text)))

    def encode(self, text: str) -> list[int]:
        try:
            return [self.stoi[ch] for ch in text]
        except KeyError as err:
            raise UserError(
                f"character {err.args[0]!r} is not in this model's character vocabulary",
                hint="use only characters that occur in the training text",
            ) from None

    def decode(self, ids: list[int]) -> str:
        return "".join(self.chars[i] if i < self.base_size else self.added_text(i) for i in ids)

    def token_bytes(self, token: int) -> bytes:
        text = self.chars[token] if token < self.base_size else self.added_text(token)
        return text.encode("utf-8", "surrogatepass")

    def to_meta(self) -> dict[str, Any]:
        return {"kind": self.kind, "vocab_size": self.vocab_size, "chars": self.chars} | self.added_meta()


class GPT2Tokenizer(AddedTokens):
    """GPT-2's byte-pair encoding (tiktoken r50k_base); end-of-text is token 50256; added tokens from 50257."""

    kind = "gpt2"

    def __init__(self, added: list[str] | tuple[str, ...] = (), chat_template: str | None = None) -> None:
        self.encoding = load_gpt2_encoding()
        self.base_size = self.encoding.n_vocab
        self.add(added, chat_template)
        self.eot_token = self.encoding.eot_token
        self.special_tokens = {bpe.EOT: self.eot_token} | self.added_ids

    def encode(self, text: str) -> list[int]:
        return self.encoding.encode_ordinary(text)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return self.encoding.encode_ordinary_batch(texts)

    def decode(self, ids: list[int]) -> str:
        if not self.added:
            return self.encoding.decode(ids)
        return decode_bytes(self, ids).decode("utf-8", "replace")

    def token_bytes(self, token: int) -> bytes:
        """The raw bytes of one token (a token may hold part of a UTF-8 character); an added token's: its name."""
        if token >= self.base_size:
            return self.added_text(token).encode("utf-8")
        return self.encoding.decode_single_token_bytes(token)

    def byte_token(self, byte: int) -> int:
        return self.encoding.encode_single_token(bytes([byte]))

    def to_meta(self) -> dict[str, Any]:
        return {"kind": self.kind, "vocab_size": self.vocab_size, "encoding": GPT2_ENCODING} | self.added_meta()


class BPETokenizer:
    """A byte-level BPE read from its tokenizer.json (any vocabulary size; special tokens such as <|endoftext|>
    and ChatML's <|im_start|>/<|im_end|> as its file lists them). Text is encoded by the tokenizers library, the
    library transformers' AutoTokenizer uses, so both give the same ids; special-token text in a document is
    encoded as plain text (as tiktoken's encode_ordinary does), so only code can emit a special token."""

    kind = "bpe"

    def __init__(self, json_text: str, where: str = "the tokenizer", chat_template: str | None = None) -> None:
        self.chat_template, self.where = chat_template, where
        parsed = bpe.parse(json_text, where)
        self.json, self.sha256 = json_text, bpe.sha256(json_text)
        self.library, self.pieces = parsed.tokenizer, parsed.pieces
        self.vocab_size, self.special_tokens = parsed.vocab_size, dict(parsed.special_tokens)
        self.eot_token = self.special_tokens.get(bpe.EOT)
        self.byte_ids = {piece[0]: token for token, piece in enumerate(self.pieces)
                         if len(piece) == 1 and token not in self.special_tokens.values()}

    @classmethod
    def from_file(cls, path: str | Path) -> BPETokenizer:
        """The tokenizer in a tokenizer.json, or in a folder holding one (a UserError naming the file if damaged)."""
        text, file = bpe.read_text(path)
        return cls(text, str(file))

    def encode(self, text: str) -> list[int]:
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """The ids of each text (the library encodes them in parallel, without the GIL)."""
        try:
            try:
                encodings = self.library.encode_batch_fast(texts, add_special_tokens=False)
            except TypeError:  # a lone surrogate (a JSON escape) is not text to Rust: one U+FFFD each, as tiktoken does
                encodings = self.library.encode_batch_fast([valid_unicode(t) for t in texts], add_special_tokens=False)
        except BaseException as err:  # the library's panic is a BaseException (pyo3_runtime.PanicException)
            if type(err).__name__ != "PanicException":
                raise
            raise UserError(f"{self.where}: the tokenizers library gave up encoding a text "
                            f"({str(err).splitlines()[0][:200] if str(err) else 'it panicked'})",
                            hint="the tokenizer's Split pre-tokenizer pattern backtracks too much on such text: use a "
                            "tokenizer whose pattern repeats single characters or classes only") from None
        return [e.ids for e in encodings]

    def decode(self, ids: list[int]) -> str:
        return b"".join(self.pieces[i] for i in ids).decode("utf-8", "replace")

    def token_bytes(self, token: int) -> bytes:
        """The bytes of one token (part of a UTF-8 character, possibly); a special token's: its text."""
        return self.pieces[token]

    def byte_token(self, byte: int) -> int:
        return self.byte_ids[byte]

    def to_meta(self) -> dict[str, Any]:
        """The description: the tokenizer.json text itself (checkpoints stay plain data), named by its sha256."""
        return ({"kind": self.kind, "vocab_size": self.vocab_size, "special_tokens": dict(self.special_tokens),
                 "sha256": self.sha256, "json": self.json}
                | ({"chat_template": self.chat_template} if self.chat_template is not None else {}))


def valid_unicode(text: str) -> str:
    """``text`` with each lone surrogate replaced by U+FFFD."""
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def encode_bytes(tokenizer: GPT2Tokenizer | BPETokenizer, data: bytes) -> list[int]:
    """Ids of raw bytes, valid UTF-8 or not: runs of valid UTF-8 encoded as text, every other byte as its own byte
    token, so that ``decode_bytes`` gives ``data`` back exactly (a byte-level BPE has a token for each byte)."""
    ids: list[int] = []
    for i, piece in enumerate(re.split("([\udc80-\udcff]+)", data.decode("utf-8", "surrogateescape"))):
        if i % 2:  # a run of bytes that are not UTF-8, escaped as U+DC80..U+DCFF
            ids.extend(tokenizer.byte_token(ord(ch) - 0xDC00) for ch in piece)
        elif piece:
            ids.extend(tokenizer.encode(piece))
    return ids


def decode_bytes(tokenizer: Tokenizer, ids: list[int]) -> bytes:
    return b"".join(tokenizer.token_bytes(i) for i in ids)


def has_tokens(tokenizer: Tokenizer, *names: str) -> bool:
    """Whether every named special token is in the tokenizer (``has_tokens(t, *bpe.CHAT_TOKENS)``: chat-ready)."""
    return all(name in tokenizer.special_tokens for name in names)


def load_gpt2_encoding():
    """tiktoken's r50k_base, or a UserError saying how to provide it when it cannot be fetched."""
    import tiktoken

    try:
        return tiktoken.get_encoding(GPT2_ENCODING)
    except Exception as err:  # tiktoken raises plain network / IO errors when offline
        raise UserError(
            f"the GPT-2 encoding ({GPT2_ENCODING}) could not be loaded: {type(err).__name__}",
            hint="connect to the internet once, or set TIKTOKEN_CACHE_DIR to a folder that holds tiktoken's "
            f"cached {GPT2_ENCODING} file",
        ) from None


def description_problem(meta: Any) -> str | None:
    """What is wrong with a tokenizer description (meta.json, checkpoint, export), or None if it is complete:
    a known kind, a character vocabulary of distinct single characters whose vocab_size is its length."""
    if not isinstance(meta, dict):
        return "the tokenizer entry is missing or not an object"
    kind, vocab = meta.get("kind"), meta.get("vocab_size")
    problem = added_problem(meta)
    if problem:
        return problem
    vocab = vocab - len(meta.get("added_tokens", [])) if isinstance(vocab, int) else vocab  # the base vocabulary's
    if kind == "char":
        chars = meta.get("chars")
        if not isinstance(chars, list) or not chars or not all(isinstance(c, str) and len(c) == 1 for c in chars):
            return "the char tokenizer's chars must be a non-empty list of single characters"
        if len(set(chars)) != len(chars):
            return "the char tokenizer's chars repeat a character"
        if vocab != len(chars):
            return f"the tokenizer's vocab_size {vocab!r} differs from its {len(chars)} characters (cut or edited)"
    elif kind == "gpt2":
        if vocab != GPT2_VOCAB_SIZE or meta.get("encoding", GPT2_ENCODING) != GPT2_ENCODING:
            return (f"a gpt2 tokenizer has vocab_size {GPT2_VOCAB_SIZE} and encoding {GPT2_ENCODING}, "
                    f"not {vocab!r} and {meta.get('encoding')!r}")
    elif kind == "bpe":
        return bpe_problem(meta)
    else:
        return f"unknown tokenizer kind {kind!r} (char, gpt2 or bpe)"
    return None


def added_problem(meta: dict[str, Any]) -> str | None:
    """What is wrong with a description's added special tokens or chat template (both optional)."""
    added, template = meta.get("added_tokens", []), meta.get("chat_template")
    if not isinstance(added, list) or not all(isinstance(t, str) and 0 < len(t) <= 64 for t in added):
        return "the tokenizer's added_tokens must be a list of token names (1 to 64 characters each)"
    if len(set(added)) != len(added) or len(added) > 64 or (added and meta.get("kind") == "bpe"):
        return "the tokenizer's added_tokens repeat a name, are more than 64, or are given for a bpe tokenizer"
    if template is not None and (not isinstance(template, str) or len(template) > MAX_TEMPLATE_CHARS):
        return f"the tokenizer's chat_template must be text of at most {MAX_TEMPLATE_CHARS:,} characters"
    return None


def bpe_problem(meta: dict[str, Any]) -> str | None:
    """What is wrong with a bpe description: its tokenizer.json text, or a size, special tokens or sha256 that are
    not that text's (edited)."""
    text = meta.get("json")
    problem = bpe.problem(text)
    if problem:
        return f"the bpe tokenizer's tokenizer.json: {problem}"
    if meta.get("sha256") != bpe.sha256(text):
        return "the bpe tokenizer's sha256 is not that of its tokenizer.json (edited or cut)"
    parsed = bpe.check(text)
    if meta.get("vocab_size") != parsed.vocab_size or meta.get("special_tokens") != parsed.special_tokens:
        return (f"the bpe tokenizer's vocab_size {meta.get('vocab_size')!r} or special_tokens differ from its "
                f"tokenizer.json's ({parsed.vocab_size} tokens)")
    return None


def describe(meta: Any) -> str:
    """A short name for a tokenizer description, for messages: ``char, 97 tokens`` or ``bpe, 4096 tokens, 1a2b3c4d``."""
    if not isinstance(meta, dict):
        return "none recorded"
    sha = f", sha256 {str(meta.get('sha256'))[:8]}" if meta.get("kind") == "bpe" else ""
    return f"{meta.get('kind')}, {meta.get('vocab_size')} tokens{sha}"


def from_meta(meta: dict[str, Any]) -> Tokenizer:
    """Rebuild the tokenizer described by a meta.json / checkpoint entry (a UserError if it is incomplete)."""
    problem = description_problem(meta)
    if problem:
        raise UserError(problem, hint="the file that holds it is damaged or was not written by this framework")
    kind, added, template = meta.get("kind"), meta.get("added_tokens", []), meta.get("chat_template")
    if kind == "char":
        return CharTokenizer(meta["chars"], added, template)
    if kind == "gpt2":
        return GPT2Tokenizer(added, template)
    return BPETokenizer(meta["json"], chat_template=template)


def build(kind: str, text: str | None = None) -> Tokenizer:
    """A fresh tokenizer: ``char`` (its vocabulary from ``text``), ``gpt2``, or the path of a tokenizer.json
    (or of a folder holding one)."""
    if kind == "char":
        return CharTokenizer.from_text(text or "")
    if kind == "gpt2":
        return GPT2Tokenizer()
    return BPETokenizer.from_file(kind)

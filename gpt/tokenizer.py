"""Tokenizers: character level (vocabulary stored in meta.json) and GPT-2 BPE through tiktoken."""

from __future__ import annotations

from typing import Any, Protocol

from gpt.errors import UserError

GPT2_ENCODING = "r50k_base"  # tiktoken's name for GPT-2's byte-pair encoding (50257 tokens)
GPT2_VOCAB_SIZE = 50257


class Tokenizer(Protocol):
    kind: str
    vocab_size: int
    eot_token: int | None

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def token_bytes(self, token: int) -> bytes: ...

    def to_meta(self) -> dict[str, Any]: ...


class CharTokenizer:
    """One token per character of a fixed vocabulary."""

    kind = "char"
    eot_token = None

    def __init__(self, chars: list[str]) -> None:
        self.chars = list(chars)
        self.stoi = {ch: i for i, ch in enumerate(self.chars)}
        self.vocab_size = len(self.chars)

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
        return "".join(self.chars[i] for i in ids)

    def token_bytes(self, token: int) -> bytes:
        return self.chars[token].encode("utf-8", "surrogatepass")

    def to_meta(self) -> dict[str, Any]:
        return {"kind": self.kind, "vocab_size": self.vocab_size, "chars": self.chars}


class GPT2Tokenizer:
    """GPT-2's byte-pair encoding (tiktoken r50k_base); end-of-text is token 50256."""

    kind = "gpt2"

    def __init__(self) -> None:
        self.encoding = load_gpt2_encoding()
        self.vocab_size = self.encoding.n_vocab
        self.eot_token = self.encoding.eot_token

    def encode(self, text: str) -> list[int]:
        return self.encoding.encode_ordinary(text)

    def decode(self, ids: list[int]) -> str:
        return self.encoding.decode(ids)

    def token_bytes(self, token: int) -> bytes:
        """The raw bytes of one token (a token may hold part of a UTF-8 character)."""
        return self.encoding.decode_single_token_bytes(token)

    def to_meta(self) -> dict[str, Any]:
        return {"kind": self.kind, "vocab_size": self.vocab_size, "encoding": GPT2_ENCODING}


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
    else:
        return f"unknown tokenizer kind {kind!r} (char or gpt2)"
    return None


def from_meta(meta: dict[str, Any]) -> Tokenizer:
    """Rebuild the tokenizer described by a meta.json / checkpoint entry (a UserError if it is incomplete)."""
    problem = description_problem(meta)
    if problem:
        raise UserError(problem, hint="the file that holds it is damaged or was not written by this framework")
    kind = meta.get("kind")
    if kind == "char":
        return CharTokenizer(meta["chars"])
    if kind == "gpt2":
        return GPT2Tokenizer()
    raise UserError(f"unknown tokenizer kind {kind!r} (expected 'char' or 'gpt2')")


def build(kind: str, text: str | None = None) -> Tokenizer:
    """A fresh tokenizer of ``kind``; a char tokenizer takes its vocabulary from ``text``."""
    if kind == "char":
        return CharTokenizer.from_text(text or "")
    if kind == "gpt2":
        return GPT2Tokenizer()
    raise UserError(f"unknown tokenizer {kind!r}", hint="use data.tokenizer=char or data.tokenizer=gpt2")

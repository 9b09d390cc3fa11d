"""Byte-level BPE in the Hugging Face ``tokenizer.json`` format: reading and checking one, and the bytes behind
each of its tokens.

A tokenizer.json is untrusted input (it arrives in prepared data, checkpoints and exports): it is parsed as JSON,
checked to be a byte-level BPE this project can encode and decode exactly (no normaliser, every byte a token,
ids 0..N-1 without gaps, only special added tokens), and only then handed to the ``tokenizers`` library, whose
errors become one line. GPT-2's byte alphabet spells every token of such a vocabulary as printable characters.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from gpt.errors import UserError
from gpt.tokenizers import split_pattern

EOT = "<|endoftext|>"  # ends every document in prepared data (as GPT-2's id 50256 does)
CHAT_TOKENS = ("<|im_start|>", "<|im_end|>")  # ChatML: <|im_start|>role\n...<|im_end|>
PAD = "<|pad|>"
DEFAULT_SPECIAL_TOKENS = (EOT, *CHAT_TOKENS, PAD)
MAX_FILE_BYTES = 256 << 20  # a tokenizer.json larger than this is refused before it is read
FILE_NAME = "tokenizer.json"
HINT = "use a tokenizer.json written by scripts/train_tokenizer.py (or another byte-level BPE)"


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table: byte-level vocabularies spell each token's bytes with it."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in table:
            table[b], extra = chr(256 + extra), extra + 1
    return table


BYTE_OF = {ch: b for b, ch in bytes_to_unicode().items()}


@dataclass(frozen=True)
class Parsed:
    """A checked byte-level BPE: the library's tokenizer (special-token text encoded as plain text), the bytes
    behind each id (a special token's: its text), and the special tokens by name."""

    tokenizer: Any  # tokenizers.Tokenizer
    pieces: tuple[bytes, ...]
    special_tokens: dict[str, int]

    @property
    def vocab_size(self) -> int:
        return len(self.pieces)


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def read_text(path: str | Path) -> tuple[str, Path]:
    """The text of a tokenizer.json, given the file or a folder holding one, and the file's path."""
    path = Path(path).expanduser()
    file = path / FILE_NAME if path.is_dir() else path
    if not file.is_file():
        where = f"{path} holds no {FILE_NAME}" if path.is_dir() else f"{path} does not exist"
        raise UserError(f"{where}", hint="train one with scripts/train_tokenizer.py, or give the path of a "
                        f"{FILE_NAME} (or of a folder holding one)")
    if file.stat().st_size > MAX_FILE_BYTES:
        raise UserError(f"{file} holds {file.stat().st_size:,} bytes, more than a tokenizer.json may "
                        f"({MAX_FILE_BYTES:,})", hint=HINT)
    try:
        return file.read_text(encoding="utf-8"), file
    except (OSError, UnicodeDecodeError) as err:
        raise UserError(f"{file} is unreadable ({err})", hint=HINT) from None


def parse(text: str, where: str) -> Parsed:
    """The checked tokenizer of a tokenizer.json's text; a UserError naming ``where`` and the problem otherwise."""
    try:
        return check(text)
    except ValueError as err:
        raise UserError(f"{where}: {err}", hint=HINT) from None


def problem(text: Any) -> str | None:
    """What is wrong with a tokenizer.json's text, or None if it is a byte-level BPE this project can use."""
    if not isinstance(text, str):
        return "the tokenizer's json must be the text of a tokenizer.json"
    try:
        check(text)
    except ValueError as err:
        return str(err)
    return None


@lru_cache(maxsize=8)
def check(text: str) -> Parsed:
    """parse() raising a ValueError without the file name; cached (data, checkpoints and exports hold one text)."""
    try:
        spec = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as err:
        raise ValueError(f"not valid JSON ({err})") from None
    if not isinstance(spec, dict):
        raise ValueError(f"a tokenizer.json holds a JSON object, not a {type(spec).__name__}")
    check_pipeline(spec)
    pieces, special = vocabulary(spec)
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_str(text)
    except Exception as err:  # the library raises plain Exception with serde's message
        raise ValueError(f"the tokenizers library cannot read it ({str(err).splitlines()[0][:200]})") from None
    if tokenizer.get_vocab_size(with_added_tokens=True) != len(pieces):
        raise ValueError(f"the tokenizers library counts {tokenizer.get_vocab_size(with_added_tokens=True)} tokens, "
                         f"its vocabulary lists {len(pieces)}")
    tokenizer.encode_special_tokens = True  # "<|endoftext|>" in a document is text, as tiktoken's encode_ordinary
    return Parsed(tokenizer, tuple(pieces), special)


def check_pipeline(spec: dict[str, Any]) -> None:
    """A BPE model between a byte-level pre-tokenizer and decoder, with nothing that changes the text or the ids:
    no normaliser, no dropout, no prefix space, no subword prefix or suffix."""
    model = spec.get("model")
    if not isinstance(model, dict) or model.get("type") != "BPE":
        kind = model.get("type") if isinstance(model, dict) else None
        raise ValueError(f"its model is {kind!r}, not a BPE")
    if spec.get("normalizer") is not None:
        raise ValueError("it has a normalizer, which changes text before encoding (decoding would not give it back)")
    if model.get("dropout") not in (None, 0, 0.0):
        raise ValueError("its BPE has dropout, which makes encoding random")
    if model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        raise ValueError("its BPE has a subword prefix or suffix; a byte-level BPE has neither")
    pre = spec.get("pre_tokenizer")
    steps = pre.get("pretokenizers") if isinstance(pre, dict) and pre.get("type") == "Sequence" else [pre]
    if not isinstance(steps, list) or not steps or not all(isinstance(s, dict) for s in steps):
        raise ValueError("its pre_tokenizer is not a ByteLevel pre-tokenizer")
    if steps[-1].get("type") != "ByteLevel" or any(s.get("type") != "Split" for s in steps[:-1]):
        raise ValueError("its pre_tokenizer is not ByteLevel (optionally after Split steps)")
    for step in steps[:-1]:
        check_split(step)
    if steps[-1].get("add_prefix_space"):
        raise ValueError("its ByteLevel pre-tokenizer adds a prefix space (decoding would not give the text back)")
    decoder = spec.get("decoder")
    if not isinstance(decoder, dict) or decoder.get("type") != "ByteLevel":
        raise ValueError("its decoder is not ByteLevel")


def check_split(step: dict[str, Any]) -> None:
    """A Split step's pattern: a literal string, or a regular expression that cannot backtrack catastrophically
    (gpt.tokenizers.split_pattern: the library would panic on ordinary text)."""
    pattern = step.get("pattern")
    if not isinstance(pattern, dict) or len(pattern) != 1 or not isinstance(next(iter(pattern.values())), str):
        raise ValueError("its Split pre-tokenizer's pattern must be {\"String\": ...} or {\"Regex\": ...}")
    kind, text = next(iter(pattern.items()))
    if kind == "Regex":
        found = split_pattern.problem(text)
        if found is not None:
            raise ValueError(f"its Split pre-tokenizer's regular expression is refused: {found}")
    elif kind != "String":
        raise ValueError(f"its Split pre-tokenizer's pattern is {kind!r}, not String or Regex")


def vocabulary(spec: dict[str, Any]) -> tuple[list[bytes], dict[str, int]]:
    """The bytes behind ids 0..N-1 and the special tokens by name; a ValueError when the ids have gaps or repeats,
    a token is not spelt in the byte alphabet, a byte has no token, or an added token is not special."""
    vocab, added = spec["model"].get("vocab"), spec.get("added_tokens") or []
    if not isinstance(vocab, dict) or not isinstance(added, list):
        raise ValueError("its model.vocab must be an object and its added_tokens a list")
    by_id: dict[int, str] = {}
    special: dict[str, int] = {}
    for entry in added:
        if not isinstance(entry, dict) or not isinstance(entry.get("content"), str) or not is_id(entry.get("id")):
            raise ValueError("each of its added_tokens must be an object with a content string and an id")
        if entry.get("special") is not True:
            raise ValueError(f"its added token {entry['content']!r} is not special (text would be matched to it)")
        if by_id.setdefault(entry["id"], entry["content"]) != entry["content"] or entry["content"] in special:
            raise ValueError(f"its added_tokens repeat the id {entry['id']} or the token {entry['content']!r}")
        special[entry["content"]] = entry["id"]
    for piece, token in vocab.items():
        if not is_id(token) or by_id.setdefault(token, piece) != piece:
            raise ValueError(f"its vocabulary gives id {token!r} to more than one token, or an id that is not one")
    if sorted(by_id) != list(range(len(by_id))):
        raise ValueError(f"its token ids are not 0..{len(by_id) - 1} without gaps")
    pieces = []
    for token in range(len(by_id)):
        piece = by_id[token]
        if piece in special:
            pieces.append(piece.encode("utf-8"))
        elif piece and all(ch in BYTE_OF for ch in piece):
            pieces.append(bytes(BYTE_OF[ch] for ch in piece))
        else:
            raise ValueError(f"its token {token} ({piece[:40]!r}) is not spelt in the byte-level alphabet")
    missing = sorted(set(range(256)) - {p[0] for t, p in enumerate(pieces) if len(p) == 1 and by_id[t] not in special})
    if missing:
        raise ValueError(f"byte {missing[0]:#04x} has no token of its own (text holding it could not be encoded)")
    return pieces, special


def is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 32

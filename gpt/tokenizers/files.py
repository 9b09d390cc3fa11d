"""Every tokenizer as Hugging Face files, through one code path and one library: ``tokenizer.json`` (built with
``tokenizers``), ``tokenizer_config.json`` and ``special_tokens_map.json``, for the character vocabulary, GPT-2's
BPE and trained byte-level BPEs alike, so that ``AutoTokenizer.from_pretrained(folder)`` gives this project's ids.

A trained BPE's tokenizer.json is the library's own text, kept byte for byte in its description (its sha256 names
it); an export's config.json refers to it by that sha256 instead of holding it twice (``reference``/``attach``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpt.errors import UserError
from gpt.tokenizers import bpe
from gpt.tokenizers.tokenizer import GPT2_VOCAB_SIZE, load_gpt2_encoding


def library_tokenizer(meta: dict[str, Any]):
    """The ``tokenizers.Tokenizer`` of a complete tokenizer description (char, gpt2 or bpe)."""
    from tokenizers import Tokenizer

    if meta["kind"] == "bpe":
        return Tokenizer.from_str(meta["json"])
    tokenizer = char_tokenizer(meta["chars"]) if meta["kind"] == "char" else gpt2_tokenizer()
    if meta.get("added_tokens"):  # ChatML's, added for fine-tuning: the next ids, in order
        from tokenizers import AddedToken

        tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in meta["added_tokens"]])
    return tokenizer


def char_tokenizer(chars: list[str]):
    """One id per character of the vocabulary: text split into characters, joined back on decoding; a character
    outside the vocabulary is an error (it has no <unk> id)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel({ch: i for i, ch in enumerate(chars)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    return tokenizer


def gpt2_tokenizer():
    """GPT-2's BPE rebuilt offline from tiktoken's r50k_base: the vocabulary is each token's bytes in the byte
    alphabet, and each merge the pair BPE joins to make a token (``merge_pair``); <|endoftext|> is special."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    encoding = load_gpt2_encoding()
    ranks: dict[bytes, int] = encoding._mergeable_ranks  # token bytes -> id, in merge order: GPT-2's encoder.json
    table = bpe.bytes_to_unicode()
    spell = lambda token: "".join(table[b] for b in token)  # noqa: E731
    vocab = {spell(token): rank for token, rank in ranks.items()}
    merges = [tuple(map(spell, merge_pair(token, rank, ranks)))
              for token, rank in sorted(ranks.items(), key=lambda item: item[1]) if len(token) > 1]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(bpe.EOT, special=True, normalized=False)])  # id 50256
    return tokenizer


def merge_pair(token: bytes, rank: int, ranks: dict[bytes, int]) -> tuple[bytes, bytes]:
    """The two parts BPE joins to make ``token``: run BPE on its bytes with the merges ranked before it."""
    parts = [bytes([b]) for b in token]
    while len(parts) > 2:
        found = [(ranks[a + b], i) for i, (a, b) in enumerate(zip(parts, parts[1:])) if ranks.get(a + b, rank) < rank]
        _, i = min(found)
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
    return parts[0], parts[1]


def tokenizer_json(meta: dict[str, Any]) -> str:
    """tokenizer.json's text: a trained BPE's own (byte for byte), the others' built by the library."""
    return meta["json"] if meta["kind"] == "bpe" else library_tokenizer(meta).to_str()


def special_tokens(meta: dict[str, Any]) -> dict[str, int]:
    """The special tokens of a description by name: none for characters, <|endoftext|> for GPT-2, then any added
    after the vocabulary (ChatML's)."""
    added = meta.get("added_tokens") or []
    base = meta["vocab_size"] - len(added)
    found = {bpe.EOT: GPT2_VOCAB_SIZE - 1} if meta["kind"] == "gpt2" else dict(meta.get("special_tokens") or {})
    return found | {name: base + i for i, name in enumerate(added)}


def eot_id(meta: dict[str, Any]) -> int | None:
    """The id of <|endoftext|> (transformers' bos/eos), or None when the tokenizer has none."""
    return special_tokens(meta).get(bpe.EOT)


def tokenizer_files(meta: dict[str, Any], block_size: int | None = None) -> dict[str, str]:
    """The files that make ``AutoTokenizer.from_pretrained(folder)`` rebuild this tokenizer: tokenizer.json and its
    configuration (end-of-text as bos/eos, <|pad|> as padding where the tokenizer has them)."""
    special = special_tokens(meta)
    roles = {}
    if bpe.EOT in special:
        roles = {"bos_token": bpe.EOT, "eos_token": bpe.EOT}
    if bpe.PAD in special:
        roles["pad_token"] = bpe.PAD
    if meta["kind"] == "gpt2":
        roles["unk_token"] = bpe.EOT  # as OpenAI's files have it
    cls = "GPT2Tokenizer" if meta["kind"] == "gpt2" else "PreTrainedTokenizerFast"
    config: dict[str, Any] = {"tokenizer_class": cls, "clean_up_tokenization_spaces": False, **roles}
    if meta["kind"] != "char":
        config["add_prefix_space"] = False  # byte-level: "def" is not " def"
    if block_size is not None:
        config["model_max_length"] = block_size
    if meta.get("chat_template") is not None:  # transformers' apply_chat_template formats as training did
        config["chat_template"] = meta["chat_template"]
    files = {"tokenizer.json": tokenizer_json(meta), "tokenizer_config.json": json.dumps(config, indent=1)}
    if roles:
        files["special_tokens_map.json"] = json.dumps(roles, indent=1)
    return files


def reference(meta: dict[str, Any]) -> dict[str, Any]:
    """The description as an export's config.json holds it: a BPE's tokenizer.json text left to that file."""
    return {k: v for k, v in meta.items() if k != "json"} if meta.get("kind") == "bpe" else meta


def attach(meta: Any, folder: Path) -> Any:
    """A description read from an export's config.json, made complete again: a BPE's tokenizer.json text read from
    ``folder`` and checked to be the one its sha256 names."""
    if not isinstance(meta, dict) or meta.get("kind") != "bpe" or "json" in meta:
        return meta
    text, file = bpe.read_text(folder / bpe.FILE_NAME)
    if bpe.sha256(text) != meta.get("sha256"):
        raise UserError(f"{file} is not the tokenizer this model was exported with (its sha256 differs from the one "
                        "config.json records)", hint="copy the export's own tokenizer.json back, or export it again")
    return {**meta, "json": text}

"""Conversation data for chat fine-tuning: JSONL files in the layouts people have (``messages`` with role and
content, ShareGPT's ``conversations`` with from and value, Alpaca's instruction / input / output) and Hugging Face
datasets (a ``save_to_disk`` folder or a hub name), each record turned into one list of {role, content} messages.

A record that is not a conversation is one UserError naming the file and the line, or, when the user asks
(``chat.skip_bad=true``), skipped and counted. Files are untrusted: JSON is read by gpt.validate's limits.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gpt.data.formats import JSONL_SUFFIXES
from gpt.errors import UserError
from gpt.tokenizers.bpe import CHAT_TOKENS, EOT
from gpt.validate import is_text, parse_json

ROLES = ("system", "user", "assistant")
SHAREGPT_ROLES = {"system": "system", "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "chatgpt": "assistant", "bing": "assistant", "bard": "assistant"}
FORMATS = ("auto", "messages", "sharegpt", "alpaca")
MAX_LINE_BYTES = 16 << 20  # one conversation
HINT = ('each record needs "messages": [{"role": "user"|"assistant"|"system", "content": "..."}], ShareGPT\'s '
        '"conversations": [{"from", "value"}], or Alpaca\'s "instruction", "output" (and "input"); '
        "chat.skip_bad=true skips bad records and counts them")


class BadRecord(ValueError):
    """One record is not a conversation (the message says why); the caller adds where it is."""


Messages = list[dict[str, str]]


def record_format(record: Any, fmt: str) -> str:
    """The layout of one record: ``fmt``, or for auto the one its keys name."""
    if fmt != "auto":
        return fmt
    if isinstance(record, dict):
        for key, name in (("messages", "messages"), ("conversations", "sharegpt"), ("instruction", "alpaca")):
            if key in record:
                return name
    raise BadRecord('no "messages", "conversations" or "instruction" field')


def to_messages(record: Any, fmt: str = "auto") -> Messages:
    """One record as checked messages: known roles, text contents, an assistant turn to learn from, and no text
    of a special token (it would forge a turn)."""
    fmt = record_format(record, fmt)
    if not isinstance(record, dict):
        raise BadRecord(f"a {type(record).__name__}, not a JSON object")
    if fmt == "alpaca":
        messages = alpaca_messages(record)
    else:
        key, role_key, text_key = ("messages", "role", "content") if fmt == "messages" else \
            ("conversations", "from", "value")
        turns = record.get(key)
        if not isinstance(turns, list) or not turns:
            raise BadRecord(f'"{key}" is not a non-empty list')
        messages = [message(turn, i, role_key, text_key, fmt) for i, turn in enumerate(turns)]
    if not any(m["role"] == "assistant" for m in messages):
        raise BadRecord("no assistant message (nothing to learn)")
    for i, m in enumerate(messages):
        forged = [t for t in (EOT, *CHAT_TOKENS) if t in m["content"]]
        if forged:
            raise BadRecord(f"message {i} holds the text of the special token {forged[0]}")
    return messages


def message(turn: Any, i: int, role_key: str, text_key: str, fmt: str) -> dict[str, str]:
    if not isinstance(turn, dict):
        raise BadRecord(f"message {i} is not an object")
    role, content = turn.get(role_key), turn.get(text_key)
    role = SHAREGPT_ROLES.get(role) if fmt == "sharegpt" and isinstance(role, str) else role
    if role not in ROLES:
        raise BadRecord(f"message {i} has {role_key} {turn.get(role_key)!r} (one of {', '.join(ROLES)})")
    if not is_text(content):
        raise BadRecord(f"message {i}'s {text_key} is not text")
    return {"role": role, "content": content}


def alpaca_messages(record: dict[str, Any]) -> Messages:
    """Alpaca's instruction (with its input below it, when there is one) as the user's turn, output as the reply."""
    fields = {k: record.get(k, "") for k in ("instruction", "input", "output", "system")}
    for key, value in fields.items():
        if not is_text(value):
            raise BadRecord(f'"{key}" is not text')
    if not fields["instruction"] or not fields["output"]:
        raise BadRecord('"instruction" and "output" must not be empty')
    user = fields["instruction"] + (f"\n\n{fields['input']}" if fields["input"] else "")
    system = [{"role": "system", "content": fields["system"]}] if fields["system"] else []
    return [*system, {"role": "user", "content": user}, {"role": "assistant", "content": fields["output"]}]


class Skipped:
    """Bad records met so far: skipped and counted (skip_bad) or one UserError at the first."""

    def __init__(self, skip_bad: bool) -> None:
        self.skip_bad, self.count, self.first = skip_bad, 0, ""

    def bad(self, where: str, why: str) -> None:
        if not self.skip_bad:
            raise UserError(f"{where}: {why}", hint=HINT)
        self.count += 1
        self.first = self.first or f"{where}: {why}"


def jsonl_conversations(path: Path, fmt: str, skipped: Skipped) -> Iterator[Messages]:
    """The conversations of a JSON-lines file, one per non-blank line."""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                if len(raw) > MAX_LINE_BYTES:
                    raise BadRecord(f"a line of {len(raw):,} bytes (at most {MAX_LINE_BYTES:,})")
                yield to_messages(parse_json(raw, where, strict=False), fmt)
            except BadRecord as err:
                skipped.bad(where, str(err))
            except UserError as err:  # not JSON, not UTF-8, nested too deeply: parse_json names the line
                skipped.bad(where, str(err).removeprefix(f"{where}: "))


def dataset_conversations(name: str, split: str, fmt: str, skipped: Skipped) -> Iterator[Messages]:
    """The conversations of a Hugging Face dataset: a save_to_disk folder, or a hub name (needs the network)."""
    from gpt.data import hf

    if Path(name).is_dir():
        rows = hf.open_local(Path(name), split)
    else:
        from gpt.data.formats import import_datasets

        try:
            rows = import_datasets().load_dataset(name, split=split)
        except Exception as err:  # offline, unknown name, gated: datasets raises many unrelated types
            raise UserError(f"could not load {name} from the Hugging Face hub ({type(err).__name__})",
                            hint="it needs the network; offline, save_to_disk a copy and pass its folder") from None
    for i, row in enumerate(rows):
        try:
            yield to_messages(row, fmt)
        except BadRecord as err:
            skipped.bad(f"{name} row {i}", str(err))


def read_conversations(source: str, fmt: str = "auto", skip_bad: bool = False,
                       split: str = "train") -> tuple[list[Messages], Skipped]:
    """Every conversation of a JSONL file or a dataset (folder or hub name), and the bad records skipped."""
    if fmt not in FORMATS:
        raise UserError(f"unknown conversation format {fmt!r}", hint=f"use one of: {', '.join(FORMATS)}")
    skipped = Skipped(skip_bad)
    path = Path(source)
    if path.is_file():
        conversations = list(jsonl_conversations(path, fmt, skipped))
    elif path.is_dir() or ("/" in source and not source.startswith((".", "/", "~")) and path.suffix.lower()
                           not in JSONL_SUFFIXES):  # a hub name: owner/name
        conversations = list(dataset_conversations(source, split, fmt, skipped))
    else:
        raise UserError(f"{source} is not a file or a dataset folder",
                        hint="give chat.data=<a .jsonl file, a save_to_disk folder or a hub dataset name>")
    if not conversations:
        raise UserError(f"{source} holds no usable conversation" + (f" ({skipped.count} bad records skipped; the "
                        f"first: {skipped.first})" if skipped.count else ""), hint=HINT)
    return conversations, skipped

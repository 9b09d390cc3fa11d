"""Readers that stream the documents of one file: text (the file is one document), JSONL (one per line),
parquet (one per row).

Each yields the documents' text in file order; an empty or null text is yielded as "" (the caller skips and
counts it). A malformed line or a missing field is a UserError naming the file and the line.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

from gpt.errors import UserError
from gpt.validate import is_text, parse_json, replace_surrogates

JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
PARQUET_SUFFIXES = (".parquet",)
EXTRA_HINT = 'install the optional extra: pip install -e ".[data]"'


def file_format(path: Path, fmt: str) -> str:
    """The format to read ``path`` with: ``fmt`` itself, or for auto the one its extension names (else text)."""
    if fmt != "auto":
        return fmt
    suffix = path.suffix.lower()
    if suffix in JSONL_SUFFIXES:
        return "jsonl"
    if suffix in PARQUET_SUFFIXES:
        return "parquet"
    return "text"


def read_documents(path: Path, fmt: str, text_field: str) -> Iterator[str]:
    """The documents of one file in format ``fmt`` (text, jsonl or parquet)."""
    if fmt == "jsonl":
        return jsonl_documents(path, text_field)
    if fmt == "parquet":
        return parquet_documents(path, text_field)
    return iter((read_text(path),))


def looks_binary(path: Path) -> bool:
    """Whether a file is binary rather than text: a NUL byte in its first 8 KiB (as git and grep decide)."""
    try:
        with open(path, "rb") as f:
            return b"\0" in f.read(8192)
    except OSError as err:
        raise UserError(f"{path} cannot be read: {err.strerror or err}") from None


def read_text(path: Path) -> str:
    """UTF-8 text of a file; invalid bytes become U+FFFD with a warning."""
    try:
        data = path.read_bytes()
    except OSError as err:
        raise UserError(f"{path} cannot be read: {err.strerror or err}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        warnings.warn(f"{path}: bytes that are not UTF-8 were replaced by U+FFFD", stacklevel=2)
        return data.decode("utf-8", errors="replace")


def jsonl_documents(path: Path, text_field: str) -> Iterator[str]:
    """The ``text_field`` of every JSON object of a JSON-lines file; blank lines are ignored. Bytes that are not
    UTF-8, and escapes of lone surrogates (\\ud800: no character), become U+FFFD, with one warning per file."""
    replaced = 0
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError:
                line, replaced = raw.decode("utf-8", errors="replace"), replaced + 1
            record = parse_json(line, f"{path}:{lineno}", "fix or remove that line (one JSON object per line)",
                                strict=False)
            text, surrogates = replace_surrogates(field_text(record, text_field, f"{path}:{lineno}"))
            replaced += surrogates
            yield text
    if replaced:
        warnings.warn(f"{path}: {replaced} line(s) with bytes that are not UTF-8 or escapes of lone surrogates; "
                      "they were replaced by U+FFFD", stacklevel=2)


def field_text(record: object, text_field: str, where: str) -> str:
    """The text under ``text_field`` of one JSON record ("" for null), or a UserError naming ``where``."""
    if not isinstance(record, dict) or text_field not in record:
        raise UserError(f"{where}: no {text_field!r} field in this record",
                        hint="set data.text_field=<the field that holds the text>")
    value = record[text_field]
    if value is None:
        return ""
    if not is_text(value):
        kind = f"a {len(value.lstrip('-')):,}-digit integer" if isinstance(value, str) else type(value).__name__
        raise UserError(f"{where}: the {text_field!r} field is {kind}, not text",
                        hint="set data.text_field=<a field that holds text>")
    return value


def parquet_documents(path: Path, text_field: str) -> Iterator[str]:
    """The ``text_field`` column of every row of a parquet file, read a batch of rows at a time."""
    pa, pq = import_pyarrow()
    try:
        parquet = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as err:
        raise UserError(f"{path}: not a readable parquet file ({str(err).splitlines()[0]})") from None
    schema = parquet.schema_arrow
    if text_field not in schema.names:
        raise UserError(f"{path}: no column {text_field!r} (it has {', '.join(schema.names) or 'none'})",
                        hint="set data.text_field=<the column that holds the text>")
    kind = schema.field(text_field).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise UserError(f"{path}: column {text_field!r} holds {kind}, not text",
                        hint="set data.text_field=<a column of strings>")
    batches = parquet.iter_batches(batch_size=1024, columns=[text_field])
    while True:
        try:  # a damaged page or column chunk is found only when its batch is read
            values = next(batches).column(0).to_pylist()
        except StopIteration:
            return
        except (pa.ArrowException, OSError, UnicodeDecodeError) as err:
            raise UserError(f"{path}: damaged parquet data ({(str(err).splitlines() or [type(err).__name__])[0]})",
                            hint="the file is truncated or corrupt: copy or write it again") from None
        for value in values:
            yield value or ""


def import_pyarrow():
    """pyarrow and pyarrow.parquet, or a UserError naming the optional extra that provides them."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise UserError("reading parquet files needs pyarrow, which is not installed", hint=EXTRA_HINT) from None
    return pa, pq


def import_datasets():
    """The Hugging Face ``datasets`` module, or a UserError naming the optional extra."""
    try:
        import datasets
    except ImportError:
        raise UserError("data.source=hf needs the Hugging Face datasets library, which is not installed",
                        hint=EXTRA_HINT) from None
    return datasets

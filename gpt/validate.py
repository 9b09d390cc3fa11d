"""The one way this project reads JSON and YAML it did not just write: parsing with limits, then typed fields.

Every such file is untrusted (docs/security.md). :func:`read_json` and :func:`parse_json` parse with limits on
size, nesting depth, integer digits and float range, and refuse text that is not UTF-8, so a hostile or damaged
file gets one UserError naming it instead of a RecursionError, a ValueError or a hang. :class:`Record` then reads
an object's fields with their types and ranges checked (no null where a number belongs, no 1.7 where an integer
belongs, no string where a list belongs), each refusal naming the file and the field.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from pathlib import Path
from typing import Any, Union

import yaml

from gpt.errors import UserError

MAX_BYTES = 64 << 20  # a JSON file this project reads (config.json, meta.json, an index map) is kilobytes
MAX_DEPTH = 32  # nesting of arrays and objects: the deepest file this project writes nests 5 levels
MAX_INT_DIGITS = 20  # every integer of a record fits in 64 bits (int64 or uint64)
INT64 = (-(2**63), 2**63 - 1)
REQUIRED: Any = object()  # a field without a default
_NUMBER = (int, float)


def read_json(path: str | Path, hint: str | None = None, max_bytes: int = MAX_BYTES, strict: bool = True) -> Any:
    """The parsed JSON value of the file ``path``, read with every limit; a UserError naming the file otherwise.
    ``strict=False``: as parse_json's (NaN reads as NaN: a loss or a result's figure may be)."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise UserError(f"{path} holds {size:,} bytes, more than the {max_bytes:,} such a file may have",
                            hint=hint or "it is not the file this project expects")
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as err:
        raise UserError(f"{path} cannot be read: {err.strerror or err}", hint=hint) from None
    return parse_json(data, str(path), hint, strict=strict)


def parse_json(data: bytes | str, where: str, hint: str | None = None, strict: bool = True) -> Any:
    """The JSON value of ``data`` (a file's or a line's contents; ``where`` names it in errors), with every limit.

    ``strict=False`` (a data record, of which one field is read) keeps what strict parsing refuses in the fields
    nobody reads: an integer of more than 20 digits stays its digits as a :class:`Digits` (never converted: no
    quadratic cost; not text either, see :func:`is_text`), NaN and
    a float beyond range parse as floats. Nesting deeper than the parser's recursion is refused either way."""
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8-sig")  # a byte-order mark some editors write is not an error
        except UnicodeDecodeError as err:
            raise UserError(f"{where}: not UTF-8 text (byte {err.start} is {data[err.start]:#04x})",
                            hint=hint or "save the file as UTF-8") from None
    try:
        value = (json.loads(data, parse_int=_int, parse_float=_float, parse_constant=_constant) if strict
                 else json.loads(data, parse_int=_lenient_int))
    except json.JSONDecodeError as err:
        raise UserError(f"{where}: not valid JSON ({err.msg} at line {err.lineno} column {err.colno})",
                        hint=hint) from None
    except _Refused as err:
        raise UserError(f"{where}: {err}", hint=hint) from None
    except RecursionError:
        raise UserError(f"{where}: arrays or objects nested too deeply to read", hint=hint) from None
    if strict and data.count("[") + data.count("{") > MAX_DEPTH:  # only then can it be deeper than the limit
        _check_depth(value, where, hint)
    return value


class _Refused(ValueError):
    """A number the parser hooks refuse (raised through json.loads, turned into a UserError by parse_json)."""


def _int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _Refused(f"an integer of {len(text.lstrip('-'))} digits (more than 64 bits)")
    return int(text)


class Digits(str):
    """An integer of more than MAX_INT_DIGITS digits that lenient parsing kept as its digits: a number, never text
    (use :func:`is_text` where text belongs)."""


def is_text(value: Any) -> bool:
    """Whether a parsed JSON value is a string (not a huge integer lenient parsing kept as digits)."""
    return isinstance(value, str) and not isinstance(value, Digits)


def _lenient_int(text: str) -> int | str:
    return Digits(text) if len(text.lstrip("-")) > MAX_INT_DIGITS else int(text)


def _float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise _Refused(f"the number {text[:30]} is beyond the range of a float")
    return value


def _constant(text: str) -> float:
    raise _Refused(f"{text} is not a JSON number")


def _check_depth(value: Any, where: str, hint: str | None) -> None:
    """Refuse a value nested deeper than MAX_DEPTH (walked without recursion)."""
    todo = [(value, 1)]
    while todo:
        item, depth = todo.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        for child in children:
            if isinstance(child, (dict, list)):
                if depth + 1 > MAX_DEPTH:
                    raise UserError(f"{where}: arrays or objects nested more than {MAX_DEPTH} deep", hint=hint)
                todo.append((child, depth + 1))


def replace_surrogates(text: str) -> tuple[str, bool]:
    """``text`` with lone surrogates (a JSON escape like \\ud800 that is no character) as U+FFFD; whether any were."""
    try:
        text.encode("utf-8")
        return text, False
    except UnicodeEncodeError:
        return "".join("\ufffd" if "\ud800" <= ch <= "\udfff" else ch for ch in text), True


def parse_yaml_value(text: str, where: str) -> Any:
    """A value typed on the command line in YAML (``true``, ``16``, ``1e-3``, ``null``, ``elu1``, ``[a, b]``,
    ``{k: 1}``): a scalar, or a flat list or mapping of scalars (model.designs, model.design_options.<design>)."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as err:
        problem = str(getattr(err, "problem", None) or err).splitlines()[0]
        raise UserError(f"{where}: {text!r} is not a valid value ({problem})",
                        hint="give a number, true/false, null, a name or a flat [list]") from None
    items = list(value) + list(value.values()) if isinstance(value, dict) else value if isinstance(value, list) else []
    for item in [value] if not isinstance(value, (list, dict)) else items:
        if item is not None and not isinstance(item, (bool, int, float, str)):
            raise UserError(f"{where}: {text!r} holds a {type(item).__name__}, not a single value",
                            hint="give a number, true/false, null, a name or a flat [list]")
        if isinstance(item, int) and not INT64[0] <= item <= INT64[1]:
            raise UserError(f"{where}: {text!r} is beyond the range of a 64-bit integer")
    return value


def shown(value: Any) -> str:
    """A value as an error message shows it: its repr, cut to 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class Record:
    """A JSON object from an untrusted file, read field by field with types and ranges checked.

    ``where`` names the file (and the path to this object within it) in every error; ``hint`` is every error's
    hint. Absent fields take the given default; a field without one is required.
    """

    def __init__(self, value: Any, where: str, hint: str | None = None, field: str = "", what: str = "") -> None:
        self.where, self.hint, self.field = where, hint, field
        if not isinstance(value, dict):
            raise self.error(f"{what or field or 'the file'} must be a JSON object, got {type(value).__name__}")
        self.value: dict[str, Any] = value

    def error(self, problem: str) -> UserError:
        return UserError(f"{self.where}: {problem}", hint=self.hint)

    def name(self, key: str) -> str:
        return f"{self.field}.{key}" if self.field else key

    def get(self, key: str, default: Any = REQUIRED) -> Any:
        if key in self.value:
            return self.value[key]
        if default is REQUIRED:
            raise self.error(f"{self.name(key)} is missing")
        return default

    def int(self, key: str, default: Any = REQUIRED, low: int = 0, high: int = INT64[1]) -> Any:
        """An integer in [low, high] (not a bool, not 1.7); the default (which may be None) if absent."""
        value = self.get(key, default)
        if value is default and key not in self.value:
            return value
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            span = ("a non-negative integer" if low == 0 else f"an integer >= {low}") if high == INT64[1] \
                else f"an integer in [{low}, {high}]"
            raise self.error(f"{self.name(key)} must be {span}, got {shown(value)}")
        return value

    def number(self, key: str, default: Any = REQUIRED, low: float = -math.inf, high: float = math.inf) -> Any:
        """A finite number in [low, high] (an integer or a float, not a bool)."""
        value = self.get(key, default)
        if value is default and key not in self.value:
            return value
        if (isinstance(value, bool) or not isinstance(value, _NUMBER) or not math.isfinite(value)
                or not low <= value <= high):
            raise self.error(f"{self.name(key)} must be a number in [{low}, {high}], got {shown(value)}")
        return value

    def str(self, key: str, default: Any = REQUIRED, choices: tuple[str, ...] | None = None) -> Any:
        value = self.get(key, default)
        if value is default and key not in self.value:
            return value
        if not is_text(value) or (choices is not None and value not in choices):
            expected = f"one of {', '.join(choices)}" if choices else "a string"
            raise self.error(f"{self.name(key)} must be {expected}, got {shown(value)}")
        return value

    def bool(self, key: str, default: Any = REQUIRED) -> Any:
        value = self.get(key, default)
        if value is default and key not in self.value:
            return value
        if not isinstance(value, bool):
            raise self.error(f"{self.name(key)} must be true or false, got {shown(value)}")
        return value

    def list(self, key: str, default: Any = REQUIRED, of: type | tuple[type, ...] | None = None,
             nonempty: bool = False) -> Any:
        """A list (never a string read as one item per character), its items of type ``of`` if given."""
        value = self.get(key, default)
        if value is default and key not in self.value:
            return value
        if not isinstance(value, list) or (nonempty and not value):
            raise self.error(f"{self.name(key)} must be a {'non-empty ' if nonempty else ''}list, got {shown(value)}")
        kinds = of if isinstance(of, tuple) else (of,)
        for i, item in enumerate(value if of is not None else ()):
            if not isinstance(item, kinds) or (isinstance(item, bool) and bool not in kinds):
                raise self.error(f"{self.name(key)}[{i}] must be {_type_names(kinds)}, got {shown(item)}")
        return value

    def record(self, key: str, default: Any = REQUIRED) -> Any:
        """A nested object as a Record (errors name it as ``outer.inner``)."""
        value = self.get(key, default)
        if value is default and key not in self.value:
            return value if value is None else Record(value, self.where, self.hint, self.name(key))
        return Record(value, self.where, self.hint, self.name(key))


def _type_names(kinds: type | tuple[type, ...]) -> str:
    names = {int: "an integer", float: "a number", str: "a string", bool: "true or false", dict: "an object",
             list: "a list"}
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def dataclass_values(cls: type, values: dict[str, Any], where: str, hint: str | None = None,
                     prefix: str = "") -> dict[str, Any]:
    """``values`` checked against the field types ``cls`` (a dataclass) declares: unknown keys, and a value of
    another type (a string for an int, 1.7 for an int, a bool for a number), are refused naming ``where`` and the
    field. What a value must further be (positive, in range) is the dataclass's own check when it is built."""
    record = Record(values, where, hint)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise record.error(f"unknown field {prefix}{unknown[0]} (fields: {', '.join(sorted(known))})")
    hints = typing.get_type_hints(cls)
    for key, value in values.items():
        allowed = _allowed(hints[key])
        if allowed is not None and not _matches(value, allowed):
            raise record.error(f"{prefix}{key} must be {_type_names(tuple(t for t in allowed if t is not type(None)))}"
                               f"{' or null' if type(None) in allowed else ''}, got {shown(value)}")
    return values


def _allowed(annotation: Any) -> tuple[type, ...] | None:
    """The plain types a field annotation allows (Optional[int] -> (int, NoneType)); None when not plain."""
    if typing.get_origin(annotation) in (Union, types.UnionType):
        parts = [_allowed(a) for a in typing.get_args(annotation)]
        return None if any(p is None for p in parts) else tuple(t for p in parts for t in p)
    if annotation is type(None):
        return (type(None),)
    return (annotation,) if annotation in (int, float, str, bool) else None


def _matches(value: Any, allowed: tuple[type, ...]) -> bool:
    if isinstance(value, bool):
        return bool in allowed
    if isinstance(value, int):
        return (int in allowed or float in allowed) and INT64[0] <= value <= INT64[1]
    if isinstance(value, float):
        return float in allowed and math.isfinite(value)
    return isinstance(value, tuple(allowed))

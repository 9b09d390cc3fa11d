"""HellaSwag scored exactly as lm-evaluation-harness's ``hellaswag`` task scores it, so figures compare with published
ones: the query is preprocess(activity_label + ": " + ctx_a + " " + ctx_b.capitalize()), each ending is
preprocess(ending) scored as the continuation " " + ending; ``acc`` picks the highest summed log-likelihood,
``acc_norm`` the highest log-likelihood divided by the ending's length in characters (without the space).
"""

from __future__ import annotations

import contextlib
import math
import re
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from gpt.errors import UserError
from gpt.evaluation.loglik import encode_pair, loglikelihoods
from gpt.files import atomic_write
from gpt.tokenizers.tokenizer import Tokenizer
from gpt.validate import Record, parse_json, shown

URL = "https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl"  # 10,042 examples
FILE = "hellaswag_val.jsonl"
FIELDS = ("activity_label", "ctx_a", "ctx_b", "endings", "label")


@dataclass
class Example:
    query: str
    choices: list[str]
    gold: int


def preprocess(text: str) -> str:
    """lm-evaluation-harness's clean-up of HellaSwag text (WikiHow's bracketed artifacts)."""
    text = text.strip()
    text = text.replace(" [title]", ". ")
    text = re.sub("\\[.*?\\]", "", text)
    return text.replace("  ", " ")


def example(doc: dict[str, Any]) -> Example:
    """One JSONL record (the official file's fields, or the Hugging Face dataset's) as query, choices, gold."""
    ctx = doc["ctx_a"] + " " + doc["ctx_b"].capitalize()
    return Example(preprocess(doc["activity_label"] + ": " + ctx), [preprocess(e) for e in doc["endings"]],
                   int(doc["label"]))


def read(path: Path, limit: int | None = None) -> list[Example]:
    """The examples of a HellaSwag JSONL file (the first ``limit``); a malformed line is named by file and line."""
    examples: list[Example] = []
    hint = "hellaswag.path takes HellaSwag's JSONL: one JSON object per line"
    try:
        with open(path, "rb") as f:
            for number, line in enumerate(f, start=1):
                if limit is not None and len(examples) >= limit:
                    break
                if line.strip():
                    examples.append(checked(parse_json(line, f"{path}:{number}", hint), path, number))
    except OSError as err:
        raise UserError(f"{path} cannot be read: {err.strerror or err}") from None
    if not examples:
        raise UserError(f"{path} holds no HellaSwag examples")
    return examples


def checked(doc: Any, path: Path, number: int) -> Example:
    """The example of one parsed line, or a UserError naming the file, the line and the field that is wrong:
    texts are strings, endings a non-empty list of strings, the label an integer (the Hugging Face copy writes it
    as a string of digits) indexing the endings; 1.7 is not a label."""
    record = Record(doc, f"{path}:{number}", f"each line needs {', '.join(FIELDS)}", what="the line")
    for name in ("activity_label", "ctx_a", "ctx_b"):
        record.str(name)
    endings = record.list("endings", of=str, nonempty=True)
    label = record.get("label")
    if isinstance(label, str) and label.isascii() and label.isdigit() and len(label) < 5:
        label = int(label)
    if isinstance(label, bool) or not isinstance(label, int) or not 0 <= label < len(endings):
        raise record.error(f"label {shown(record.get('label'))} does not index its {len(endings)} endings")
    return example({**doc, "label": label})


def locate(path: str | None, cache_dir: str) -> Path:
    """The JSONL to read: ``path`` if given, else the cached official validation file (downloaded once)."""
    if path is not None:
        given = Path(path).expanduser()
        if not given.is_file():
            raise UserError(f"hellaswag.path {str(given)!r} does not exist",
                            hint=f"give the validation JSONL ({URL}), or leave hellaswag.path unset to download it")
        return given
    cached = Path(cache_dir).expanduser() / "hellaswag" / FILE
    if not cached.is_file():
        download(URL, cached)
    return cached


def download(url: str, dest: Path) -> None:
    """Fetch ``url`` into ``dest`` atomically; offline, a one-line error saying how to give the file instead."""
    print(f"downloading {url} to {dest}")
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            body = response.read()
    except OSError as err:  # URLError, timeouts, refused connections
        raise UserError(f"could not download HellaSwag from {url} ({getattr(err, 'reason', None) or err})",
                        hint=f"fetch {FILE} where the network allows and pass hellaswag.path=<file>") from None
    dest.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(dest, lambda f: f.write(body), what="the HellaSwag file")


def evaluate(model: nn.Module, tokenizer: Tokenizer, examples: list[Example], *, batch_size: int = 8,
             device: Any = "cpu", autocast: contextlib.AbstractContextManager | None = None,
             progress: Callable[[int, int], None] | None = None) -> dict[str, float | int]:
    """acc and acc_norm (with lm-eval's standard errors) of ``model`` over ``examples``."""
    pairs = [encode_pair(tokenizer, ex.query, " " + choice) for ex in examples for choice in ex.choices]
    scores = loglikelihoods(model, pairs, vocab_limit=tokenizer.vocab_size, batch_size=batch_size, device=device,
                            autocast=autocast, progress=progress)
    acc, acc_norm, at = [], [], 0
    for ex in examples:
        lls = np.array([ll for ll, _ in scores[at : at + len(ex.choices)]])
        at += len(ex.choices)
        lengths = np.array([float(len(choice)) for choice in ex.choices])
        acc.append(float(np.argmax(lls) == ex.gold))
        acc_norm.append(float(np.argmax(lls / lengths) == ex.gold))
    return {"acc": float(np.mean(acc)), "acc_stderr": stderr(acc), "acc_norm": float(np.mean(acc_norm)),
            "acc_norm_stderr": stderr(acc_norm), "examples": len(examples)}


def stderr(values: list[float]) -> float | None:
    """Standard error of the mean with the sample deviation (n - 1), as lm-eval reports it; None for one value."""
    n = len(values)
    return float(np.std(values, ddof=1) / math.sqrt(n)) if n > 1 else None

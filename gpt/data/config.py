"""DataConfig: which corpus, how it is tokenized, and where the prepared files go."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass
class DataConfig:
    name: str = "stdlib_char"  # folder under `root` that holds train.bin, val.bin, meta.json
    source: str = "stdlib"  # stdlib (the running Python's standard library) | path | url
    path: Optional[str] = None  # a text file or a folder of them, for source=path
    url: Optional[str] = None  # a text file to download once, for source=url
    tokenizer: str = "char"  # char | gpt2
    val_fraction: float = 0.1
    root: str = "data"
    rebuild: bool = False  # replace data/<name> even if it was prepared from another source or tokenizer

"""DataConfig: which corpus, how it is tokenized, and where the prepared files go."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from gpt.errors import ConfigError

TOKENIZERS = ("char", "gpt2")


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

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name or "\\" in self.name or self.name in (".", ".."):
            raise ConfigError(f"data.name must be a plain folder name (no slashes), got {self.name!r}",
                              hint="put the parent folder in data.root")
        if self.tokenizer not in TOKENIZERS:
            raise ConfigError(f"unknown data.tokenizer {self.tokenizer!r}; valid: {', '.join(TOKENIZERS)}")
        if self.source == "path" and not self.path:
            raise ConfigError("data.path must be given with data.source=path (data=text)",
                              hint="add data.path=<file or folder of text>")
        if self.source == "url" and not self.url:
            raise ConfigError("data.url must be given with data.source=url", hint="add data.url=<address of a text file>")
        if not 0.0 < self.val_fraction < 1.0:
            raise ConfigError(f"data.val_fraction must be in (0, 1), got {self.val_fraction}")

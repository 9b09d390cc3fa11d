"""DataConfig: which corpus, how it is tokenized and sharded, where the prepared files go, how windows are drawn."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from gpt.errors import ConfigError

SOURCES = ("stdlib", "path", "url", "files", "hf")
FORMATS = ("auto", "text", "jsonl", "parquet")
TOKENIZERS = ("char", "gpt2")  # by name; any other data.tokenizer is the path of a tokenizer.json or its folder
SAMPLINGS = ("random", "epoch")


MIN_VAL_FRACTION = 1e-6  # one document in a million: the documents before the first held-out one wait in memory


@dataclass
class DataConfig:
    name: str = "stdlib_char"  # folder under `root` that holds the shards and meta.json
    source: str = "stdlib"  # stdlib (this Python's standard library) | path | url | files | hf
    path: Optional[str] = None  # source=path: a text file or folder; source=files: a file, folder or glob
    url: Optional[str] = None  # a text file to download once, for source=url
    format: str = "auto"  # source=files: auto (by extension) | text | jsonl | parquet
    text_field: str = "text"  # the JSONL field / parquet column / dataset column that holds each document
    dataset: Optional[str] = None  # source=hf: a hub name or a folder written by datasets' save_to_disk
    subset: Optional[str] = None  # source=hf: the dataset's config name (e.g. sample-10BT)
    split: str = "train"  # source=hf: which split of the dataset to read
    streaming: bool = False  # source=hf: stream from the hub instead of downloading the whole split first
    revision: Optional[str] = None  # source=hf: a hub branch, tag or commit (None: main)
    # char | gpt2 | <tokenizer.json or its folder> (a trained BPE); gpt2 and BPEs with <|endoftext|> end every document
    # with it. Unset: the tokenizer data/<name> was prepared with (char when it is prepared now).
    tokenizer: Optional[str] = None
    val_fraction: float = 0.1  # every round(1/val_fraction)-th document is validation (few documents: the tail)
    num_proc: Optional[int] = None  # threads that encode in parallel (None: os.cpu_count())
    shard_tokens: int = 100_000_000  # tokens per shard file (the last shard of a split holds the rest)
    sampling: str = "random"  # random: windows at random offsets | epoch: every window once per epoch, shuffled
    root: str = "data"
    rebuild: bool = False  # replace data/<name> even if it was prepared from another source or tokenizer

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name or "\\" in self.name or self.name in (".", ".."):
            raise ConfigError(f"data.name must be a plain folder name (no slashes), got {self.name!r}",
                              hint="put the parent folder in data.root")
        for key, value, allowed in (("source", self.source, SOURCES), ("format", self.format, FORMATS),
                                      ("sampling", self.sampling, SAMPLINGS)):
            if value not in allowed:
                raise ConfigError(f"unknown data.{key} {value!r}", hint=f"use one of: {', '.join(allowed)}")
        if self.source in ("path", "files") and not self.path:
            raise ConfigError(f"data.path must be given with data.source={self.source}",
                              hint="add data.path=<file, folder or glob of documents>")
        if self.source == "url" and not self.url:
            raise ConfigError("data.url must be given with data.source=url",
                              hint="add data.url=<address of a text file>")
        if self.source == "hf" and not self.dataset:
            raise ConfigError("data.dataset must be given with data.source=hf",
                              hint="add data.dataset=<hub name or a folder written by save_to_disk>")
        if not MIN_VAL_FRACTION <= self.val_fraction < 1.0:  # a subnormal 1e-310 made 1 / val_fraction infinite
            raise ConfigError(f"data.val_fraction must be in [{MIN_VAL_FRACTION:g}, 1), got {self.val_fraction}",
                              hint="every round(1/val_fraction)-th document is held out for validation")
        if self.num_proc is not None and self.num_proc < 1:
            raise ConfigError(f"data.num_proc must be at least 1, got {self.num_proc}",
                              hint="leave it unset to use every core")
        if self.shard_tokens < 1:
            raise ConfigError(f"data.shard_tokens must be positive, got {self.shard_tokens}")
        if self.tokenizer is not None and not self.tokenizer.strip():
            raise ConfigError("data.tokenizer is empty", hint="use char, gpt2 or the path of a tokenizer.json")
        if not self.text_field:
            raise ConfigError("data.text_field is empty", hint="name the field that holds each document's text")


@dataclass
class PrepareConfig:
    """scripts/prepare.py's settings (configs/prepare.yaml)."""

    data: DataConfig = field(default_factory=DataConfig)
    force: bool = False  # prepare again even if an up-to-date copy exists

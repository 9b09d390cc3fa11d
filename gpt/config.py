"""GPTConfig: the model's architecture, validated on construction so a bad value fails early and clearly."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Optional

from gpt import attention
from gpt.errors import ConfigError

POS_EMBEDDINGS = ("learned", "rope")


@dataclass
class GPTConfig:
    """Shape of a GPT-2 style model. Defaults are GPT-2 small (124M)."""

    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    block_size: int = 1024
    vocab_size: int = 50257
    dropout: float = 0.0
    bias: bool = True
    attention: str = "sdpa"
    n_kv_head: Optional[int] = None  # key/value heads: None = n_head (GPT-2); fewer = grouped-query; 1 = multi-query
    window: Optional[int] = None  # sliding window: query i sees keys i - window < j <= i; None = all earlier keys
    pos_embedding: str = "learned"  # learned (GPT-2's wpe table) | rope (rotary, applied to q and k)
    attention_backend: Optional[str] = None  # attention=sdpa only: pin flash | efficient | math | cudnn

    def __post_init__(self) -> None:
        for name in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"model.{name} must be a positive integer, got {value!r}")
        if self.n_embd % self.n_head != 0:
            raise ConfigError(
                f"model.n_embd ({self.n_embd}) must be divisible by model.n_head ({self.n_head}); "
                f"pick n_head among {[h for h in range(1, min(self.n_embd, 64) + 1) if self.n_embd % h == 0]}"
            )
        if self.n_kv_head is None:
            self.n_kv_head = self.n_head
        if isinstance(self.n_kv_head, bool) or not isinstance(self.n_kv_head, int) or self.n_kv_head <= 0:
            raise ConfigError(f"model.n_kv_head must be a positive integer or null, got {self.n_kv_head!r}")
        if self.n_head % self.n_kv_head != 0:
            raise ConfigError(
                f"model.n_head ({self.n_head}) must be a multiple of model.n_kv_head ({self.n_kv_head}); "
                f"pick n_kv_head among {[h for h in range(1, self.n_head + 1) if self.n_head % h == 0]}"
            )
        if self.window is not None and (isinstance(self.window, bool) or not isinstance(self.window, int) or self.window <= 0):
            raise ConfigError(f"model.window must be a positive integer or null, got {self.window!r}")
        if self.pos_embedding not in POS_EMBEDDINGS:
            raise ConfigError(f"model.pos_embedding must be one of {', '.join(POS_EMBEDDINGS)}, got {self.pos_embedding!r}")
        if self.pos_embedding == "rope" and self.head_dim % 2 != 0:
            raise ConfigError(f"pos_embedding=rope needs an even head dimension, got n_embd/n_head = {self.head_dim}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.dropout must be in [0, 1), got {self.dropout!r}")
        if self.attention not in attention.available():
            raise ConfigError(
                f"unknown attention kernel {self.attention!r}; valid: {', '.join(attention.available())}"
            )
        if self.attention_backend is not None and self.attention_backend not in attention.backends(self.attention):
            valid = attention.backends(self.attention)
            raise ConfigError(
                f"attention.backend={self.attention_backend} is not a backend of attention={self.attention}; "
                + (f"valid: {', '.join(valid)}" if valid else "only attention=sdpa has backends")
            )
        wanted = {}  # the kernel options this shape needs, checked against what the kernel declares
        if self.window is not None:
            wanted["window"] = (f"model.window={self.window}", "model.window=null")
        if self.n_kv_head != self.n_head:
            wanted["gqa"] = (f"model.n_kv_head={self.n_kv_head}", "model.n_kv_head=null")
        attention.check_options(self.attention, wanted)

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "GPTConfig":
        """Build from a dict, refusing keys that are not GPTConfig fields (a typo or a newer checkpoint)."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown model config field(s): {', '.join(unknown)}")
        return cls(**values)

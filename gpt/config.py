"""GPTConfig: the model's architecture, validated on construction so a bad value fails early and clearly."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from gpt import attention
from gpt.errors import ConfigError


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
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.dropout must be in [0, 1), got {self.dropout!r}")
        if self.attention not in attention.available():
            raise ConfigError(
                f"unknown attention kernel {self.attention!r}; valid: {', '.join(attention.available())}"
            )

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

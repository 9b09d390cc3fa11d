"""GPTConfig: the model's architecture, validated on construction so a bad value fails early and clearly.

Also the model's config group as the scripts see it (ModelConfig: vocab_size may come from the data) and
the attention group (AttentionConfig).
"""

from __future__ import annotations

import math
from dataclasses import MISSING as NO_DEFAULT
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, ClassVar, Optional

from gpt import attention
from gpt.errors import ConfigError

ACTIVATIONS = ("gelu_tanh", "gelu", "relu2")  # model.activation: GPT-2's tanh GELU, the exact GELU, ReLU squared
POS_EMBEDDINGS = ("learned", "rope", "alibi")
LINEAR_FEATURES = ("elu1",)  # feature maps of model.linear_attn (gpt.attention.linear)
MISSING: Any = "???"  # a value the user must give (Hydra and OmegaConf read "???" as missing)


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
    activation: str = "gelu_tanh"  # the MLP's: gelu_tanh (GPT-2's) | gelu (exact) | relu2 (ReLU squared)
    tie_head: bool = True  # the output head is the token embedding (GPT-2); false: a head of its own
    zero_init_proj: bool = False  # the blocks' output projections (c_proj) start at zero, not GPT-2's scaled normal
    attention: str = "sdpa"
    n_kv_head: Optional[int] = None  # key/value heads: None = n_head (GPT-2); fewer = grouped-query; 1 = multi-query
    window: Optional[int] = None  # sliding window: query i sees keys i - window < j <= i; None = all earlier keys
    sink_tokens: int = 0  # StreamingLLM: with a window, every query also sees the first N tokens (kept in the cache)
    pos_embedding: str = "learned"  # learned (GPT-2's wpe table) | rope (rotary, on q and k) | alibi (score bias)
    attention_backend: Optional[str] = None  # attention=sdpa only: pin flash | efficient | math | cudnn
    qk_norm: bool = False  # RMS-normalise each head's queries and keys (learned gains) before the dot product
    attn_softcap: Optional[float] = None  # Gemma 2: scores -> cap * tanh(scores / cap); None = no cap
    attn_sink: bool = False  # a learned sink logit per head joins every softmax (the weight may go nowhere)
    diff_attn: bool = False  # Diff Transformer: two softmax maps from the halves of q and k, the second subtracted
    linear_attn: Optional[str] = None  # causal linear attention with this feature map (elu1); None = softmax
    mla_latent: Optional[int] = None  # multi-head latent attention: keys and values from a latent of this width
    mla_rope_dim: Optional[int] = None  # MLA's decoupled rotary features per query and key; None = head_dim/2 (even)

    # Choices of a run rather than of the weights: they change no parameter name or shape, so a resumed or
    # fine-tuned run, or a sampling session, may set them anew.
    RUNTIME_FIELDS: ClassVar[tuple[str, ...]] = ("dropout", "attention", "attention_backend", "window",
                                                 "sink_tokens", "zero_init_proj")

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
        window = self.window
        if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window <= 0):
            raise ConfigError(f"model.window must be a positive integer or null, got {self.window!r}")
        if self.pos_embedding not in POS_EMBEDDINGS:
            raise ConfigError(f"model.pos_embedding must be one of {', '.join(POS_EMBEDDINGS)}, "
                              f"got {self.pos_embedding!r}")
        if self.pos_embedding == "rope" and self.head_dim % 2 != 0:
            raise ConfigError(f"pos_embedding=rope needs an even head dimension, got n_embd/n_head = {self.head_dim}")
        self._check_variants()
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.dropout must be in [0, 1), got {self.dropout!r}")
        self._check_core_options()
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
        wanted.update(self._variant_options())
        attention.check_options(self.attention, wanted)

    def _check_variants(self) -> None:
        """The attention variants' own values (which kernels can compute them is checked with the others)."""
        for name in ("qk_norm", "attn_sink", "diff_attn"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"model.{name} must be true or false, got {getattr(self, name)!r}")
        cap = self.attn_softcap
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, float)) or not 0 < cap < math.inf):
            raise ConfigError(f"model.attn_softcap must be a positive number or null, got {cap!r}",
                              hint="Gemma 2 uses 50.0; null turns the cap off")
        if self.diff_attn:  # q and k split in halves of head_dim/2; with rope each half is rotated on its own
            rope = self.pos_embedding == "rope"
            need = 4 if rope else 2
            if self.head_dim % need != 0:
                raise ConfigError(
                    f"model.diff_attn=true needs a head dimension (n_embd/n_head) divisible by {need}, got "
                    f"{self.head_dim}: it splits each head's queries and keys in two halves"
                    + (", and pos_embedding=rope rotates each half" if rope else ""),
                    hint="change model.n_head or model.n_embd, or set model.diff_attn=false")
        self._check_latent()
        self._check_linear()
        self._check_sink_tokens()

    def _check_sink_tokens(self) -> None:
        """StreamingLLM's sink tokens: a count, meaningful only with a sliding window, and not with every variant."""
        n = self.sink_tokens
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ConfigError(f"model.sink_tokens must be a non-negative integer, got {n!r}")
        if n == 0:
            return
        if self.window is None:
            raise ConfigError(f"model.sink_tokens={n} needs a sliding window (model.window): without one every "
                              "earlier token is attended to already", hint="add model.window=<tokens>")
        refused = {"model.pos_embedding=alibi": self.pos_embedding == "alibi",
                   f"model.mla_latent={self.mla_latent}": self.mla_latent is not None}
        for setting, on in refused.items():
            if on:
                raise ConfigError(f"model.sink_tokens={n} cannot be combined with {setting} here",
                                  hint="set model.sink_tokens=0, or drop that option")

    def _check_latent(self) -> None:
        """Multi-head latent attention (DeepSeek-V2): its widths, and what it cannot be combined with, by name."""
        if self.mla_latent is None:
            if self.mla_rope_dim is not None:
                raise ConfigError(f"model.mla_rope_dim={self.mla_rope_dim} is set but model.mla_latent is not",
                                  hint="set model.mla_latent (the latent width), or model.mla_rope_dim=null")
            return
        latent = self.mla_latent
        if isinstance(latent, bool) or not isinstance(latent, int) or latent <= 0:
            raise ConfigError(f"model.mla_latent must be a positive integer or null, got {latent!r}",
                              hint="DeepSeek-V2 uses 4 x head_dim; null turns multi-head latent attention off")
        if self.mla_rope_dim is None:  # the paper's d_h^R = d_h / 2, kept even (RoPE rotates pairs)
            self.mla_rope_dim = max(2, self.head_dim // 4 * 2)
        rope = self.mla_rope_dim
        if isinstance(rope, bool) or not isinstance(rope, int) or rope <= 0 or rope % 2 != 0:
            raise ConfigError(f"model.mla_rope_dim must be a positive even integer, got {rope!r}",
                              hint="RoPE rotates pairs of features; null picks head_dim/2")
        clashes = {  # setting -> (whether it is set, why multi-head latent attention cannot have it)
            f"model.pos_embedding={self.pos_embedding}": (
                self.pos_embedding != "learned",
                "MLA applies RoPE itself, to its decoupled query and key features (model.mla_rope_dim)"),
            f"model.n_kv_head={self.n_kv_head}": (
                self.n_kv_head != self.n_head, "every head's keys and values come from the one shared latent"),
            "model.qk_norm": (self.qk_norm, "not implemented for keys up-projected from the latent"),
            "model.diff_attn": (self.diff_attn, "differential attention splits the heads' queries and keys"),
            "model.linear_attn": (self.linear_attn is not None, "linear attention keeps a state, not a latent"),
        }
        for setting, (clash, why) in clashes.items():
            if clash:
                raise ConfigError(f"model.mla_latent={latent} cannot be combined with {setting}: {why}",
                                  hint=f"unset {setting.split('=')[0]}, or set model.mla_latent=null")

    def _check_linear(self) -> None:
        """Causal linear attention has no scores and no softmax: refuse what acts on them, naming it."""
        if self.linear_attn is None:
            return
        if self.linear_attn not in LINEAR_FEATURES:
            raise ConfigError(f"model.linear_attn must be one of {', '.join(LINEAR_FEATURES)} or null, "
                              f"got {self.linear_attn!r}",
                              hint="model.linear_attn=elu1 (phi(x) = elu(x) + 1), or model.linear_attn=null (softmax)")
        no_scores = "linear attention forms no softmax scores"
        clashes = {  # setting -> (whether it is set, why linear attention cannot have it)
            "model.window": (self.window is not None, "its running state sums every earlier token"),
            f"model.pos_embedding={self.pos_embedding}": (
                self.pos_embedding != "learned",
                "rotations or score biases do not survive the feature map; use pos_embedding=learned"),
            "model.attn_softcap": (self.attn_softcap is not None, no_scores),
            "model.attn_sink": (self.attn_sink, no_scores),
            "model.diff_attn": (self.diff_attn, "differential attention subtracts two softmax maps"),
        }
        for setting, (clash, why) in clashes.items():
            if clash:
                raise ConfigError(f"model.linear_attn={self.linear_attn} cannot be combined with {setting}: {why}",
                                  hint=f"unset {setting.split('=')[0]}, or set model.linear_attn=null")

    def _variant_options(self) -> dict[str, tuple[str, str]]:
        """The kernel options (registry EXTENSIONS) the score variants need: option -> (setting, fix)."""
        wanted = {}
        if self.attn_softcap is not None:
            wanted["softcap"] = (f"model.attn_softcap={self.attn_softcap}", "model.attn_softcap=null")
        if self.pos_embedding == "alibi":
            wanted["bias"] = ("model.pos_embedding=alibi (a score bias)", "model.pos_embedding=rope")
        if self.attn_sink:
            wanted["sink"] = ("model.attn_sink=true", "model.attn_sink=false")
        return wanted

    def _check_core_options(self) -> None:
        """The MLP's activation and the head's and projections' switches."""
        if self.activation not in ACTIVATIONS:
            raise ConfigError(f"model.activation must be one of {', '.join(ACTIVATIONS)}, got {self.activation!r}")
        for name in ("tie_head", "zero_init_proj"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"model.{name} must be true or false, got {getattr(self, name)!r}")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def qk_dim(self) -> int:
        """Features of one query or key as the kernel sees it: a head's, or half of it with diff_attn."""
        return self.head_dim // 2 if self.diff_attn else self.head_dim

    @property
    def rope_dim(self) -> int | None:
        """Features RoPE rotates per query and key: MLA's decoupled part, a head's (or half) with rope, else None."""
        if self.mla_latent is not None:
            return self.mla_rope_dim
        return self.qk_dim if self.pos_embedding == "rope" else None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def with_runtime_of(self, other: GPTConfig) -> GPTConfig:
        """This architecture with ``other``'s runtime choices (RUNTIME_FIELDS)."""
        return replace(self, **{name: getattr(other, name) for name in self.RUNTIME_FIELDS})

    def shape_differences(self, other: GPTConfig | dict[str, Any]) -> list[str]:
        """Fields (runtime ones aside) where ``other`` (e.g. a checkpoint's config) differs, as readable phrases."""
        mine, theirs, unset = self.to_dict(), other if isinstance(other, dict) else other.to_dict(), "(not set)"
        # a checkpoint from before a field existed holds its default (e.g. qk_norm=False)
        theirs = {**{f.name: f.default for f in fields(GPTConfig) if f.default is not NO_DEFAULT}, **theirs}
        keys = sorted((set(mine) | set(theirs)) - set(self.RUNTIME_FIELDS))
        return [f"model.{k} is {theirs.get(k, unset)!r} in the checkpoint but {mine.get(k, unset)!r} now"
                for k in keys if theirs.get(k, unset) != mine.get(k, unset)]

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> GPTConfig:
        """Build from a dict, refusing keys that are not GPTConfig fields (a typo or a newer checkpoint)."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown model config field(s): {', '.join(unknown)}")
        return cls(**values)


@dataclass
class ModelConfig(GPTConfig):
    """GPTConfig as the ``model=`` config group: vocab_size None means the data's tokenizer's vocabulary.

    Validated on construction like GPTConfig (every field but the vocabulary, which the data settles).
    """

    vocab_size: Optional[int] = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        self.build(self.vocab_size or 1)

    def build(self, tokenizer_vocab: int) -> GPTConfig:
        """The model's GPTConfig once the tokenizer's vocabulary is known (it may be padded, never smaller)."""
        values = {f.name: getattr(self, f.name) for f in fields(GPTConfig)}
        if values["vocab_size"] is None:
            values["vocab_size"] = tokenizer_vocab
        elif values["vocab_size"] < tokenizer_vocab:
            raise ConfigError(f"model.vocab_size ({values['vocab_size']}) is smaller than the tokenizer's "
                              f"vocabulary ({tokenizer_vocab})", hint="leave model.vocab_size unset, or raise it")
        return GPTConfig(**values)


@dataclass
class AttentionConfig:
    """The ``attention=`` config group: which kernel (and, for sdpa, which backend) computes attention."""

    name: str = "sdpa"
    backend: Optional[str] = None  # sdpa only: flash | efficient | math | cudnn (None: torch chooses)

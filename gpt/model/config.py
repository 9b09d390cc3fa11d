"""GPTConfig: the model's architecture, validated on construction so a bad value fails early and clearly.

Also the model's config group as the scripts see it (ModelConfig: vocab_size may come from the data), the
attention group (AttentionConfig), written into it, and what every script's config shares (ScriptConfig).
"""

from __future__ import annotations

from dataclasses import MISSING as NO_DEFAULT
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, ClassVar, Optional

from gpt import kernels
from gpt.errors import ConfigError
from gpt.model import design as designs
from gpt.model import layout, renamed

ACTIVATIONS = ("gelu_tanh", "gelu", "relu2")  # model.activation: GPT-2's tanh GELU, the exact GELU, ReLU squared
NORMS = ("layernorm", "rmsnorm")  # model.norm: GPT-2's LayerNorm (weight and bias), RMSNorm (a weight only)
MISSING: Any = "???"  # a value the user must give (Hydra and OmegaConf read "???" as missing)


@dataclass
class GPTConfig:
    """Shape of a GPT-2 style model. Defaults are GPT-2 small (124M).

    ``designs`` names the attention designs (gpt.designs: built-in or brought), ``design_options`` their settings
    keyed by design (defaults filled in); each design checks its own. A file written before they were named so
    reads through gpt.model.renamed.upgrade (from_dict).
    """

    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    block_size: int = 1024
    vocab_size: int = 50257
    dropout: float = 0.0
    bias: bool = True
    activation: str = "gelu_tanh"  # the MLP's: gelu_tanh (GPT-2's) | gelu (exact) | relu2 (ReLU squared)
    norm: str = "layernorm"  # the blocks' and the final norm: layernorm (GPT-2's) | rmsnorm (Llama's, Qwen's)
    mlp: bool = True  # false: attention-only blocks, no MLP (Olsson et al.'s toy models for induction heads)
    tie_head: bool = True  # the output head is the token embedding (GPT-2); false: a head of its own
    zero_init_proj: bool = False  # the blocks' output projections (c_proj) start at zero, not GPT-2's scaled normal
    attention: str = "sdpa"
    n_kv_head: Optional[int] = None  # key/value heads: None = n_head (GPT-2); fewer = grouped-query; 1 = multi-query
    window: Optional[int] = None  # sliding window: query i sees keys i - window < j <= i; None = all earlier keys
    attention_backend: Optional[str] = None  # attention=sdpa only: pin flash | efficient | math | cudnn
    designs: list[str] = field(default_factory=list)  # the attention designs, built-in or brought, by name: [rope, ...]
    design_options: dict[str, Any] = field(default_factory=dict)  # their settings by design: {rope: {base: 1e6}}
    layers: Any = None  # a layout: kind letters tiled over n_layer ("SSSSSL") or one kind per layer; None: uniform
    layer_kinds: Any = None  # the layout's kinds by name: {window, designs, options} each (gpt/model/layout.py)

    kind: ClassVar[Optional[str]] = None  # a kind's config (kind_config): the kind's name; the model's: None

    # Choices of a run rather than of the weights: they change no parameter name or shape, so a resumed or
    # fine-tuned run, or a sampling session, may set them anew (designs declare theirs, with their settings:
    # Design.runtime).
    RUNTIME_FIELDS: ClassVar[tuple[str, ...]] = ("dropout", "attention", "attention_backend", "window",
                                                 "zero_init_proj")

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
        self._check_designs()
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.dropout must be in [0, 1), got {self.dropout!r}")
        self._check_core_options()
        self._check_kernel()
        self._check_layout()

    def _check_layout(self) -> None:
        """model.layers and model.layer_kinds: every kind's config is built (and so checked) now, before any layer."""
        if self.layers is None:
            if self.layer_kinds:
                raise ConfigError("model.layer_kinds is set but model.layers is not",
                                  hint=f"name each layer's kind: {layout.EXAMPLE}")
            self._layer_kinds, self._kind_configs = None, {None: self}
            return
        self._layer_kinds = layout.layer_kinds(self)
        self._kind_configs = {name: layout.kind_config(self, name) for name in dict.fromkeys(self._layer_kinds)}

    def kinds(self) -> dict[Optional[str], GPTConfig]:
        """Each kind of layer, by name, as the config its layers are built from (uniform: {None: self})."""
        return self._kind_configs

    def kind_of(self, layer: int) -> Optional[str]:
        """The kind of layer ``layer`` (0-based): a key of ``kinds()``."""
        return None if self._layer_kinds is None else self._layer_kinds[layer]

    def layer(self, layer: int) -> GPTConfig:
        """The config layer ``layer`` is built from: its kind's (uniform: this one)."""
        return self._kind_configs[self.kind_of(layer)]

    def _check_core_options(self) -> None:
        """The MLP's activation, the norm, and the head's and projections' switches."""
        if self.activation not in ACTIVATIONS:
            raise ConfigError(f"model.activation must be one of {', '.join(ACTIVATIONS)}, got {self.activation!r}")
        if self.norm not in NORMS:
            raise ConfigError(f"model.norm must be one of {', '.join(NORMS)}, got {self.norm!r}")
        for name in ("tie_head", "zero_init_proj", "mlp"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"model.{name} must be true or false, got {getattr(self, name)!r}")

    def _check_designs(self) -> None:
        """The attention designs: the list's and the mapping's types, then the registry's checks (gpt.model.design)."""
        if not isinstance(self.designs, list) or not all(isinstance(d, str) for d in self.designs):
            raise ConfigError(f"model.designs must be a list of design names, got {self.designs!r}")
        if not isinstance(self.design_options, dict):
            raise ConfigError(f"model.design_options must be a mapping, got {self.design_options!r}")
        designs.check(self)

    def _check_kernel(self) -> None:
        """The kernel exists, its backend too, and it declares every option this model needs."""
        if self.attention not in kernels.available():
            raise ConfigError(
                f"unknown attention kernel {self.attention!r}; valid: {', '.join(kernels.available())}"
            )
        if self.attention_backend is not None and self.attention_backend not in kernels.backends(self.attention):
            valid = kernels.backends(self.attention)
            raise ConfigError(
                f"model.attention_backend={self.attention_backend} is not a backend of attention={self.attention}; "
                + (f"valid: {', '.join(valid)}" if valid else "only attention=sdpa has backends")
            )
        wanted = {}  # the kernel options this shape needs, checked against what the kernel declares
        if self.window is not None:
            wanted["window"] = (f"model.window={self.window}", "model.window=null")
        if self.n_kv_head != self.n_head:
            wanted["gqa"] = (f"model.n_kv_head={self.n_kv_head}", "model.n_kv_head=null")
        wanted.update(designs.kernel_options(self))
        kernels.check_options(self.attention, wanted)

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def with_runtime_of(self, other: GPTConfig) -> GPTConfig:
        """This architecture with ``other``'s runtime choices: RUNTIME_FIELDS, and the designs that change no weight
        (Design.runtime) with their settings."""
        runtime = designs.runtime_designs()
        names = [d for d in self.designs if d not in runtime] + [d for d in other.designs if d in runtime]
        options = {**{k: v for k, v in self.design_options.items() if k not in runtime},
                   **{k: v for k, v in other.design_options.items() if k in runtime}}
        return replace(self, **{name: getattr(other, name) for name in self.RUNTIME_FIELDS}, designs=names,
                       design_options=options)

    def shape_differences(self, other: GPTConfig | dict[str, Any]) -> list[str]:
        """Fields (runtime ones aside) where ``other`` (e.g. a checkpoint's config) differs, as readable phrases."""
        mine = _architecture(self.to_dict())
        theirs = _architecture(renamed.upgrade(other) if isinstance(other, dict) else other.to_dict())
        unset = "(not set)"
        # a checkpoint from before a field existed holds its default (e.g. norm=layernorm)
        defaults = {f.name: f.default if f.default is not NO_DEFAULT else f.default_factory()
                    for f in fields(GPTConfig) if f.default is not NO_DEFAULT or f.default_factory is not NO_DEFAULT}
        theirs = {**defaults, **theirs}
        keys = sorted((set(mine) | set(theirs)) - set(self.RUNTIME_FIELDS))
        return [f"model.{k} is {theirs.get(k, unset)!r} in the checkpoint but {mine.get(k, unset)!r} now"
                for k in keys if theirs.get(k, unset) != mine.get(k, unset)]

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> GPTConfig:
        """Build from a dict (a file's: an old one's settings respelled by renamed.upgrade), refusing keys that are
        not GPTConfig fields (a typo or a newer checkpoint)."""
        values = renamed.upgrade(values)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown model config field(s): {', '.join(unknown)}")
        return cls(**values)


def _architecture(values: dict[str, Any]) -> dict[str, Any]:
    """A config dict's designs and their settings without the runtime designs', in hook order, defaults filled."""
    runtime = designs.runtime_designs()
    names = values.get("designs")
    if isinstance(names, list) and isinstance(values.get("design_options"), dict):
        known = designs.available()
        names = sorted((d for d in names if d not in runtime), key=lambda d: known.index(d) if d in known else 1 << 30)
        options = designs.filled(names, values["design_options"])
        values = {**values, "designs": names, "design_options": options}
    return values


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
class ScriptConfig:
    """What every script's config shares: ``designs=[my_design.py, ...]``, the files, package folders or module names
    that register the attention designs a user brings (gpt.designs.loading; GPT_DESIGNS does the same)."""

    designs: list[str] = field(default_factory=list)


@dataclass
class AttentionConfig:
    """The ``attention=`` group (configs/attention/, package ``model``): the kernel, written straight into the model
    config as model.attention and model.attention_backend. A script without a model config (generate) takes these
    two alone, to run a checkpoint's weights with another kernel."""

    attention: str = "sdpa"
    attention_backend: Optional[str] = None  # sdpa only: flash | efficient | math | cudnn (None: torch chooses)

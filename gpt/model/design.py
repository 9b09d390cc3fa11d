"""The attention-design registry: one ``Design`` per way of changing GPT-2's attention, so a config picks it.

Shaped like the kernel registry (gpt.kernels.registry): a design declares what it is and what it needs where it
registers, and everything outside its own module (the model, the config checks, the KV cache, the memory planner,
the exporters, the arena, ``python -m gpt.attention``, the pictures) reads the registry instead of naming it.

A design acts on the core's attention layer (gpt.model.CausalSelfAttention) in one of two ways, as torchtitan
composes attention: as a *part* (hooks the layer calls: parameters it adds, a q/k transform, kernel keywords that
modify the scores, per-forward values in the context), or as a *layer* (a subclass replacing the whole layer,
for designs that change its shape: differential, linear, latent). This module imports no design: the built-in
ones (gpt.designs, one module each) import it and register, and the package gpt imports them before anything reads
the registry; a user's are loaded by gpt.designs.loading (``designs=[my_design.py]`` or GPT_DESIGNS).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import Tensor

from gpt import kernels
from gpt.errors import ConfigError

GPTConfig = Any  # gpt.model.config.GPTConfig, which reads this registry (so this module cannot import it)

BUILTIN = ("qk_norm", "rope", "softcap", "alibi", "sink", "diff", "linear", "mla", "stream", "gated",
           "deltanet")  # hook order
EXPORT_FORMATS = ("hf", "native")  # hf: transformers' GPT-2 layout; native: this project's own (any design)


class Design:
    """One attention design: its spec (class attributes) and the hooks through which it acts.

    Subclass it, set ``name`` and whatever applies, override the hooks it needs and ``register(MyDesign())``.
    A field added here later, with a default, reaches every design (the user's too) at once.
    """

    name: str = ""
    about: str = ""  # one line: what it changes (python -m gpt.attention, refusals)
    paper: str = ""  # where it comes from
    switch: str | None = None  # the model config field that turns it on; None: named in model.designs
    on: Any = None  # the switch's value meaning "on"; None: any value but the field's default
    fields: tuple[str, ...] = ()  # further model config fields it owns (its check() validates them)
    options: dict[str, Any] = {}  # a brought design's own settings and defaults, kept in model.design_options
    layer_options: dict[str, Any] = {}  # settings a layer kind may give it, with defaults (model.layer_kinds.<kind>.
    # options.<design>.<key>: e.g. RoPE's base); read with layer_option(config, name, key)
    runtime: bool = False  # its settings change no weight: a resumed run or a sampling session may change them
    positional: bool = False  # it encodes positions itself, so the model has no learned position table (wpe)
    layer: type | None = None  # an attention layer replacing the core's (a gpt.model.CausalSelfAttention subclass)
    cache: type | None = None  # its per-layer KV-cache kind (gpt.model.kv_cache.LayerKV's interface); None: k, v
    kernel_options: tuple[str, ...] = ()  # kernel options it needs (gpt.kernels.registry.OPTIONS)
    uses_kernel: bool = True  # False: its layer computes attention itself, so attention=<kernel> changes nothing
    exports: tuple[str, ...] = ("native",)  # export formats that can hold it (EXPORT_FORMATS)
    modeling: str | None = None  # its remote-code export: a self-contained .py file (torch, transformers) defining
    # class Part, hooks of gpt/interop/modeling/core.py (modeling_file(name) for the built-ins); None: none
    preset: dict[str, Any] | None = None  # the arena's preset (model overrides); None: switched on with defaults
    view: str = "the softmax weights of each head"  # what the attention pictures show for it
    conflicts: dict[str, str] = {}  # designs it cannot be combined with -> why (either side may say it)
    cases: dict[str, dict[str, Any]] = {}  # settings the contract tests check it in, alone and combined

    # --- how a config turns it on, and how to say so ---------------------------------------------------------------

    def enabled(self, config: GPTConfig) -> bool:
        if self.switch is None:
            return self.name in config.designs
        value = getattr(config, self.switch)
        return value == self.on if self.on is not None else value != field_default(config, self.switch)

    def setting(self, config: GPTConfig) -> str:
        """The setting that turns it on, as the user typed it: ``model.qk_norm=true``."""
        if self.switch is None:
            return f"model.designs=[{self.name}]"
        return f"model.{self.switch}={spell(getattr(config, self.switch))}"

    def off(self, config: GPTConfig) -> str:
        """How to turn it off: ``model.qk_norm=false``."""
        if self.switch is None:
            return f"model.designs without {self.name}"
        return f"model.{self.switch}={spell(field_default(config, self.switch))}"

    def on_preset(self) -> dict[str, Any]:
        """Model overrides that switch it on (the arena's preset of the same name)."""
        if self.preset is not None:
            return dict(self.preset)
        if self.switch is None:
            return {"designs": [self.name]}
        return {self.switch: True if self.on is None else self.on}

    # --- hooks (no-ops unless a design overrides them) -------------------------------------------------------------

    def check(self, config: GPTConfig) -> None:
        """Validate (and resolve defaults of) its own fields; raise ConfigError naming the field."""

    def check_layer_options(self, values: dict[str, Any], where: str) -> None:
        """Validate a layer kind's settings of this design (layer_options' keys, defaults filled in); ``where``
        names them (model.layer_kinds.S.options.rope)."""

    def no_cache(self, config: GPTConfig) -> str | None:
        """Why its layers cannot decode with a KV cache (gpt.model.kv_cache refuses it, saying so); None: they can."""
        return None

    def build(self, layer: Any, config: GPTConfig) -> None:
        """Add its parameters or modules to an attention layer (called in the layer's __init__)."""

    def context(self, ctx: Any, config: GPTConfig) -> None:
        """Add to the context every layer reads this forward pass (gpt.model.Context): angles, a bias, masks."""

    def qk(self, layer: Any, q: Tensor, k: Tensor, ctx: Any) -> tuple[Tensor, Tensor]:
        """Transform queries (B, H, T, D) and keys (B, Hkv, T, D) before the cache and the kernel."""
        return q, k

    def scores(self, layer: Any, ctx: Any) -> dict[str, Any]:
        """Kernel keywords modifying the scores (its kernel_options: softcap, bias, sink)."""
        return {}

    def output(self, layer: Any, y: Tensor, x: Tensor, ctx: Any) -> Tensor:
        """Change the heads' outputs y (B, T, C), side by side, before the output projection c_proj, given the
        layer's input x (B, T, C): an output gate."""
        return y

    def flops(self, config: GPTConfig, seq: int, flops: int) -> int | None:
        """Training FLOPs per token (forward and backward) of one attention layer with this design on, given
        ``flops``, the layer's count before it, for ``seq``-token sequences: matrix products only, attention dense
        (gpt.model.flops). None: not declared, and arena.flops refuses the design, saying so."""
        return None

    def activations(self, config: GPTConfig, batch: int, seq: int, act: int, fused: bool) -> int:
        """Bytes one block keeps for the backward beyond the core's, for gpt.memory: ``act``-byte floats, ``fused``
        when the kernel never holds the T x T scores (sdpa, flex)."""
        return 0

    # float64 references, one query at a time (gpt.designs.reference composes them): the contract tests' truth
    def ref_qk(self, layer: Any, x: Tensor, position: int, kind: str) -> Tensor:
        """One query or key vector (kind "q" or "k") at ``position``, as this design transforms it."""
        return x

    def ref_score(self, layer: Any, s: Tensor, i: int, keys: list[int], head: int) -> Tensor:
        """The scores s (len(keys),) of query i in head ``head``, as this design modifies them."""
        return s

    def ref_sink(self, layer: Any, head: int) -> Tensor | float:
        """What this design adds to each softmax denominator (a sink's exp(logit))."""
        return 0.0

    def ref_output(self, layer: Any, y: Tensor, x: Tensor) -> Tensor:
        """The heads' outputs y (B, T, C) before c_proj, as this design changes them given the layer input x."""
        return y

    def ref_keys(self, config: GPTConfig, i: int, keys: list[int]) -> list[int]:
        """The keys query i may see, given those of the causal window."""
        return keys

    def reference(self, layer: Any, x: Tensor, config: GPTConfig) -> Tensor:
        """A layer design's whole layer in float64 (x (B, T, C) -> (B, T, C)); parts use the core's."""
        raise NotImplementedError(f"design {self.name} has no float64 reference")

    def ref_pattern(self, layer: Any, x: Tensor, config: GPTConfig) -> Tensor:
        """A layer design's attention pattern (B, H, T, T) in float64: what its pictures and gpt.interpret's
        hook_pattern show (its ``view``); parts use the core's softmax weights."""
        raise NotImplementedError(f"design {self.name} declares no float64 pattern")


def modeling_file(name: str) -> str:
    """The path of a built-in design's remote-code part, gpt/interop/modeling/<name>.py: a file an export copies
    (gpt.interop.targets), never imported."""
    return str(Path(__file__).resolve().parent.parent / "interop" / "modeling" / f"{name}.py")


def layer_option(config: GPTConfig, name: str, key: str) -> Any:
    """Design ``name``'s per-layer setting ``key`` in this (kind's) config: the kind's value or the design's default."""
    return config.kind_options.get(name, {}).get(key, get(name).layer_options[key])


def field_default(config: GPTConfig, name: str) -> Any:
    """The default of one of the config's fields (what "off" means for a design's switch)."""
    return next(f.default for f in dataclasses.fields(config) if f.name == name)


def check_bool(config: GPTConfig, name: str) -> None:
    """Refuse a switch that is not true or false."""
    if not isinstance(getattr(config, name), bool):
        raise ConfigError(f"model.{name} must be true or false, got {getattr(config, name)!r}")


def spell(value: Any) -> str:
    """A value as a command line spells it: true, null, 15.0, rope."""
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(spell(v) for v in value) + "]"
    return str(value)


_DESIGNS: dict[str, Design] = {}
_first_read: list[Callable[[], None]] = []  # run once, when the registry is first read (gpt.designs: GPT_DESIGNS)


def register(design: Design, override: bool = False) -> Design:
    """Add a design; ``model.<switch>=...`` (or ``model.designs=[name]``) then selects it."""
    if not isinstance(design, Design) or not design.name.isidentifier():
        raise ValueError(f"register() takes a Design instance with an identifier name, got {design!r}")
    if design.name in _DESIGNS and not override:
        raise ValueError(f"attention design {design.name!r} is already registered (pass override=True to replace it)")
    unknown = sorted(set(design.exports) - set(EXPORT_FORMATS))
    if unknown:
        raise ValueError(f"design {design.name}: unknown export format {unknown[0]}; valid: {EXPORT_FORMATS}")
    _DESIGNS[design.name] = design
    return design


def unregister(name: str) -> None:
    """Remove a design (a test's or a notebook's experiment)."""
    get(name)
    del _DESIGNS[name]


def on_first_read(hook: Callable[[], None]) -> None:
    """Run ``hook`` once, when the registry is first read (gpt.designs loads what GPT_DESIGNS names so)."""
    _first_read.append(hook)


def _designs() -> dict[str, Design]:
    """Every registered design in hook order: the built-ins in BUILTIN's order, then the others as they registered
    (GPT_DESIGNS names some: gpt.designs.loading), whichever module happened to be imported first."""
    while _first_read:
        _first_read.pop(0)()
    rank = {name: i for i, name in enumerate(BUILTIN)}
    return dict(sorted(_DESIGNS.items(), key=lambda item: rank.get(item[0], len(rank))))


def get(name: str) -> Design:
    try:
        return _designs()[name]
    except KeyError:
        raise KeyError(f"unknown attention design {name!r}; valid: {', '.join(available())}") from None


def available() -> list[str]:
    """Names of every registered design, built-ins first, in the order their hooks run."""
    return list(_designs())


def active(config: GPTConfig) -> list[Design]:
    """The designs this config turns on, in hook order."""
    return [d for d in _designs().values() if d.enabled(config)]


def active_anywhere(config: GPTConfig) -> list[Design]:
    """The designs some layer turns on (a layout's kinds together; a uniform model's: active), in hook order."""
    kinds = list(config.kinds().values())
    return [d for d in _designs().values() if any(d.enabled(kind) for kind in kinds)]


def layer_class(config: GPTConfig) -> type | None:
    """The attention layer class a design of this config brings (None: the core's)."""
    return next((d.layer for d in active(config) if d.layer is not None), None)


def cache_kind(config: GPTConfig) -> type | None:
    """The per-layer KV-cache class a design of this config brings (None: keys and values: kv_cache.LayerKV)."""
    return next((d.cache for d in active(config) if d.cache is not None), None)


def positional(config: GPTConfig) -> bool:
    """Whether a design encodes positions, so the model has no learned position table."""
    return any(d.positional for d in active(config))


def kernels_for(design: Design) -> list[str]:
    """The registered kernels that can compute a design (all of its kernel_options); none if it uses no kernel."""
    if not design.uses_kernel:
        return []
    return [k for k in kernels.available() if all(kernels.spec(k).supports(o) for o in design.kernel_options)]


def runtime_fields() -> tuple[str, ...]:
    """Model config fields of designs whose settings change no weight."""
    return tuple(f for d in _designs().values() if d.runtime for f in (d.switch, *d.fields) if f)


def kernel_options(config: GPTConfig) -> dict[str, tuple[str, str]]:
    """The kernel options the active designs need: option -> (the setting asking for it, how to turn it off)."""
    return {option: (d.setting(config), d.off(config)) for d in active(config) for option in d.kernel_options}


def check(config: GPTConfig) -> None:
    """The designs' part of GPTConfig's checks: names known, options known, each design's own fields, and every
    pair of active designs that cannot be combined (one ConfigError naming both settings)."""
    for name in config.designs:
        if name not in _designs():
            raise DesignUnavailable(name)
    for design in _designs().values():
        design.check(config)
    on = active(config)
    _check_options(config, on)
    for i, a in enumerate(on):
        for b in on[i + 1:]:
            why = a.conflicts.get(b.name) or b.conflicts.get(a.name) or _exclusive(a, b)
            if why:
                raise ConfigError(f"{a.setting(config)} cannot be combined with {b.setting(config)}: {why}",
                                  hint=f"set {b.off(config)}, or {a.off(config)}")


def _exclusive(a: Design, b: Design) -> str | None:
    """Two designs that each replace the same thing cannot both be on."""
    if a.layer is not None and b.layer is not None:
        return "each replaces the whole attention layer"
    if a.cache is not None and b.cache is not None:
        return "each keeps its own kind of KV cache"
    return None


def _check_options(config: GPTConfig, on: list[Design]) -> None:
    """model.design_options: every key belongs to an active design (defaults filled in for those it omits)."""
    owners = {key: d for d in on for key in d.options}
    unknown = sorted(set(config.design_options) - set(owners))
    if unknown:
        raise ConfigError(f"model.design_options.{unknown[0]} is not an option of an active design"
                          + (f" (active: {', '.join(d.name for d in on)})" if on else ""),
                          hint="check the spelling, or add the design to model.designs")
    for key, design in owners.items():
        config.design_options.setdefault(key, design.options[key])


class DesignUnavailable(ConfigError):
    """A config (or a checkpoint's) names a design this process has not loaded: say how to bring it."""

    def __init__(self, name: str) -> None:
        super().__init__(f"attention design {name!r} is not available (known: {', '.join(available())})",
                         hint=f"make the module that registers {name} available: designs=[path/to/its_file.py] "
                              "on the command line, or GPT_DESIGNS=path/to/its_file.py in the environment")
        self.design = name

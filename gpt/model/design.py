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
    options: dict[str, Any] = {}  # its settings and their defaults, kept in model.design_options.<name>.<key>; a
    # layer kind may give its own (model.layer_kinds.<kind>.options.<name>.<key>): e.g. RoPE's base, softcap's cap
    runtime: bool = False  # its settings change no weight: a resumed run or a sampling session may change them
    positional: bool = False  # it encodes positions itself, so the model has no learned position table (wpe)
    layer: type | None = None  # an attention layer replacing the core's (a gpt.model.CausalSelfAttention subclass)
    cache: type | None = None  # its per-layer KV-cache kind (gpt.model.kv_cache.LayerKV's interface); None: k, v
    kernel_options: tuple[str, ...] = ()  # kernel options it needs (gpt.kernels.registry.OPTIONS)
    uses_kernel: bool = True  # False: its layer computes attention itself, so attention=<kernel> changes nothing
    exports: tuple[str, ...] = ("native",)  # export formats that can hold it (EXPORT_FORMATS)
    modeling: str | None = None  # its remote-code export: a self-contained .py file (torch, transformers) defining
    # class Part, hooks of gpt/interop/modeling/core.py (modeling_file(name) for the built-ins); None: none
    preset: dict[str, Any] = {}  # the arena's preset: model overrides beside model.designs=[name] (a kernel, a window)
    view: str = "the softmax weights of each head"  # what the attention pictures show for it
    conflicts: dict[str, str] = {}  # designs it cannot be combined with -> why (either side may say it)
    cases: dict[str, dict[str, Any]] = {}  # settings the contract tests check it in, alone and combined

    # --- how a config turns it on, and how to say so ---------------------------------------------------------------

    def enabled(self, config: GPTConfig) -> bool:
        return self.name in config.designs

    def option(self, config: GPTConfig, key: str) -> Any:
        """Its setting ``key`` in this (kind's) config: model.design_options.<name>.<key>, defaults filled in."""
        return config.design_options[self.name][key]

    def setting(self, config: GPTConfig) -> str:
        """The setting that turns it on, as the user types it: ``model.designs=[qk_norm]``."""
        return f"model.designs=[{self.name}]"

    def off(self, config: GPTConfig) -> str:
        """The setting that turns it off, the config's other designs kept: ``model.designs=[rope]``."""
        return f"model.designs={spell([d for d in config.designs if d != self.name])}"

    def on_preset(self) -> dict[str, Any]:
        """Model overrides that switch it on (the arena's preset of the same name)."""
        return {"designs": [self.name], **self.preset}

    # --- hooks (no-ops unless a design overrides them) -------------------------------------------------------------

    def check(self, config: GPTConfig) -> None:
        """Validate (and resolve derived defaults of) its settings in a config that turns it on (``option``); raise
        ConfigError naming the setting (model.design_options.<name>.<key>)."""

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

    def cached(self, layer: Any, k: Tensor, ctx: Any) -> Tensor:
        """Transform the keys (B, Hkv, Tk, D) a KV cache returned, before the kernel: RoPE turns those an endless
        cache keeps un-rotated at their positions inside it (Context.key_positions)."""
        return k

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


def filled(names: list[str], options: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """design_options with every named (registered) design's defaults filled in, a new dict (nothing shared)."""
    known = _designs()
    return {name: {**known[name].options, **dict(options.get(name) or {})} for name in names
            if name in known and (known[name].options or options.get(name))}


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
    """Add a design; ``model.designs=[name]`` then selects it."""
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


def runtime_designs() -> tuple[str, ...]:
    """Designs whose presence and settings change no weight (a resumed run or a sampling session may change them)."""
    return tuple(d.name for d in _designs().values() if d.runtime)


def kernel_options(config: GPTConfig) -> dict[str, tuple[str, str]]:
    """The kernel options the active designs need: option -> (the setting asking for it, how to turn it off)."""
    return {option: (d.setting(config), d.off(config)) for d in active(config) for option in d.kernel_options}


def check(config: GPTConfig) -> None:
    """The designs' part of GPTConfig's checks: names known (put in hook order), options known (defaults filled in),
    each active design's own checks, and every pair of active designs that cannot be combined (one ConfigError
    naming both settings)."""
    for name in config.designs:
        if name not in _designs():
            raise DesignUnavailable(name)
    config.designs = [name for name in _designs() if name in config.designs]
    _check_options(config)
    on = active(config)
    for design in on:
        design.check(config)
    for i, a in enumerate(on):
        for b in on[i + 1:]:
            why = a.conflicts.get(b.name) or b.conflicts.get(a.name) or _exclusive(a, b)
            if why:
                raise ConfigError(f"model.designs names {a.name} and {b.name}, which cannot be combined: {why}",
                                  hint=f"leave {b.name} or {a.name} out of model.designs")


def _exclusive(a: Design, b: Design) -> str | None:
    """Two designs that each replace the same thing cannot both be on."""
    if a.layer is not None and b.layer is not None:
        return "each replaces the whole attention layer"
    if a.cache is not None and b.cache is not None:
        return "each keeps its own kind of KV cache"
    if a.positional and b.positional:
        return "each encodes the positions its own way"
    return None


def _check_options(config: GPTConfig) -> None:
    """model.design_options: keyed by a design the config turns on, each key one of its options; defaults filled."""
    given = config.design_options
    for name, settings in given.items():
        if name not in config.designs:
            raise ConfigError(f"model.design_options.{name} is given but {name} is not in model.designs"
                              + (f" ({spell(config.designs)})" if config.designs else ""),
                              hint=f"add {name} to model.designs, or drop its options")
        if not isinstance(settings, dict):
            raise ConfigError(f"model.design_options.{name} must map {name}'s settings to values, got {settings!r}",
                              hint=f"e.g. model.design_options.{name}.<setting>=<value>")
        unknown = sorted(set(settings) - set(get(name).options))
        if unknown:
            raise ConfigError(f"model.design_options.{name}.{unknown[0]} is not a setting of design {name}",
                              hint=f"its settings: {', '.join(get(name).options) or 'none'}")
    config.design_options = filled(config.designs, given)


class DesignUnavailable(ConfigError):
    """A config (or a checkpoint's) names a design this process has not loaded: say how to bring it."""

    def __init__(self, name: str) -> None:
        super().__init__(f"attention design {name!r} is not available (known: {', '.join(available())})",
                         hint=f"make the module that registers {name} available: designs=[path/to/its_file.py] "
                              "on the command line, or GPT_DESIGNS=path/to/its_file.py in the environment")
        self.design = name

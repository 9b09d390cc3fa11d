"""A layout per layer: ``model.layers`` names each layer's kind, ``model.layer_kinds`` says what a kind is.

    model.layers=SSSSSL                      a pattern of one-letter kinds, tiled over n_layer (its length divides it)
    model.layers=[local,local,global]        or one kind name per layer
    model.layer_kinds={S: {window: 512, designs: [rope]}, L: {designs: [rope], options: {rope: {base: 1000000}}}}

A kind holds the per-layer settings: ``window`` (absent: model.window; null: every earlier key), ``designs`` (registry
names, built-in or brought: e.g. [rope], [qk_norm, softcap], [my_design]) and ``options``, keyed by design as
model.design_options is (e.g. {rope: {base: 1000000}}, {softcap: {cap: 30}}). The designs the model itself names
(model.designs) apply to every layer, with their model.design_options; a kind adds its own designs, and its options
override the model's for its layers. Each kind becomes a GPTConfig of its own (``kind_config``), checked as a
uniform model is, which every layer of that kind is built from: transformers' Gemma 3 and Qwen3-Next ``layer_types``
and nanochat's window pattern say the same per layer.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gpt.errors import ConfigError
from gpt.model import design as designs

GPTConfig = Any  # gpt.model.config.GPTConfig, which imports this module
MAX_LAYERS = 1 << 16
KIND_KEYS = ("window", "designs", "options")
EXAMPLE = "model.layers=SSSSSL 'model.layer_kinds={S: {window: 512}, L: {window: null}}'"


def layer_kinds(config: GPTConfig) -> list[str]:
    """The kind of each layer (n_layer names) from model.layers: a pattern tiled over the depth, or a list."""
    layers, kinds, n = config.layers, config.layer_kinds, config.n_layer
    if n > MAX_LAYERS:  # a file's hostile n_layer would otherwise become a list of that length
        raise ConfigError(f"model.n_layer={n:,} is more layers than a layout may have ({MAX_LAYERS:,})",
                          hint="use fewer layers")
    if not isinstance(kinds, dict) or not kinds:
        raise ConfigError(f"model.layers={designs.spell(layers)} needs model.layer_kinds, the legend of its kinds",
                          hint=f"e.g. {EXAMPLE}")
    if isinstance(layers, str):
        if not layers or n % len(layers):
            raise ConfigError(f"model.layers={layers} has {len(layers)} letters, which does not divide "
                              f"model.n_layer={n}", hint=f"give a pattern whose length divides {n} "
                              f"(e.g. {layers[:1] or 'L'} * a divisor), or one kind per layer")
        names = list(layers * (n // len(layers)))
    elif isinstance(layers, (list, tuple)) and all(isinstance(k, str) for k in layers):
        if len(layers) != n:
            raise ConfigError(f"model.layers lists {len(layers)} kinds but model.n_layer={n}",
                              hint=f"list one kind per layer ({n}), or give a pattern string tiled over them")
        names = list(layers)
    else:
        raise ConfigError(f"model.layers must be a pattern of kind letters or a list of kind names, got {layers!r}",
                          hint=f"e.g. {EXAMPLE}")
    unknown = sorted(set(names) - set(kinds))
    if unknown:
        raise ConfigError(f"model.layers names kind {unknown[0]!r}, which model.layer_kinds does not define "
                          f"(defined: {', '.join(map(str, kinds))})",
                          hint=f"add model.layer_kinds.{unknown[0]}={{...}}, or use a defined kind")
    return names


def kind_config(config: GPTConfig, name: str) -> GPTConfig:
    """The GPTConfig every layer of kind ``name`` is built from: the model's, with the kind's window, designs and
    options; checked as a uniform model is (designs, conflicts, the kernel), errors naming the kind."""
    where = f"model.layer_kinds.{name}"
    kind = config.layer_kinds[name]
    if not isinstance(kind, dict) or set(kind) - set(KIND_KEYS):
        extra = sorted(set(kind) - set(KIND_KEYS)) if isinstance(kind, dict) else []
        raise ConfigError(f"{where} must be a mapping of {', '.join(KIND_KEYS)}"
                          + (f"; {extra[0]!r} is none of them" if extra else f", got {kind!r}"),
                          hint="e.g. {window: 512, designs: [rope], options: {rope: {base: 10000}}}")
    changes: dict[str, Any] = {"layers": None, "layer_kinds": None}
    if "window" in kind:
        window = kind["window"]
        if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window <= 0):
            raise ConfigError(f"{where}.window must be a positive integer or null (every earlier key), got {window!r}",
                              hint=f"e.g. {where}.window=512")
        changes["window"] = window
    _designs_of(config, kind, where, changes)
    try:
        view = replace(config, **changes)
    except ConfigError as err:
        kind_designs, problem = designs.spell(kind.get("designs") or []), str(err)
        for name in kind.get("options") or {}:  # a setting the kind gave, as the kind spells it
            problem = problem.replace(f"model.design_options.{name}.", f"{where}.options.{name}.")
        raise ConfigError(f"{where} (designs {kind_designs}): {problem}", hint=err.hint) from None
    view.kind = name
    return view


def _designs_of(config: GPTConfig, kind: dict, where: str, changes: dict[str, Any]) -> None:
    """Put in ``changes`` the kind's designs (the model's and its own) and their settings (the model's, with the
    kind's own over them: model.layer_kinds.<kind>.options.<design>.<key>)."""
    names, options = kind.get("designs") or [], kind.get("options") or {}
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ConfigError(f"{where}.designs must be a list of design names, got {names!r}",
                          hint=f"e.g. {where}.designs=[rope]")
    if not isinstance(options, dict) or not all(isinstance(v, dict) for v in options.values()):
        raise ConfigError(f"{where}.options must map a design to its settings, got {options!r}",
                          hint=f"e.g. {where}.options={{rope: {{base: 1000000}}}}")
    for name in names:
        if name not in designs.available():
            raise designs.DesignUnavailable(name)
    merged = {name: dict(settings) for name, settings in config.design_options.items()}
    for name, settings in options.items():
        if name not in names and name not in config.designs:
            raise ConfigError(f"{where}.options.{name} is given but {name} is not among {where}.designs",
                              hint=f"add {name} to {where}.designs, or drop its options")
        design = designs.get(name)
        for key, value in settings.items():
            if key not in design.options:
                raise ConfigError(f"{where}.options.{name}.{key} is not a setting of design {name}",
                                  hint=f"its settings: {', '.join(design.options) or 'none'}")
            merged.setdefault(name, {})[key] = value
    changes["designs"] = [*config.designs, *names]
    changes["design_options"] = merged

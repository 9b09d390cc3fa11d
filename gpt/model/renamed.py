"""The designs' settings before they were named one way: the flat GPTConfig fields that switched the built-in designs
on (``pos_embedding``, ``qk_norm``, ``attn_softcap``, ...), now ``model.designs`` and ``model.design_options``.

``upgrade`` is the one reader that maps a config written before (a checkpoint's model_config, an export's config.json,
a layout's kinds) to today's form, so an old file loads into the very same model; ``command_line_error`` tells a user
who types an old spelling the new one. Nothing else in the project knows the old names.
"""

from __future__ import annotations

import copy
from typing import Any

import yaml

from gpt.errors import ConfigError

# old flat field -> (the design it turns on, its setting there or None: a switch), its type, the value meaning "off"
FIELDS: dict[str, tuple[str | None, str | None, tuple[type, ...], Any]] = {
    "pos_embedding": (None, None, (str,), "learned"),  # its value names the design: rope | alibi
    "qk_norm": ("qk_norm", None, (bool,), False),
    "attn_softcap": ("softcap", "cap", (int, float, type(None)), None),
    "attn_sink": ("sink", None, (bool,), False),
    "diff_attn": ("diff", None, (bool,), False),
    "linear_attn": ("linear", "feature", (str, type(None)), None),
    "mla_latent": ("mla", "latent", (int, type(None)), None),
    "mla_rope_dim": ("mla", "rope_dim", (int, type(None)), None),
    "sink_tokens": ("stream", "sinks", (int,), 0),
    "rope_scaling": ("rope", "scaling", (dict, type(None)), None),
}
POSITIONS = ("rope", "alibi")  # pos_embedding's values that name a design
OPTIONS = {"deltanet": {"delta_chunk": "chunk", "delta_conv": "conv"}}  # a design's settings renamed with it
# a layer kind's options were keyed by the old field names too: {softcap: {attn_softcap: 30}}
KIND_OPTIONS = {design: {old: new} for old, (design, new, _, _) in FIELDS.items() if design and new}
for _design, _keys in OPTIONS.items():
    KIND_OPTIONS.setdefault(_design, {}).update(_keys)
DOCS = "docs/designs.md, Renamed settings"


def upgrade(values: dict[str, Any]) -> dict[str, Any]:
    """A model config's values (a dict read from a file) in today's form: the old flat fields folded into
    ``designs`` and ``design_options``, a flat design_options keyed by design, a layout's kinds' options renamed.
    Today's form comes back unchanged (a copy); a value of the wrong type is a ConfigError naming the old field."""
    if not isinstance(values, dict):
        return values
    values = copy.deepcopy(values)
    names = values.get("designs", [])
    names = list(names) if isinstance(names, list) else names
    options = values.get("design_options", {})
    if isinstance(names, list) and isinstance(options, dict) and _flat(options, names):
        options = _keyed(options, names)
    old = {key: values.pop(key) for key in list(values) if key in FIELDS}
    if isinstance(names, list) and isinstance(options, dict):
        for key, value in old.items():
            _fold(key, value, old, names, options)
        values["designs"] = names
        if options or "design_options" in values:
            values["design_options"] = options
    elif old:
        values.update(old)  # leave them: the type check of designs and design_options refuses the file
    kinds = values.get("layer_kinds")
    if isinstance(kinds, dict):
        values["layer_kinds"] = {name: _kind(kind) for name, kind in kinds.items()}
    return values


def _flat(options: dict[str, Any], names: list[Any]) -> bool:
    """Whether design_options is the old flat mapping (setting -> value) rather than keyed by design."""
    return any(key not in names or not isinstance(value, dict) for key, value in options.items())


def _keyed(options: dict[str, Any], names: list[Any]) -> dict[str, Any]:
    """An old flat design_options keyed by the design each setting belongs to (the first in ``names`` declaring it);
    a setting of a design this process has not loaded stays flat, for the designs' check to refuse by name."""
    from gpt.model import design as designs

    keyed: dict[str, Any] = {}
    for key, value in options.items():
        owner = next((n for n in names if isinstance(n, str) and n in designs.available()
                      and OPTIONS.get(n, {}).get(key, key) in designs.get(n).options), None)
        if owner is None:
            keyed[key] = value
        else:
            keyed.setdefault(owner, {})[OPTIONS.get(owner, {}).get(key, key)] = value
    return keyed


def _fold(key: str, value: Any, old: dict[str, Any], names: list[Any], options: dict[str, Any]) -> None:
    """Turn on the design an old field's value turns on, and keep its setting in ``options``."""
    design, setting, types, off = FIELDS[key]
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        names = {bool: "true or false", int: "an integer", float: "a number", str: "a name", dict: "a mapping",
                 type(None): "null"}
        raise ConfigError(f"model.{key} (an old setting: today the {design or 'rope or alibi'} design in "
                          f"model.designs) must be {' or '.join(dict.fromkeys(names[t] for t in types))}, "
                          f"got {value!r}")
    if key == "pos_embedding":
        if value != off and value not in POSITIONS:
            raise ConfigError(f"model.pos_embedding must be one of learned, {', '.join(POSITIONS)}, got {value!r}")
        design = value if value in POSITIONS else None
    elif key == "mla_rope_dim":
        design = "mla" if old.get("mla_latent") is not None else None
    if design is None or (value == off and key != "mla_rope_dim"):
        return
    if design not in names:
        names.append(design)
    if setting is not None:
        options.setdefault(design, {})[setting] = value


def _kind(kind: Any) -> Any:
    """A layout kind with its options' old setting names (KIND_OPTIONS) renamed."""
    if not isinstance(kind, dict) or not isinstance(kind.get("options"), dict):
        return kind
    options = {}
    for design, settings in kind["options"].items():
        renames = KIND_OPTIONS.get(design, {})
        options[design] = ({renames.get(k, k): v for k, v in settings.items()} if isinstance(settings, dict)
                           else settings)
    return {**kind, "options": options}


def spelling(key: str, value: Any) -> str:
    """What to type today for an old field's setting ``model.<key>=<value>``: "write ..." or "leave ... out"."""
    design, setting, _, off = FIELDS[key]
    if key == "pos_embedding":
        if value in POSITIONS:
            return f"write model.designs=[{value}]"
        return "leave rope and alibi out of model.designs (learned positions are the default)"
    shown = yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=1 << 20)
    shown = shown.strip().removesuffix("...").strip()
    if value == off:
        return f"leave {design} out of model.designs (off is the default)"
    if setting is None:
        return f"write model.designs=[{design}]"
    return f"write model.designs=[{design}] model.design_options.{design}.{setting}={shown}"


def command_line_error(override: str) -> ConfigError | None:
    """A ConfigError giving the new spelling when a command-line override sets an old field (``model.qk_norm=true``,
    ``+model.rope_scaling.factor=4``); None for any other override."""
    key, sep, text = override.lstrip("+~").partition("=")
    parts = key.split(".")
    if len(parts) < 2 or parts[0] != "model" or parts[1] not in FIELDS:
        return None
    field = parts[1]
    try:
        value = yaml.safe_load(text) if sep else None
    except yaml.YAMLError:
        value = text
    if len(parts) > 2 or not isinstance(value, FIELDS[field][2]):  # a nested key, or a value the field never took
        design, setting = FIELDS[field][:2]
        new = (f"write model.design_options.{design}.{setting}{'.' + '.'.join(parts[2:]) if len(parts) > 2 else ''}"
               if setting else f"write model.designs=[{design or 'rope'}]")
    else:
        new = spelling(field, value)
    return ConfigError(f"model.{field} is no longer a setting: {new}",
                       hint=f"every design is named in model.designs, its settings in model.design_options.<design> "
                            f"({DOCS})")

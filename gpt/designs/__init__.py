"""Attention designs, one module each, registered in gpt.model.design's registry: ``register(MyDesign())``,
``get(name)``, ``available()``, ``active(config)``.

Built in: qk_norm, rope, alibi, softcap, sink, diff, linear, mla, stream, gated, deltanet. Each is a ``Design``
(gpt.model.design): its name in model.designs, its options (model.design_options.<name>) and their checks, its parts
or its own attention layer, its cache kind, memory terms, export support, arena preset and picture; its float64
reference builds on gpt.designs.reference. Each registers itself when imported here, and the package gpt imports
this module first thing. Bring your own with
``designs=[my_design.py]`` or GPT_DESIGNS (gpt.designs.loading); docs/designs.md walks through one.
"""

from gpt.designs import (  # noqa: F401  (each registers its design; hooks run in BUILTIN's order)
    alibi,
    deltanet,
    diff,
    gated,
    linear,
    loading,
    mla,
    qk_norm,
    reference,
    rope,
    sink,
    softcap,
    stream,
)
from gpt.model.design import (
    BUILTIN,
    Design,
    DesignUnavailable,
    active,
    available,
    cache_kind,
    get,
    layer_class,
    on_first_read,
    register,
    unregister,
)

on_first_read(loading.load_environment)  # what GPT_DESIGNS names, when the registry is first read

__all__ = ["BUILTIN", "Design", "DesignUnavailable", "active", "available", "cache_kind", "get", "layer_class",
           "reference", "register", "unregister"]

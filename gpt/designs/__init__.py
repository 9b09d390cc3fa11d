"""Attention designs behind one registry: ``register(MyDesign())``, ``get(name)``, ``available()``, ``active(config)``.

Built in, one module each: qk_norm, rope, alibi, softcap, sink, diff, linear, mla, stream. Each is a ``Design``
(gpt.model.design): its config fields and their checks, its parts or its own attention layer, its cache kind,
memory terms, export support, arena preset and picture. Bring your own with ``designs=[my_design.py]`` or
GPT_DESIGNS (gpt.designs.loading); docs/designs.md walks through one.
"""

from gpt.model.design import (
    Design,
    DesignUnavailable,
    active,
    available,
    cache_kind,
    get,
    layer_class,
    register,
    unregister,
)

__all__ = ["Design", "DesignUnavailable", "active", "available", "cache_kind", "get", "layer_class", "register",
           "unregister"]

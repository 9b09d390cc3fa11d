"""Context extension from weights (``init_from=<run> model.block_size=<longer>
model.design_options.rope.scaling=...``): the
weights' architecture with a longer context and the RoPE scaling the command names, for a short fine-tune on
longer windows (docs/training.md, "Extending the context").

Only these two fields may differ from the weights' config: everything else is still the weights' (build.model_config).
A longer context needs positions that reach it: RoPE (scaled or not) and ALiBi do, GPT-2's learned table does not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from gpt.errors import ConfigError
from gpt.model import design as designs
from gpt.model.config import GPTConfig


def scaling_of(config: GPTConfig) -> dict | None:
    """The model-wide RoPE scaling of a config (model.design_options.rope.scaling); None without RoPE or scaling."""
    return config.design_options.get("rope", {}).get("scaling") if "rope" in config.designs else None


def extended(init: GPTConfig, asked: GPTConfig, source: str, log: Callable[[str], None]) -> GPTConfig:
    """``init`` (the weights' config) with ``asked``'s block_size where it is longer and ``asked``'s RoPE scaling
    where one is set; unchanged otherwise. A ConfigError names what cannot be extended and how to fix it."""
    longer = asked.block_size > init.block_size
    scaling = scaling_of(asked)
    if not longer and scaling is None:
        return init
    if longer and not any(map(designs.positional, init.kinds().values())):  # GPT.wpe: a table of block_size rows
        raise ConfigError(f"init_from={source} has learned positions (no rope or alibi in its model.designs) for "
                          f"{init.block_size} tokens; they cannot be extended to model.block_size={asked.block_size}",
                          hint=f"fine-tune at model.block_size<={init.block_size}, or extend a RoPE or ALiBi model")
    if scaling is not None:
        if "rope" not in init.designs:
            raise ConfigError(f"model.design_options.rope.scaling is set but init_from={source} has no RoPE (its "
                              f"model.designs={designs.spell(init.designs)}): scaling applies to rotary positions only",
                              hint="drop the scaling, or extend a model trained with model.designs=[rope]")
        trained = scaling_of(init)["original_max_position_embeddings"] if scaling_of(init) else init.block_size
        original = scaling["original_max_position_embeddings"]
        if original > init.block_size:
            raise ConfigError(f"model.design_options.rope.scaling.original_max_position_embeddings={original} is "
                              f"longer than the {init.block_size} tokens init_from={source} was trained at",
                              hint=f"original_max_position_embeddings: {trained}")
    block_size = max(init.block_size, asked.block_size)
    options = init.design_options
    if scaling is not None:
        options = {**options, "rope": {**options.get("rope", {}), "scaling": scaling}}
    config = replace(init, block_size=block_size, design_options=options)
    now = scaling_of(config)
    how = f", {now['rope_type']} scaling x{now['factor']:g}" if now else ", no scaling"
    log(f"extending the context of init_from={source} from {init.block_size} to {block_size} tokens{how}")
    return config

"""Context extension from weights (``init_from=<run> model.block_size=<longer> model.rope_scaling=...``): the
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


def extended(init: GPTConfig, asked: GPTConfig, source: str, log: Callable[[str], None]) -> GPTConfig:
    """``init`` (the weights' config) with ``asked``'s block_size where it is longer and ``asked``'s rope_scaling
    where one is set; unchanged otherwise. A ConfigError names what cannot be extended and how to fix it."""
    longer = asked.block_size > init.block_size
    scaling = asked.rope_scaling
    if not longer and scaling is None:
        return init
    if longer and not any(map(designs.positional, init.kinds().values())):  # GPT.wpe: a table of block_size rows
        raise ConfigError(f"init_from={source} has learned positions (model.pos_embedding=learned) for "
                          f"{init.block_size} tokens; they cannot be extended to model.block_size={asked.block_size}",
                          hint=f"fine-tune at model.block_size<={init.block_size}, or extend a RoPE or ALiBi model")
    if scaling is not None:
        if init.pos_embedding != "rope":
            raise ConfigError(f"model.rope_scaling is set but init_from={source} has no RoPE (its "
                              f"model.pos_embedding={init.pos_embedding}): scaling applies to rotary positions only",
                              hint="drop model.rope_scaling, or extend a model trained with model.pos_embedding=rope")
        trained = init.rope_scaling["original_max_position_embeddings"] if init.rope_scaling else init.block_size
        original = scaling["original_max_position_embeddings"]
        if original > init.block_size:
            raise ConfigError(f"model.rope_scaling.original_max_position_embeddings={original} is longer than the "
                              f"{init.block_size} tokens init_from={source} was trained at",
                              hint=f"original_max_position_embeddings: {trained}")
    block_size = max(init.block_size, asked.block_size)
    config = replace(init, block_size=block_size, rope_scaling=scaling if scaling is not None else init.rope_scaling)
    how = f", {config.rope_scaling['rope_type']} scaling x{config.rope_scaling['factor']:g}" if config.rope_scaling \
        else ", no scaling"
    log(f"extending the context of init_from={source} from {init.block_size} to {block_size} tokens{how}")
    return config

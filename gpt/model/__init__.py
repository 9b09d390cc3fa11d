"""The model: GPT-2 with the seams the attention designs use (gpt.model.gpt), its config (GPTConfig, validated on
construction), the KV cache, the design protocol and registry (gpt.model.design), the MLP's activations and the
analytic FLOPs. ``from gpt.model import GPT, GPTConfig`` is the way in.

The built-in designs (gpt.designs) build on this folder and register themselves in its registry; the package gpt
imports them first thing, so any import of gpt has them registered before a config is read.
"""

from gpt.model.config import GPTConfig
from gpt.model.gpt import GPT, MLP, Block, CausalSelfAttention, Context

__all__ = ["GPT", "MLP", "Block", "CausalSelfAttention", "Context", "GPTConfig"]

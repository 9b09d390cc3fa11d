"""Interpretability: what each head does. Hook points by TransformerLens' names on every design (gpt.interpret.hooks),
an activation cache with patterns recomputed through each design's own score path (gpt.interpret.cache,
gpt.interpret.patterns), and analyses: head roles, logit lens, direct logit attribution, activation patching, head
ablation (gpt.interpret.analyses). scripts/interpret.py runs them on a checkpoint; docs/interpret.md walks through.
"""

from gpt.interpret.cache import ActivationCache, run_with_cache
from gpt.interpret.hooks import ablate_heads, hook_points, hooks, resolve

__all__ = ["ActivationCache", "ablate_heads", "hook_points", "hooks", "resolve", "run_with_cache"]

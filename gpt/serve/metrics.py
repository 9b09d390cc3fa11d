"""/metrics in Prometheus' text exposition format (version 0.0.4): each engine's queue, slots and throughput.

One family per line group (# HELP, # TYPE, then one sample per model, labelled model="<id>"); counters end in
_total. Reading them takes no lock on the decoding loop beyond the engine's own condition.
"""

from __future__ import annotations

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

FAMILIES = [  # (name, type, help, the key of Engine.metrics())
    ("gpt_serve_waiting_sequences", "gauge", "Sequences waiting for a cache slot.", "waiting"),
    ("gpt_serve_running_sequences", "gauge", "Sequences being decoded.", "running"),
    ("gpt_serve_slots_used", "gauge", "Cache slots in use.", "slots_used"),
    ("gpt_serve_slots", "gauge", "Cache slots in the pool (max_batch).", "slots"),
    ("gpt_serve_tokens_per_second", "gauge", "Tokens sampled per second over the last 10 seconds.",
     "tokens_per_s"),
    ("gpt_serve_generated_tokens_total", "counter", "Tokens sampled.", "tokens"),
    ("gpt_serve_prompt_tokens_total", "counter", "Prompt tokens prefilled.", "prompt_tokens"),
    ("gpt_serve_model_calls_total", "counter", "Model calls (prefills and decode steps).", "steps"),
    ("gpt_serve_refused_sequences_total", "counter", "Sequences refused because the queue was full.", "refused"),
    ("gpt_serve_prefix_cache_hit_rate", "gauge", "Prompt tokens found in the prefix cache, of those looked up.",
     "prefix_hit_rate"),
    ("gpt_serve_prefix_cache_reused_tokens_total", "counter", "Prompt tokens not prefilled: found in the prefix cache.",
     "prefix_reused_tokens"),
    ("gpt_serve_prefix_cache_blocks", "gauge", "Blocks the prefix cache holds.", "prefix_blocks"),
    ("gpt_serve_speculated_tokens_total", "counter", "Prompt-lookup guesses verified.", "speculated"),
    ("gpt_serve_speculation_accepted_tokens_total", "counter", "Prompt-lookup guesses kept.", "speculation_accepted"),
    ("gpt_serve_speculation_acceptance_rate", "gauge", "Guesses kept over guesses verified.", "acceptance_rate"),
]


def label(value: str) -> str:
    """A label value with backslash, double quote and newline escaped, as the format requires."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render(engines: dict[str, dict[str, float]]) -> str:
    """The exposition text of every model's engine metrics (Engine.metrics()), by model id."""
    lines = []
    for name, kind, about, key in FAMILIES:
        lines += [f"# HELP {name} {about}", f"# TYPE {name} {kind}"]
        lines += [f'{name}{{model="{label(model)}"}} {values[key]:g}' for model, values in engines.items()]
    return "\n".join(lines) + "\n"

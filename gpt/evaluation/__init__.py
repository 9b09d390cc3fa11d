"""Judging a model in the field's standard terms: full held-out passes (loss, perplexity, bits per byte)."""

"""Judging a model in the field's standard terms: full held-out passes (heldout: loss, perplexity, bits per byte),
HellaSwag as lm-evaluation-harness scores it (hellaswag, on loglik's batched log-likelihoods), the lm-eval model
gpt-attention (lm_eval_model, optional extra [eval]), and scripts/eval.py's body (config, inputs, run)."""

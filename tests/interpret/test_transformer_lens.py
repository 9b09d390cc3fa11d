"""Where the transformer-lens package is installed: it loads this project's GPT-2-layout export, and its
run_with_cache activations equal this project's hooks of the same names within 1e-4 for the same prompt. Skipped
without the package (it is not a dependency)."""

from __future__ import annotations

from importlib.metadata import version

import pytest
import torch

from conftest import perturbed_model
from gpt.interpret import run_with_cache

transformer_lens = pytest.importorskip("transformer_lens")
BRIDGE = int(version("transformer-lens").split(".")[0]) >= 4  # 4 removed HookedTransformer for TransformerBridge

NAMES = ["hook_embed", "blocks.0.hook_resid_pre", "blocks.0.attn.hook_q", "blocks.0.attn.hook_k",
         "blocks.0.attn.hook_v", "blocks.1.attn.hook_attn_scores", "blocks.1.attn.hook_pattern",
         "blocks.1.attn.hook_z", "blocks.1.hook_attn_out", "blocks.1.hook_resid_mid", "blocks.1.hook_mlp_out",
         "blocks.1.hook_resid_post", "ln_final.hook_normalized"]


def hooked_transformer(folder, config):
    """TransformerLens' model of an hf export, with no weight processing (folded norms would change activations):
    a HookedTransformer before TransformerLens 4, the TransformerBridge (eager attention, compatibility hook names)
    from 4 on, where HookedTransformer is gone."""
    from transformers import GPT2LMHeadModel

    if BRIDGE:
        from transformer_lens.model_bridge import TransformerBridge

        hf = GPT2LMHeadModel.from_pretrained(folder, attn_implementation="eager")
        bridge = TransformerBridge.boot_transformers(str(folder), hf_model=hf)
        bridge.enable_compatibility_mode(no_processing=True)
        return bridge.eval()
    try:
        from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights
    except ImportError:  # older releases
        from transformer_lens.loading_from_pretrained import convert_gpt2_weights
    cfg = transformer_lens.HookedTransformerConfig(
        n_layers=config.n_layer, d_model=config.n_embd, n_heads=config.n_head, d_head=config.head_dim,
        d_mlp=4 * config.n_embd, d_vocab=config.vocab_size, n_ctx=config.block_size, act_fn="gelu_new",
        normalization_type="LN", default_prepend_bos=False)
    model = transformer_lens.HookedTransformer(cfg)
    weights = convert_gpt2_weights(GPT2LMHeadModel.from_pretrained(folder), cfg)
    model.load_and_process_state_dict(weights, fold_ln=False, center_writing_weights=False, center_unembed=False,
                                      fold_value_biases=False, refactor_factored_attn_matrices=False)
    return model.eval()


def final_norm_output(their_cache, ours):
    """``ln_final.hook_normalized`` as the head reads it: HookedTransformer's LayerNorm records its output (gain and
    bias applied), as ours does; TransformerLens 4's bridge records the normalised input before them, so apply ours."""
    normalized = their_cache["ln_final.hook_normalized"]
    if not BRIDGE:
        return normalized
    ln_f = ours.transformer.ln_f
    return normalized * ln_f.weight + (ln_f.bias if ln_f.bias is not None else 0)


def test_transformer_lens_sees_the_same_activations(tmp_path):
    from gpt.interop.formats import export
    from gpt.tokenizers.tokenizer import CharTokenizer

    ours = perturbed_model(dict(n_layer=2, n_head=4, n_embd=32, block_size=16, vocab_size=50), "sdpa")
    tokenizer = CharTokenizer([chr(97 + i) for i in range(50)]).to_meta()
    export(ours.state_dict(), ours.config, tokenizer, tmp_path / "hf", format="hf")
    theirs = hooked_transformer(tmp_path / "hf", ours.config)
    tokens = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(0))
    logits, cache = run_with_cache(ours, tokens, NAMES)
    with torch.no_grad():
        their_logits, their_cache = theirs.run_with_cache(tokens, names_filter=NAMES)
    torch.testing.assert_close(their_logits, logits, atol=1e-4, rtol=1e-4)
    for name in NAMES:
        theirs_at = final_norm_output(their_cache, ours) if name == "ln_final.hook_normalized" else their_cache[name]
        torch.testing.assert_close(theirs_at, cache[name], atol=1e-4, rtol=1e-4, msg=name)

"""Gated DeltaNet as a layer (gpt/designs/deltanet.py): its chunked form (training, prefill) and its recurrent step
(decoding) give the same outputs within 1e-5 in float32, with a state whose size never grows; the pictures reproduce
the layer; it equals transformers' Qwen3-Next Gated DeltaNet layer given the same weights (the outside oracle); and
what it cannot take is refused in one line naming the setting."""

import pytest
import torch

from conftest import perturbed_model, run_inline
from gpt import GPTConfig
from gpt.designs import delta_rule
from gpt.errors import ConfigError
from gpt.model.kv_cache import KVCache

TINY = dict(n_layer=2, n_head=4, n_embd=32, block_size=64, vocab_size=50, designs=["deltanet"])


@pytest.mark.parametrize("options", [{}, {"chunk": 8}, {"chunk": 4, "conv": 1}])
def test_the_chunked_prefill_and_the_recurrent_steps_agree_and_the_state_keeps_its_size(options):
    model = perturbed_model(TINY | dict(n_kv_head=2, design_options={"deltanet": options}), sharpen=2.0)
    seq = torch.randint(0, 50, (2, 50), generator=torch.Generator().manual_seed(1))
    cache = KVCache(model.config, batch_size=2, device="cpu")
    with torch.no_grad():
        full = model(seq)[0]  # chunked over all 50 tokens
        steps = [model(seq[:, :9], cache=cache)[0]]  # chunked prefill, then one recurrent step per token
        held = sum(layer.held_bytes() for layer in cache.layers)
        steps += [model(seq[:, t:t + 1], cache=cache)[0] for t in range(9, 50)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=0)
    assert sum(layer.held_bytes() for layer in cache.layers) == held  # 9 tokens or 50: the same bytes
    state = cache.layers[0].state
    assert state.shape == (2, 4, 8, 8) and state.dtype == torch.float32  # (B, H, Dk, Dv)
    conv = options.get("conv", 4) - 1
    assert cache.layers[0].conv.shape == (2, 2 * 2 * 8 + 32, conv)  # the convolution's last K-1 inputs


def test_the_picture_is_the_weight_each_value_gets():
    """o = M v with the weights delta_rule.weights gives, for the layer's own q, k, v and gates."""
    g = torch.Generator().manual_seed(2)
    q, k = torch.randn(1, 2, 9, 8, generator=g), torch.randn(1, 2, 9, 8, generator=g)
    v = torch.randn(1, 4, 9, 8, generator=g)
    decay, beta = -torch.rand(1, 4, 9, generator=g) * 3, torch.rand(1, 4, 9, generator=g)
    M = delta_rule.weights(q, k, decay, beta)
    assert M.shape == (1, 4, 9, 9) and torch.all(M.triu(1) == 0)
    torch.testing.assert_close(M @ v, delta_rule.chunked(q, k, v, decay, beta, chunk=4)[0], atol=1e-5, rtol=0)


def qwen3_next_layer(attn, config):
    """transformers' Qwen3NextGatedDeltaNet holding this layer's weights: its in_proj_qkvz and in_proj_ba interleave
    q, k, v, z and b, a per key head (fix_query_key_value_ordering); the rest maps one to one."""
    qwen = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next",
                               reason="transformers with Qwen3-Next is not installed: no outside oracle")
    from transformers import Qwen3NextConfig

    H, Hk, D, C = config.n_head, config.n_kv_head, config.head_dim, config.n_embd
    theirs = qwen.Qwen3NextGatedDeltaNet(Qwen3NextConfig(
        hidden_size=C, linear_num_value_heads=H, linear_num_key_heads=Hk, linear_key_head_dim=D,
        linear_value_head_dim=D, linear_conv_kernel_dim=config.design_options["deltanet"]["conv"], rms_norm_eps=1e-6,
        hidden_act="silu", num_hidden_layers=1, layer_types=["linear_attention"]), layer_idx=0)
    q, k, v = attn.c_attn.weight.split([Hk * D, Hk * D, H * D])
    group = H // Hk
    qkvz, ba = [], []
    for j in range(Hk):
        heads = slice(j * group * D, (j + 1) * group * D)
        qkvz += [q[j * D:(j + 1) * D], k[j * D:(j + 1) * D], v[heads], attn.c_gate.weight[heads]]
        ba += [attn.c_beta.weight[j * group:(j + 1) * group], attn.c_decay.weight[j * group:(j + 1) * group]]
    with torch.no_grad():
        theirs.in_proj_qkvz.weight.copy_(torch.cat(qkvz))
        theirs.in_proj_ba.weight.copy_(torch.cat(ba))
        theirs.conv1d.weight.copy_(attn.conv.weight)
        for mine, their in ((attn.A_log, theirs.A_log), (attn.dt_bias, theirs.dt_bias),
                            (attn.o_norm.weight, theirs.norm.weight), (attn.c_proj.weight, theirs.out_proj.weight)):
            their.copy_(mine)
    return theirs.eval()


@pytest.mark.parametrize("n_kv_head", [4, 2])
def test_the_layer_equals_transformers_qwen3_next_gated_deltanet(n_kv_head):
    model = perturbed_model(TINY | dict(n_kv_head=n_kv_head, bias=False), sharpen=2.0)
    attn = model.transformer.h[1].attn
    theirs = qwen3_next_layer(attn, model.config)
    x = torch.randn(2, 40, 32, generator=torch.Generator().manual_seed(4))
    ctx = model.contexts(torch.zeros(2, 40, dtype=torch.long), None, None, None)[None]
    with torch.no_grad():
        mine, expected = attn(x, ctx), theirs(x)
    assert expected.abs().max() > 0.1  # the comparison means something
    torch.testing.assert_close(mine, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("settings, message", [
    ({"design_options": {"deltanet": {"chunk": 48}}}, "model.design_options.deltanet.chunk must be a positive power "
                                                      "of two"),
    ({"design_options": {"deltanet": {"conv": 0}}}, "model.design_options.deltanet.conv must be an integer from 1"),
    ({"window": 8}, "cannot be combined with model.window=8"),
    ({"designs": ["deltanet", "rope"]}, "model.designs names rope and deltanet, which cannot be combined"),
    ({"designs": ["deltanet", "gated"]}, "names gated and deltanet, which cannot be combined: .*own output gate"),
])
def test_what_it_cannot_take_is_refused_naming_the_setting(settings, message):
    with pytest.raises(ConfigError, match=message):
        GPTConfig(**{**TINY, **settings})


def test_a_bad_chunk_on_the_command_line_is_one_error_line(tmp_path):
    result = run_inline("train", "model=tiny", "model.designs=[deltanet]", "model.design_options.deltanet.chunk=48",
                        f"out_dir={tmp_path / 'run'}")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith("error: model.design_options.deltanet.chunk must be"), lines
    assert lines[1:] == ["hint: model.design_options.deltanet.chunk=64"] and "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_the_built_in_designs_commands_of_the_docs_run_as_written(tmp_path, data_args):
    """docs/designs.md's "bash built-in" block: each train command (on the test corpus, fewer steps) and the
    generation from its run, each in a fork of the test (what they write is the point, not their processes)."""
    import re
    import shlex

    from conftest import ROOT, run_forked

    text = (ROOT / "docs" / "designs.md").read_text()
    lines = re.search(r"^```bash built-in\n(.*?)^```$", text, flags=re.S | re.M).group(1).strip().splitlines()
    assert [line.split()[1] for line in lines] == ["scripts/train.py", "scripts/train.py", "scripts/generate.py"]
    for line in lines:
        script, *args = shlex.split(line)[1:]
        name = script.removeprefix("scripts/").removesuffix(".py")
        extra = ["device=cpu", *(["train.max_iters=4", "train.eval_iters=1", "train.batch_size=4", *data_args]
                                 if name == "train" else [])]
        result = run_forked(name, *args, *extra, cwd=tmp_path, timeout=600)
        assert result.returncode == 0, f"{line}\n{result.stderr[-3000:]}"
    assert result.stdout.strip()  # generated text


def test_its_layer_has_the_interpretability_hook_points_and_they_can_write():
    """gpt.interpret reads q, k, v and each head's read of the state (hook_z) of a DeltaNet layer, which has a forward
    of its own, and a function attached to hook_z changes what the layer outputs (ablation works)."""
    from gpt.interpret import run_with_cache
    from gpt.interpret.hooks import hooks

    model = perturbed_model(dict(n_layer=2, n_head=4, n_kv_head=2, n_embd=32, block_size=16, vocab_size=50,
                                 designs=["deltanet"]))
    idx = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(0))
    logits, cache = run_with_cache(model, idx, ["blocks.*.attn.hook_[qkvz]"])
    for layer in range(2):
        assert cache[f"blocks.{layer}.attn.hook_q"].shape == (2, 9, 2, 8)  # TransformerLens' (B, T, heads, D)
        assert cache[f"blocks.{layer}.attn.hook_v"].shape == cache[f"blocks.{layer}.attn.hook_z"].shape == (2, 9, 4, 8)
    with hooks(model, [("blocks.1.attn.hook_z", lambda z, hook: torch.zeros_like(z))]), torch.no_grad():
        ablated = model(idx)[0]
    assert not torch.allclose(ablated, logits)

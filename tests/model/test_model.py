import math

import pytest
import torch
import torch.nn.functional as F

from gpt import GPT, GPTConfig
from gpt.inference.decoding import generate

TINY = dict(n_layer=2, n_head=4, n_embd=32, block_size=16, vocab_size=61)


def reference_gpt2_forward(sd: dict, cfg: GPTConfig, idx: torch.Tensor) -> torch.Tensor:
    """GPT-2's forward pass written out by hand from the state dict, independent of gpt.model."""
    B, T = idx.shape
    C, H = cfg.n_embd, cfg.n_head
    x = sd["transformer.wte.weight"][idx] + sd["transformer.wpe.weight"][:T]
    causal = torch.ones(T, T).tril().bool()

    def gelu(u):
        return 0.5 * u * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (u + 0.044715 * u**3)))

    for i in range(cfg.n_layer):
        p = f"transformer.h.{i}."
        h = F.layer_norm(x, (C,), sd[p + "ln_1.weight"], sd[p + "ln_1.bias"], eps=1e-5)
        qkv = h @ sd[p + "attn.c_attn.weight"].T + sd[p + "attn.c_attn.bias"]
        q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in qkv.split(C, dim=-1))
        att = (q @ k.transpose(-1, -2)) / math.sqrt(C // H)
        att = torch.softmax(att.masked_fill(~causal, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ sd[p + "attn.c_proj.weight"].T + sd[p + "attn.c_proj.bias"]
        h = F.layer_norm(x, (C,), sd[p + "ln_2.weight"], sd[p + "ln_2.bias"], eps=1e-5)
        h = gelu(h @ sd[p + "mlp.c_fc.weight"].T + sd[p + "mlp.c_fc.bias"])
        x = x + h @ sd[p + "mlp.c_proj.weight"].T + sd[p + "mlp.c_proj.bias"]
    x = F.layer_norm(x, (C,), sd["transformer.ln_f.weight"], sd["transformer.ln_f.bias"], eps=1e-5)
    return x @ sd["transformer.wte.weight"].T


def test_parameter_names_follow_gpt2_and_no_buffers():
    model = GPT(GPTConfig(**TINY))
    names = set(model.state_dict())
    expected = {"transformer.wte.weight", "transformer.wpe.weight", "transformer.ln_f.weight", "lm_head.weight"}
    for i in range(2):
        for part in ("ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp.c_fc", "mlp.c_proj"):
            expected |= {f"transformer.h.{i}.{part}.weight", f"transformer.h.{i}.{part}.bias"}
    expected |= {"transformer.ln_f.bias"}
    assert names == expected
    assert list(model.buffers()) == []
    assert model.lm_head.weight is model.transformer.wte.weight


@pytest.mark.parametrize("kernel", ["sdpa", "manual"])
def test_logits_equal_a_plain_gpt2_forward(kernel):
    torch.manual_seed(0)
    cfg = GPTConfig(**TINY, attention=kernel)
    model = GPT(cfg).eval()
    with torch.no_grad():  # non-trivial biases and LayerNorm gains so every term is exercised
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    idx = torch.randint(0, cfg.vocab_size, (3, cfg.block_size))
    logits, loss = model(idx)
    assert loss is None and logits.shape == (3, cfg.block_size, cfg.vocab_size)
    expected = reference_gpt2_forward(model.state_dict(), cfg, idx)
    torch.testing.assert_close(logits, expected, atol=2e-5, rtol=1e-5)


def test_loss_at_initialisation_is_near_log_vocab():
    torch.manual_seed(0)
    cfg = GPTConfig(**{**TINY, "vocab_size": 500})
    model = GPT(cfg)
    idx = torch.randint(0, 500, (8, 16))
    targets = torch.randint(0, 500, (8, 16))
    _, loss = model(idx, targets)
    assert abs(loss.item() - math.log(500)) < 0.1


def test_residual_projections_use_scaled_init():
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=8, n_head=4, n_embd=256, block_size=16, vocab_size=100))
    std_proj = model.transformer.h[0].mlp.c_proj.weight.std().item()
    std_fc = model.transformer.h[0].mlp.c_fc.weight.std().item()
    assert std_fc == pytest.approx(0.02, rel=0.05)
    assert std_proj == pytest.approx(0.02 / math.sqrt(16), rel=0.05)


@pytest.mark.parametrize("kernel", ["sdpa", "manual"])
def test_changing_a_later_token_never_changes_earlier_logits(kernel):
    torch.manual_seed(0)
    model = GPT(GPTConfig(**TINY, attention=kernel)).eval()
    idx = torch.randint(0, 61, (1, 16))
    changed = idx.clone()
    changed[0, 9:] = (changed[0, 9:] + 7) % 61
    a, _ = model(idx)
    b, _ = model(changed)
    torch.testing.assert_close(a[:, :9], b[:, :9], rtol=0, atol=0)
    assert not torch.allclose(a[:, 9:], b[:, 9:])


def test_sequence_longer_than_block_size_is_refused():
    model = GPT(GPTConfig(**TINY))
    with pytest.raises(ValueError, match="exceeds block_size 16"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_dropout_is_active_only_in_training():
    torch.manual_seed(0)
    model = GPT(GPTConfig(**{**TINY, "dropout": 0.5}))
    idx = torch.randint(0, 61, (2, 16))
    model.train()
    assert not torch.equal(model(idx)[0], model(idx)[0])
    model.eval()
    assert torch.equal(model(idx)[0], model(idx)[0])


@pytest.mark.parametrize("site", ["transformer.drop", "transformer.h.1.attn.resid_dropout",
                                  "transformer.h.1.mlp.dropout"])
def test_each_dropout_acts_in_training_and_is_skipped_in_eval(site):
    """Eval skips the dropout modules' calls (a decode step's Python overhead); training still applies each."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**TINY))
    idx = torch.randint(0, 61, (2, 16))
    with torch.no_grad():
        plain = model.eval()(idx)[0]
        model.get_submodule(site).p = 0.5
        assert torch.equal(model(idx)[0], plain)
        model.train()
        assert not torch.equal(model(idx)[0], plain)


def test_generate_extends_each_row_and_slides_past_block_size():
    torch.manual_seed(0)
    model = GPT(GPTConfig(**TINY)).eval()
    out = generate(model, torch.zeros(2, 3, dtype=torch.long), max_new_tokens=30, top_k=5)
    assert out.shape == (2, 33)
    assert int(out.max()) < 61
    greedy = generate(model, torch.zeros(1, 3, dtype=torch.long), 5, temperature=0.0)
    logits, _ = model(greedy[:, :3])
    assert greedy[0, 3] == logits[0, -1].argmax()

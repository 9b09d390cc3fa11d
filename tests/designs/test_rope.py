"""RoPE (gpt/designs/rope.py): the rotation is the complex-number one, scores depend on relative positions only,
and the learned position table goes."""

import pytest
import torch

from gpt import GPT, GPTConfig
from gpt.designs.rope import apply_rope, rope_angles
from gpt.errors import ConfigError

TINY = dict(n_layer=2, n_head=4, n_embd=32, block_size=16, vocab_size=61)


def test_rope_has_no_wpe_and_keeps_gpt2_names_otherwise():
    names = set(GPT(GPTConfig(**TINY, designs=["rope"])).state_dict())
    assert names == set(GPT(GPTConfig(**TINY)).state_dict()) - {"transformer.wpe.weight"}


def test_rotation_matches_the_complex_number_formulation():
    """Pair (x_i, x_{i+D/2}) as the complex number x_i + i x_{i+D/2}; RoPE multiplies it by e^{i p theta_i}."""
    x = torch.randn(2, 3, 7, 8, dtype=torch.float64)
    pos = torch.arange(7)
    cos, sin = rope_angles(pos, 8)
    theta = 10000.0 ** (-torch.arange(0, 8, 2, dtype=torch.float64) / 8)
    z = torch.complex(x[..., :4], x[..., 4:]) * torch.polar(torch.ones(7, 4, dtype=torch.float64), pos[:, None] * theta)
    torch.testing.assert_close(apply_rope(x, cos, sin), torch.cat([z.real, z.imag], dim=-1), atol=1e-6, rtol=1e-6)


def test_scores_depend_only_on_relative_position():
    q, k = torch.randn(8), torch.randn(8)

    def score(m, n):
        cq, sq = rope_angles(torch.tensor([m]), 8)
        ck, sk = rope_angles(torch.tensor([n]), 8)
        return (apply_rope(q[None], cq, sq) @ apply_rope(k[None], ck, sk).T).item()

    assert score(5, 2) == pytest.approx(score(105, 102), abs=1e-4)
    assert score(5, 2) != pytest.approx(score(5, 4), abs=1e-3)


def test_an_odd_head_dimension_is_refused():
    with pytest.raises(ConfigError, match=r"model.designs=\[rope\] needs an even head dimension, got n_embd/n_head "
                                          "= 7"):
        GPTConfig(**{**TINY, "n_embd": 28}, designs=["rope"])

"""ALiBi (gpt/designs/alibi.py): the paper's slopes, no position table, a kernel without a score bias refused."""

import pytest

from gpt import GPT, GPTConfig
from gpt.designs.alibi import alibi_slopes
from gpt.errors import ConfigError

TINY = dict(n_layer=2, n_head=4, n_embd=32, block_size=16, vocab_size=50)


def test_slopes_follow_the_paper_also_between_powers_of_two():
    assert alibi_slopes(4).tolist() == [2**-2, 2**-4, 2**-6, 2**-8]  # 2^(-8 (h + 1) / 4)
    # 6 heads: the 4-head sequence, then every other slope of the 8-head one (2^-1, 2^-3)
    assert alibi_slopes(6).tolist() == [2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3]


def test_the_position_table_goes_and_nothing_else_changes():
    base = set(GPT(GPTConfig(**TINY)).state_dict())
    assert set(GPT(GPTConfig(**TINY, designs=["alibi"])).state_dict()) == base - {"transformer.wpe.weight"}


def test_a_kernel_without_a_score_bias_is_refused_naming_one_that_has_it():
    with pytest.raises(ConfigError, match=r"attention=flex has no additive score bias .*designs=\[alibi\]") as caught:
        GPTConfig(**TINY, designs=["alibi"], attention="flex")
    assert "manual" in caught.value.hint
    assert GPTConfig(**TINY, designs=["alibi"], attention="sdpa").designs == ["alibi"]

"""prefill and decode_step, the two model calls of decoding, give the logits of a full forward pass (float64)."""

import pytest
import torch

from gpt import GPT, GPTConfig
from gpt.inference.decoding import decode_step, left_pad, prefill
from gpt.model.kv_cache import KVCache

OPTIONS = {
    "gpt2": {},
    "gqa+rope": {"n_kv_head": 2, "pos_embedding": "rope"},
    "mqa+window": {"n_kv_head": 1, "window": 5},  # the ring of 5 slots wraps twice in 16 positions
    "window+rope": {"window": 4, "pos_embedding": "rope"},
}
KERNELS = ["manual", "einsum", "heads", "sdpa", "flex"]


def float64_model(kernel: str, **options) -> GPT:
    torch.manual_seed(0)
    config = GPTConfig(n_layer=2, n_head=4, n_embd=32, block_size=16, vocab_size=50, attention=kernel, **options)
    return GPT(config).double().eval()


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("option", OPTIONS)
def test_decode_steps_after_prefill_give_the_full_forward_logits(kernel, option):
    model = float64_model(kernel, **OPTIONS[option])
    seq = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full, _ = model(seq)  # (2, 16, vocab): position t's logits predict token t + 1
    cache = KVCache(model.config, batch_size=2, device="cpu")
    positions = torch.arange(16).expand(2, 16)
    logits = [prefill(model, seq[:, :6], positions[:, :6], None, cache)]
    for t in range(6, 16):
        logits.append(decode_step(model, seq[:, t : t + 1], positions[:, t : t + 1], cache))
    torch.testing.assert_close(torch.stack(logits, dim=1), full[:, 5:], atol=1e-10, rtol=1e-10)
    recomputed = prefill(model, seq[:, :6], positions[:, :6], None, None)  # no cache: the same call
    torch.testing.assert_close(recomputed, full[:, 5], atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("option", OPTIONS)
def test_a_left_padded_row_decodes_as_it_would_alone(kernel, option):
    model = float64_model(kernel, **OPTIONS[option])
    seq = torch.randint(0, 50, (2, 14), generator=torch.Generator().manual_seed(2))
    lengths = [3, 7]  # prompt lengths: row 0 is padded by 4 on the left
    idx, key_mask, positions = left_pad([seq[i, :n].tolist() for i, n in enumerate(lengths)], "cpu")
    cache = KVCache(model.config, batch_size=2, device="cpu")
    steps = [prefill(model, idx, positions, key_mask, cache)]
    for s in range(6):
        positions = positions[:, -1:] + 1
        token = torch.stack([seq[i, n + s] for i, n in enumerate(lengths)])[:, None]
        steps.append(decode_step(model, token, positions, cache))
    with torch.no_grad():
        for i, n in enumerate(lengths):
            alone, _ = model(seq[i : i + 1, : n + 6])
            torch.testing.assert_close(torch.stack([s[i] for s in steps]), alone[0, n - 1 :], atol=1e-10, rtol=1e-10)

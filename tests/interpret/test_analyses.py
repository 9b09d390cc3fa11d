"""The analyses hold to what they claim: head-role scores read the right cells, direct logit attribution sums to the
logit, the logit lens's last stage is the model's loss, patching restores exactly what it patches, ablation is
zeroing a head's output, and bad requests are one error line."""

from __future__ import annotations

import json
import re
import string
import subprocess

import pytest
import torch
import torch.nn.functional as F

from conftest import perturbed_model, run_inline, run_script
from gpt.errors import UserError
from gpt.interpret import hooks, run_with_cache
from gpt.interpret.heads import (
    detect,
    induction_ablation,
    other_heads,
    repeated_tokens,
    role_scores,
    token_losses,
    token_pool,
)
from gpt.interpret.hooks import hook_points
from gpt.interpret.lens import direct_attribution, logit_lens
from gpt.interpret.patching import patch
from gpt.tokenizers.tokenizer import BPETokenizer, CharTokenizer

TINY = dict(n_layer=2, n_head=4, n_embd=32, block_size=16, vocab_size=50)


def model(**settings):
    return perturbed_model(dict(TINY, **settings), "sdpa").double()


def test_role_scores_read_the_previous_the_duplicate_and_the_next_token():
    n, T = 4, 8
    previous, induction = torch.zeros(1, 2, T, T), torch.zeros(1, 2, T, T)
    previous[0, 0, 0, 0] = 1.0
    for i in range(1, T):
        previous[0, :, i, i - 1] = 1.0
    for i in range(T):
        induction[0, :, i, i - n + 1 if i >= n else i] = 1.0
    assert role_scores(previous, n)["previous_token"].tolist() == [1.0, 1.0]
    assert role_scores(previous, n)["induction"].tolist() == [0.0, 0.0]
    scores = role_scores(induction, n)
    assert scores["induction"].tolist() == [1.0, 1.0] and scores["duplicate_token"].tolist() == [0.0, 0.0]


def induction_circuit(V=16, T=32):
    """A hand-built two-layer attention-only induction circuit (Olsson et al.): L0H0 attends to the previous position
    (learned positions) and writes its token into a subspace; L1H0 matches the current token against that subspace,
    attends to the token after the earlier occurrence and writes it out; the head reads it. L0H1, L1H1 are silent."""
    from gpt import GPT, GPTConfig
    D = 40  # a head's width: 3 * V + T = 2 * D features (token, position, previous token, output)
    m = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=2 * D, block_size=T, vocab_size=V, bias=False, norm="rmsnorm",
                      mlp=False, tie_head=False)).eval()
    tok, pos, prev, out, C, eye = 0, V, V + T, 2 * V + T, 2 * D, torch.eye(V)
    with torch.no_grad():
        for p in m.parameters():
            p.zero_()
        for norm in (m.transformer.h[0].ln_1, m.transformer.h[1].ln_1, m.transformer.ln_f):
            norm.weight.fill_(1.0)
        m.transformer.wte.weight[:, tok:tok + V] = eye
        m.transformer.wpe.weight[:, pos:pos + T] = torch.eye(T)
        (w0, p0), (w1, p1) = [(h.attn.c_attn.weight, h.attn.c_proj.weight) for h in m.transformer.h]
        w0[:T, pos:pos + T] = 4 * torch.eye(T)  # query: my position; key: the position after it
        w0[C + 1:C + T, pos:pos + T - 1] = torch.eye(T - 1)
        w0[2 * C:2 * C + V, tok:tok + V], p0[prev:prev + V, :V] = eye, 0.2 * eye
        w1[:V, tok:tok + V], w1[C:C + V, prev:prev + V] = 4 * eye, eye  # query: my token; key: the previous one
        w1[2 * C:2 * C + V, tok:tok + V], p1[out:out + V, :V] = eye, eye
        m.lm_head.weight[:, out:out + V] = 10 * eye
    return m


def test_the_detector_finds_a_hand_built_induction_circuit_and_ablating_it_costs_the_second_repeat():
    m = induction_circuit()
    scores = detect(m, batch=8)
    assert scores["previous_token"][0, 0] > 0.95 and scores["induction"][1, 0] > 0.95
    others = torch.ones(2, 2, dtype=torch.bool)
    others[1, 0] = False
    assert scores["induction"][others].max() < 0.1
    result = induction_ablation(m, scores["induction"], repeated_tokens(torch.arange(16), 16, 8, 1), 16,
                                previous=scores["previous_token"])
    assert result["induction_heads"] == [(1, 0)] and result["other_heads"] == [(1, 1)]
    assert result["feeding_heads"] == [(0, 0)]  # the previous-token head the circuit reads from
    assert result["loss_second_repeat"] < 0.1 < 20 < result["loss_first_repeat"]
    assert result["ablated_induction"] > 2 and abs(result["ablated_others"]) < 1e-6
    assert result["ablated_others_any"] == result["ablated_others"]  # the same head either way here
    assert token_losses(m, repeated_tokens(torch.arange(16), 16, 8, 1), [(0, 0)])[:, 16:].mean() > 2  # it feeds it
    mean = result["mean_ablated"]  # the induction head's mean output says nothing about the next token either
    assert mean["induction"] > 2 and abs(mean["others"]) < 1e-6 and mean["others_any"] == mean["others"]


def test_other_heads_leave_out_the_heads_feeding_the_circuit_only_when_told():
    scores = torch.tensor([[0.0, 0.01, 0.02], [0.9, 0.8, 0.03]])  # layer 1's first two heads induction heads
    found = [(1, 0), (1, 1)]
    assert other_heads(scores, found, []) == [(1, 2), (0, 0)]  # the same layer's first, then the lowest
    assert other_heads(scores, found, [(0, 0)]) == [(1, 2), (0, 1)]  # layer 0's previous-token head left out
    assert other_heads(scores, found, [(0, 0), (0, 1), (0, 2)]) == [(1, 2)]  # fewer where no more are left


def test_no_token_comes_twice_in_a_repeat_when_the_pool_has_enough():
    pool = torch.arange(100, 162)  # a character model's letters and digits
    tokens = repeated_tokens(pool, 62, 4, 0)
    assert torch.equal(tokens[:, :62], tokens[:, 62:])
    assert all(sorted(row.tolist()) == pool.tolist() for row in tokens[:, :62])
    assert repeated_tokens(pool, 100, 2, 0).shape == (2, 200)  # longer than the pool: drawn with replacement


def train_bpe(text: str, vocab_size: int) -> BPETokenizer:
    """A byte-level BPE learnt from ``text`` as scripts/train_tokenizer.py learns one."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    library = Tokenizer(models.BPE())
    library.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    library.decoder = decoders.ByteLevel()
    library.train_from_iterator([text], trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return BPETokenizer(library.to_str())


def test_a_subword_models_random_tokens_are_its_words_and_a_character_models_its_letters():
    bpe = train_bpe("def value(self):\n    return self.value + other_value\n" * 50, vocab_size=300)
    words = [bpe.decode([int(i)]) for i in token_pool(bpe, bpe.vocab_size)]
    assert "self" in {w.strip() for w in words} and all(len(w.strip()) >= 2 for w in words)
    assert len(words) >= 20 and all(re.fullmatch(r" ?[A-Za-z_]\w+", w) for w in words)  # no single bytes
    chars = CharTokenizer(sorted(set(string.ascii_letters + string.digits + " .:()\n")))
    letters = [chars.decode([int(i)]) for i in token_pool(chars, chars.vocab_size)]
    assert sorted(letters) == sorted(string.ascii_letters + string.digits)


@pytest.mark.parametrize("settings", [{}, {"designs": ["rope"]}, {"designs": ["diff"]},
                                      {"designs": ["mla"], "design_options": {"mla": {"latent": 12}}}])
def test_direct_attribution_sums_to_the_next_tokens_centred_logit(settings):
    m = model(**settings)
    tokens = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(0))
    parts = direct_attribution(m, tokens)
    with torch.no_grad():
        logits = m(tokens[:, :-1])[0]
    centred = (logits - logits.mean(-1, keepdim=True)).gather(-1, tokens[:, 1:, None]).mean()
    torch.testing.assert_close(parts["total"] + parts["ln_bias"], centred, atol=1e-10, rtol=1e-10)
    assert parts["heads"].shape == (2, 4) and parts["heads"].abs().sum() > 0


def test_the_lens_last_stage_is_the_models_loss():
    m = model()
    tokens = torch.randint(0, 50, (1, 12), generator=torch.Generator().manual_seed(0))
    rows = logit_lens(m, tokens)
    with torch.no_grad():
        _, loss = m(tokens[:, :-1], tokens[:, 1:])
    assert [r["stage"] for r in rows] == ["embed", "block 0", "block 1"]
    assert rows[-1]["loss"] == round(float(loss), 4)


def test_patching_the_one_changed_position_restores_the_clean_run_and_nothing_else_does_at_layer_0():
    m = model()
    clean = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    corrupted = clean.clone()
    corrupted[0, 2] = 7
    result = patch(m, clean, corrupted)
    grid = result["resid_pre_by_layer_position"]
    assert grid[0, 2] == pytest.approx(1.0, abs=1e-9)
    assert torch.all(grid[0, :2].abs() < 1e-9) and torch.all(grid[0, 3:].abs() < 1e-9)
    assert result["z_by_head"].shape == (2, 4)
    with pytest.raises(UserError, match="same length"):
        patch(m, clean, clean[:, :5])


def test_ablating_every_head_is_zeroing_the_out_projections_input():
    m = model()
    tokens = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(0))
    every = [(layer, head) for layer in range(2) for head in range(4)]
    ablated = token_losses(m, tokens, every)
    with torch.no_grad():
        for block in m.transformer.h:
            block.attn.c_proj.weight.zero_()
        logits = m(tokens[:, :-1])[0]
    expected = F.cross_entropy(logits.transpose(1, 2), tokens[:, 1:], reduction="none")
    torch.testing.assert_close(ablated, expected, atol=1e-10, rtol=1e-10)


def test_mean_ablation_feeds_the_out_projection_each_heads_mean_over_batch_and_positions():
    m = model()
    tokens = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(0))
    fed = []

    def by_hand(z, hook):  # (B, T, H, D): head 1's output, every position given its mean over batch and positions
        fed.append(z.clone())
        z = z.clone()
        z[:, :, 1] = z[:, :, 1].mean(dim=(0, 1), keepdim=True)
        return z

    with hooks(m, [("blocks.0.attn.hook_z", by_hand)]), torch.no_grad():
        logits = m(tokens[:, :-1])[0]
    expected = F.cross_entropy(logits.transpose(1, 2), tokens[:, 1:], reduction="none")
    torch.testing.assert_close(token_losses(m, tokens, [(0, 1)], "mean"), expected, atol=1e-10, rtol=1e-10)
    assert fed[0][:, :, 1].std(dim=(0, 1)).min() > 0  # the head did vary, so the mean took something away
    assert not torch.allclose(token_losses(m, tokens, [(0, 1)], "mean"), token_losses(m, tokens, [(0, 1)]))


def test_hooks_write_and_are_gone_after_the_block():
    m = model()
    tokens = torch.arange(10)[None]
    with torch.no_grad():
        before = m(tokens)[0]
    with hooks(m, [("blocks.1.hook_resid_post", lambda x, hook: x * 0)]), torch.no_grad():
        zeroed = m(tokens)[0]
    with torch.no_grad():
        assert torch.equal(m(tokens)[0], before)
    assert torch.allclose(zeroed, m.lm_head(m.transformer.ln_f.bias.expand(1, 10, -1)))


def test_a_hook_on_every_point_fires_once_a_pass_and_leaves_the_flags_down_after():
    m = model(mlp=True)
    seen = []
    names = [name for name in hook_points(m) if not name.endswith(("hook_attn_scores", "hook_pattern"))]
    with hooks(m, [(name, lambda x, hook: seen.append(hook.name)) for name in names]), torch.no_grad():
        assert all(module.hooked for module in m.modules() if hasattr(module, "hooked"))
        m(torch.arange(6)[None])
    assert sorted(seen) == sorted(names)
    assert not any(module.hooked for module in m.modules() if hasattr(module, "hooked"))
    with hooks(m, [("blocks.1.attn.hook_z", lambda z, hook: seen.append(1))]):
        assert [module.hooked for module in m.modules() if hasattr(module, "hooked")].count(True) == 1
        assert m.transformer.h[1].attn.hooked


def test_nested_hooks_on_patterns_leave_the_kernel_as_it_was():
    m = model()
    attn = m.transformer.h[0].attn
    kernel = attn.kernel
    seen = []
    with hooks(m, [("blocks.0.attn.hook_pattern", lambda p, hook: seen.append(1))]):
        _, cache = run_with_cache(m, torch.arange(6), ["blocks.0.attn.hook_pattern"])
        assert len(seen) == 1 and cache.pattern(0).shape == (1, 4, 6, 6)
        with torch.no_grad():
            m(torch.arange(6)[None])
        assert len(seen) == 2  # the outer hook still watches after the inner cache is done
    assert attn.kernel is kernel and "_watched" not in vars(attn)


def test_bad_requests_are_one_clear_error():
    m = model()
    with pytest.raises(UserError, match=r"unknown hook name 'blocks.0.hook_nope'; valid: .*blocks.\{l\}.attn.hook_q"):
        run_with_cache(m, torch.arange(5), ["blocks.0.hook_nope"])
    with pytest.raises(UserError, match="unknown hook name 'blocks.7.hook_resid_pre'.*l = 0..1"):
        run_with_cache(m, torch.arange(5), ["blocks.7.hook_resid_pre"])
    with pytest.raises(UserError, match="17 tokens, more than the model's context of 16"):
        run_with_cache(m, torch.zeros(17, dtype=torch.long))
    with pytest.raises(UserError, match="out of range"):
        token_losses(m, torch.arange(5)[None], [(2, 0)])


@pytest.fixture(scope="module")
def checkpoint_dir(tmp_path_factory):
    from gpt.tokenizers.tokenizer import CharTokenizer
    from gpt.weights import checkpoint

    folder = tmp_path_factory.mktemp("ckpt")
    m = perturbed_model(dict(TINY, vocab_size=40), "sdpa")
    tokenizer = CharTokenizer([chr(ord("0") + i) for i in range(10)] + [chr(97 + i) for i in range(26)]
                              + [" ", "\n", "(", ")"]).to_meta()
    checkpoint.save(checkpoint.model_entries(m.state_dict(), m.config, tokenizer), folder / "m.pt")
    return folder / "m.pt"


def interpret(*args: str, inline: bool = False) -> subprocess.CompletedProcess:
    """scripts/interpret.py on ``args``: a process, or its main() in this one (``inline``, for a refusal)."""
    return (run_inline if inline else run_script)("interpret", *args, "device=cpu")


@pytest.mark.slow
def test_the_script_writes_json_and_png_and_refuses_bad_input_in_one_line(checkpoint_dir, tmp_path):
    out = tmp_path / "out"
    done = interpret(f"ckpt={checkpoint_dir}", "analysis=heads", f"out={out}", "batch=2")
    assert done.returncode == 0, done.stderr
    result = json.loads((out / "heads.json").read_text())
    assert len(result["scores"]["induction"]) == 2 and (out / "heads.png").stat().st_size > 1000
    for args, message in [(["analysis=patching", "prompt=abc", "corrupted=abcd"], "same length"),
                          (["analysis=ablation", "ablate=[L5H0]"], "out of range"),
                          (["analysis=ablation", "ablate=[head1]"], "L<layer>H<head>"),
                          (["analysis=lens", "prompt=" + "a" * 20], "more than the model's context"),
                          (["analysis=curve"], "has none"),  # a checkpoint's folder without a run's events
                          (["analysis=ablation", "ablate_with=median"], "not one of zero, mean"),
                          (["analysis=nope"], "not one of heads, lens")]:
        # The first refusal as a user meets it, in a process; the others in this one (same main(), no start-up).
        inline = message != "same length"
        done = interpret(f"ckpt={checkpoint_dir}", f"out={tmp_path / 'bad'}", *args, inline=inline)
        assert done.returncode == 2 and done.stderr.startswith("error: ") and message in done.stderr, done.stderr
        assert "Traceback" not in done.stderr and not (tmp_path / "bad").exists()


def test_a_compiled_model_has_the_same_hook_names_and_patterns():
    m = model()
    compiled = torch.compile(m, backend="eager")
    _, eager = run_with_cache(m, torch.arange(8), "blocks.*.attn.hook_pattern")
    _, seen = run_with_cache(compiled, torch.arange(8), "blocks.*.attn.hook_pattern")
    assert sorted(seen) == sorted(eager)
    for name in eager:
        torch.testing.assert_close(seen[name], eager[name], atol=1e-12, rtol=0)


def test_the_curve_reads_the_head_scalars_a_run_logged_and_finds_when_they_rose(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    from gpt.interpret.curve import figure, formation, read_scalars

    induction = {0: 0.01, 200: 0.02, 400: 0.30, 600: 0.55, 800: 0.60}
    writer = SummaryWriter(log_dir=str(tmp_path))
    for step, value in induction.items():
        writer.add_scalar("heads/induction_best", value, step)
        writer.add_scalar("heads/previous_token_best", 0.9, step)
        writer.add_scalar("heads/in_context_loss", -value, step)
    writer.add_scalar("heads/induction_best", 0.65, 800)  # evaluated again at a resume: the later value counts
    writer.close()
    result = formation(read_scalars(tmp_path))
    assert [row["step"] for row in result["curve"]] == list(induction)
    assert result["curve"][-1] == {"step": 800, "induction_best": pytest.approx(0.65), "previous_token_best":
                                   pytest.approx(0.9), "in_context_loss": pytest.approx(-0.6)}
    assert result["first_step_over"] == 600 and result["steepest_rise"]["from"] == 200
    assert figure(result).axes  # draws without val/loss too
    with pytest.raises(UserError, match="has none"):
        read_scalars(tmp_path / "empty")
    writer = SummaryWriter(log_dir=str(tmp_path / "plain"))
    writer.add_scalar("val/loss", 3.0, 0)
    writer.close()
    with pytest.raises(UserError, match="logged no head scores"):
        read_scalars(tmp_path / "plain")

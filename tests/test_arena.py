"""The attention arena: variants parsed and validated up front, every variant on the same budget, and the quick mode
through the real script (train, held-out pass, table, CSV, plot)."""

import csv
import math

import pytest
import torch
from hydra import compose, initialize_config_dir

from conftest import ROOT, run_script
from gpt import GPT, GPTConfig
from gpt.bench.arena import (
    ArenaConfig,
    kv_bytes_per_token,
    last_layer_map,
    parse_variant,
    variant_name,
    variant_runs,
)
from gpt.errors import ConfigError
from gpt.schema import register, typed

register()


def arena_config(*overrides: str) -> ArenaConfig:
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base=None):
        return typed(compose(config_name="arena", overrides=list(overrides)))


def test_variants_are_presets_and_model_overrides_joined_by_plus():
    assert parse_variant("gpt2") == {}
    assert parse_variant("rope+qk_norm") == {"pos_embedding": "rope", "qk_norm": True}
    assert parse_variant("diff+rope") == {"diff_attn": True, "pos_embedding": "rope"}
    assert parse_variant("alibi+model.n_kv_head=1+model.window=16") == dict(pos_embedding="alibi", n_kv_head=1,
                                                                           window=16)
    assert parse_variant("model.attn_softcap=30.5+model.attention=manual") == dict(attn_softcap=30.5,
                                                                                  attention="manual")
    assert variant_name("rope+model.n_kv_head=1") == "rope_n_kv_head=1"


def test_every_variant_gets_the_same_tokens_seed_and_batch():
    cfg = arena_config("arena.variants=[gpt2,alibi,'model.block_size=64+rope']", "arena.tokens=100000",
                       "device=cpu", "out_dir=/tmp/x")
    runs = dict(variant_runs(cfg))
    assert list(runs) == ["gpt2", "alibi", "block_size=64_rope"]
    for name, run in runs.items():
        per_step = run.train.batch_size * run.train.grad_accum * run.model.block_size
        assert run.train.max_iters == math.ceil(100_000 / per_step), name
        assert (run.seed, run.train.batch_size, run.data) == (cfg.seed, cfg.train.batch_size, cfg.data)
        assert run.out_dir == f"/tmp/x/{name}"
    assert runs["alibi"].model.pos_embedding == "alibi" and runs["gpt2"].model.pos_embedding == "learned"
    assert runs["block_size=64_rope"].train.max_iters == math.ceil(100_000 / (16 * 64))
    assert all(run.train.max_seconds is None for run in runs.values())
    timed = dict(variant_runs(arena_config("arena.seconds=30", "arena.tokens=100000", "device=cpu")))
    assert all(run.train.max_seconds == 30 and run.train.max_iters == math.ceil(100_000 / (16 * 128))
               for run in timed.values())  # equal time; the token budget stays the cap and the schedule's length


@pytest.mark.parametrize("override, message", [
    ("arena.variants=[nope]", "unknown preset 'nope'"),
    ("arena.variants=['model.colour=3']", "'model.colour' in 'model.colour=3' is not a model field"),
    ("arena.variants=['model.attn_softcap=5']", "arena variant 'model.attn_softcap=5': attention=sdpa has no logit"),
    ("arena.variants=['model.n_kv_head=3']", "must be a multiple of model.n_kv_head"),
    ("arena.variants=[rope,rope]", "names a variant twice"),
    ("arena.variants=[]", "arena.variants is empty"),
    ("arena.tokens=0", "arena.tokens must be positive"),
    ("arena.seconds=0", "arena.seconds must be positive"),
])
def test_bad_arena_settings_are_refused_before_anything_runs(override, message):
    with pytest.raises(ConfigError, match=message):
        arena_config(override)


def test_kv_bytes_per_token_counts_only_key_value_heads_and_the_window_ring():
    small = dict(n_layer=3, n_head=4, n_embd=32, block_size=16, vocab_size=11)
    assert kv_bytes_per_token(GPT(GPTConfig(**small)).eval(), "cpu") == 2 * 3 * 4 * 8 * 4  # k and v, fp32
    assert kv_bytes_per_token(GPT(GPTConfig(**small, n_kv_head=1)).eval(), "cpu") == 2 * 3 * 1 * 8 * 4
    assert kv_bytes_per_token(GPT(GPTConfig(**small, diff_attn=True)).eval(), "cpu") == 2 * 3 * 4 * 8 * 4  # k whole
    linear = GPT(GPTConfig(**small, linear_attn="elu1")).eval()  # a fixed state per layer: S (4, 8, 8) and z (4, 8)
    assert kv_bytes_per_token(linear, "cpu") == 3 * 4 * (8 * 8 + 8) * 4 / 16  # over block_size tokens
    latent = GPT(GPTConfig(**small, mla_latent=10)).eval()  # MLA: the latent (10) and the shared rotated key (4)
    assert kv_bytes_per_token(latent, "cpu") == 3 * (10 + 4) * 4
    stream = GPT(GPTConfig(**small, window=4, sink_tokens=2)).eval()  # 4 ring slots and 2 sinks: 6 cached tokens
    assert kv_bytes_per_token(stream, "cpu") == 2 * 3 * 4 * 8 * 4


def test_the_side_by_side_map_is_the_last_layers_causal_attention_averaged_over_heads():
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=4, n_embd=32, block_size=16, vocab_size=11)).eval()
    ids = [1, 5, 3, 3, 7, 2, 9, 0]
    rows = torch.tensor(last_layer_map(model, ids, torch.device("cpu")))
    assert rows.shape == (8, 8)
    torch.testing.assert_close(rows.sum(-1), torch.ones(8))  # each query's weights sum to one ...
    assert torch.count_nonzero(torch.triu(rows, diagonal=1)) == 0  # ... over the keys up to itself


@pytest.mark.slow
def test_quick_arena_trains_scores_and_reports_each_variant(tmp_path, data_args):
    out = tmp_path / "arena"
    result = run_script("arena", "arena.quick=true", "arena.variants=[gpt2,'alibi+qk_norm+sink']", "device=cpu",
                        f"out_dir={out}", *data_args, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    with open(out / "arena.csv") as f:
        rows = {r["variant"]: r for r in csv.DictReader(f)}
    assert sorted(rows) == ["alibi_qk_norm_sink", "gpt2"]
    for row in rows.values():
        assert row["error"] == "" and int(row["tokens"]) >= 16384 - 512
        assert 0 < float(row["val_bpb"]) < 10 and float(row["tokens_per_s"]) > 0 and float(row["decode_tok_s"]) > 0
    # every parameter counted: alibi drops the 32 x 32 position table, adds 2 layers x (16 + 16 gains + 2 sinks)
    assert int(rows["gpt2"]["params"]) - int(rows["alibi_qk_norm_sink"]["params"]) == 32 * 32 - 2 * (16 + 16 + 2)
    assert float(rows["gpt2"]["kv_bytes_per_token"]) == 2 * 2 * 32 * 4  # 2 layers x (k + v) x 32 features x fp32
    with open(out / "arena_curves.csv") as f:
        curve = [r for r in csv.DictReader(f) if r["variant"] == "gpt2"]
    assert len(curve) >= 4 and float(curve[-1]["val"]) < float(curve[0]["val"])
    assert "| rank | variant | params | val loss | val bits/byte |" in (out / "arena.md").read_text()
    assert (out / "arena_loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "arena_attention.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    again = run_script("arena", "arena.quick=true", "arena.variants=[gpt2]", "device=cpu", f"out_dir={out}", *data_args)
    assert again.returncode == 2 and "already holds a run" in again.stderr


def test_the_recipe_axis_trains_every_variant_under_each_recipe_with_its_own_design():
    runs = dict(variant_runs(arena_config("arena.variants=[gpt2,alibi]", "arena.recipes=[gpt2,modern]",
                                          "arena.tokens=100000", "device=cpu", "out_dir=/tmp/x")))
    assert list(runs) == ["gpt2@gpt2", "gpt2@modern", "alibi@gpt2", "alibi@modern"]
    for name, run in runs.items():
        recipe = name.split("@")[1]
        assert (run.train.optimizer, run.train.schedule) == {"gpt2": ("adamw", "cosine"), "modern": ("muon", "wsd")}[
            recipe], name
        assert run.model.pos_embedding == ("alibi" if name.startswith("alibi") else "learned"), name
        assert run.out_dir == f"/tmp/x/{name}" and run.train.max_iters == math.ceil(100_000 / (16 * 128))
    composed = dict(variant_runs(arena_config("recipe=modern", "arena.variants=[gpt2]", "device=cpu")))
    assert composed["gpt2"].train.optimizer == "muon"  # without the axis: the composed recipe=
    with pytest.raises(ConfigError, match="unknown recipe 'fast'"):
        arena_config("arena.recipes=[fast]")


@pytest.mark.slow
def test_quick_arena_runs_a_variant_under_both_recipes(tmp_path, data_args):
    out = tmp_path / "arena"
    result = run_script("arena", "arena.quick=true", "arena.variants=[gpt2]", "arena.recipes=[gpt2,modern]",
                        "device=cpu", f"out_dir={out}", *data_args, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    with open(out / "arena.csv") as f:
        rows = {r["variant"]: r for r in csv.DictReader(f)}
    assert sorted(rows) == ["gpt2@gpt2", "gpt2@modern"] and all(r["error"] == "" for r in rows.values())
    assert "optimizer muon, schedule wsd" in result.stdout
    assert "each under recipe gpt2 and modern" in (out / "arena.md").read_text()

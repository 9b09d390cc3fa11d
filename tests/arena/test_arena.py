"""The attention arena: variants and axes parsed and validated up front, every variant on the same budget of tokens
or FLOPs, runs spread over devices, folders that resume, and the quick mode through the real script (three seeds
of three designs: train, held-out pass, table with p-values, CSV, plots; a seed rerun bit for bit)."""

import csv
import math
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch
from hydra import compose, initialize_config_dir

from conftest import ROOT, run_forked, run_script
from gpt import GPT, GPTConfig
from gpt.arena import runs as arena_runs
from gpt.arena.arena import (
    ArenaConfig,
    kv_bytes_per_token,
    last_layer_map,
    parse_variant,
    variant_name,
    variant_runs,
)
from gpt.arena.plan import plan
from gpt.arena.report import leaderboard, summarise
from gpt.errors import ConfigError, UserError
from gpt.model import design as registry
from gpt.model import flops
from gpt.schema import register, typed

register()


FAST = ["arena.quick=true", "arena.tokens=8192", "arena.eval_tokens=1024", "arena.decode_tokens=8", "device=cpu"]
ONE_THREAD = {"OMP_NUM_THREADS": "1"}  # tiny models: a second thread only contends with whatever else runs


def arena_config(*overrides: str) -> ArenaConfig:
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base=None):
        return typed(compose(config_name="arena", overrides=list(overrides)))


def test_variants_are_presets_and_model_overrides_joined_by_plus():
    assert parse_variant("gpt2") == {}
    assert parse_variant("rope+qk_norm") == {"designs": ["rope", "qk_norm"]}
    assert parse_variant("diff+rope") == {"designs": ["diff", "rope"]}
    assert parse_variant("alibi+model.n_kv_head=1+model.window=16") == dict(designs=["alibi"], n_kv_head=1,
                                                                           window=16)
    assert parse_variant("model.designs=[softcap]+model.design_options.softcap.cap=30.5+model.attention=manual") \
        == dict(designs=["softcap"], design_options={"softcap": {"cap": 30.5}}, attention="manual")
    assert parse_variant("rope+model.designs=[qk_norm]+model.design_options={rope: {base: 1000000}}") \
        == dict(designs=["rope", "qk_norm"], design_options={"rope": {"base": 1000000}})
    assert variant_name("rope+model.n_kv_head=1") == "rope_n_kv_head=1"


def test_every_variant_gets_the_same_tokens_seed_and_batch():
    cfg = arena_config("arena.variants=[gpt2,alibi,'model.block_size=64+rope']", "arena.tokens=100000",
                       "device=cpu", "out_dir=/tmp/x")
    runs = dict(variant_runs(cfg))
    assert list(runs) == ["gpt2/seed1337", "alibi/seed1337", "block_size=64_rope/seed1337"]
    for name, run in runs.items():
        per_step = run.train.batch_size * run.train.grad_accum * run.model.block_size
        assert run.train.max_iters == math.ceil(100_000 / per_step), name
        assert (run.seed, run.train.batch_size, run.data) == (cfg.seed, cfg.train.batch_size, cfg.data)
        assert run.out_dir == f"/tmp/x/{name}"
    assert runs["alibi/seed1337"].model.designs == ["alibi"]
    assert runs["gpt2/seed1337"].model.designs == []
    assert runs["block_size=64_rope/seed1337"].train.max_iters == math.ceil(100_000 / (16 * 64))
    assert all(run.train.max_seconds is None for run in runs.values())
    timed = dict(variant_runs(arena_config("arena.seconds=30", "arena.tokens=100000", "device=cpu")))
    assert all(run.train.max_seconds == 30 and run.train.max_iters == math.ceil(100_000 / (16 * 128))
               for run in timed.values())  # equal time; the token budget stays the cap and the schedule's length


@pytest.mark.parametrize("override, message", [
    ("arena.variants=[nope]", "unknown preset 'nope'"),
    ("arena.variants=['model.colour=3']", "'model.colour' in 'model.colour=3' is not a model field"),
    ("arena.variants=['model.designs=[softcap]']", r"arena variant 'model.designs=\[softcap\]': attention=sdpa has "
                                                   "no logit"),
    ("arena.variants=['model.qk_norm=true']", r"model.qk_norm is no longer a setting: write model.designs=\[qk_norm\]"),
    ("arena.variants=['model.n_kv_head=3']", "must be a multiple of model.n_kv_head"),
    ("arena.variants=[rope,rope]", "names a variant twice"),
    ("arena.variants=[]", "arena.variants is empty"),
    ("arena.tokens=0", "arena.tokens must be positive"),
    ("arena.seconds=0", "arena.seconds must be positive"),
    ("arena.seeds=0", "arena.seeds must be positive"),
    ("arena.flops=1e9 arena.seconds=5", "arena.flops and arena.seconds are two budgets"),
    ("arena.baseline=nope", "arena.baseline=nope is not one of arena.variants"),
    ("arena.alpha=0.7", "arena.alpha must be in"),
    ("arena.overrides=['train.colour=3']", "'train.colour' in 'train.colour=3' is not a training option"),
    ("arena.overrides=['lr=3']", "is not model.<field>=<value> or train.<field>=<value>"),
    ("arena.sizes=['model.n_embd=48+model.n_head=5']", "must be divisible by model.n_head"),
    ("arena.sizes=[rope]", "arena.sizes: 'rope' in 'rope' is not <field>=<value>"),
])
def test_bad_arena_settings_are_refused_before_anything_runs(override, message):
    with pytest.raises(ConfigError, match=message):
        arena_config(*override.split(" "))


def test_kv_bytes_per_token_counts_only_key_value_heads_and_the_window_ring():
    small = dict(n_layer=3, n_head=4, n_embd=32, block_size=16, vocab_size=11)
    assert kv_bytes_per_token(GPT(GPTConfig(**small)).eval(), "cpu") == 2 * 3 * 4 * 8 * 4  # k and v, fp32
    assert kv_bytes_per_token(GPT(GPTConfig(**small, n_kv_head=1)).eval(), "cpu") == 2 * 3 * 1 * 8 * 4
    assert kv_bytes_per_token(GPT(GPTConfig(**small, designs=["diff"])).eval(), "cpu") == 2 * 3 * 4 * 8 * 4  # k whole
    linear = GPT(GPTConfig(**small, designs=["linear"])).eval()  # a fixed state per layer: S (4, 8, 8) and z (4, 8)
    assert kv_bytes_per_token(linear, "cpu") == 3 * 4 * (8 * 8 + 8) * 4 / 16  # over block_size tokens
    # MLA: the latent (10) and the shared rotated key (4)
    latent = GPT(GPTConfig(**small, designs=["mla"], design_options={"mla": {"latent": 10}})).eval()
    assert kv_bytes_per_token(latent, "cpu") == 3 * (10 + 4) * 4
    # 4 ring slots and 2 sinks: 6 cached tokens
    stream = GPT(GPTConfig(**small, window=4, designs=["stream"], design_options={"stream": {"sinks": 2}})).eval()
    assert kv_bytes_per_token(stream, "cpu") == 2 * 3 * 4 * 8 * 4


def test_the_side_by_side_map_is_the_last_layers_causal_attention_averaged_over_heads():
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=4, n_embd=32, block_size=16, vocab_size=11)).eval()
    ids = [1, 5, 3, 3, 7, 2, 9, 0]
    rows = torch.tensor(last_layer_map(model, ids, torch.device("cpu")))
    assert rows.shape == (8, 8)
    torch.testing.assert_close(rows.sum(-1), torch.ones(8))  # each query's weights sum to one ...
    assert torch.count_nonzero(torch.triu(rows, diagonal=1)) == 0  # ... over the keys up to itself


def test_the_recipe_axis_trains_every_variant_under_each_recipe_with_its_own_design():
    runs = dict(variant_runs(arena_config("arena.variants=[gpt2,alibi]", "arena.recipes=[gpt2,modern]",
                                          "arena.tokens=100000", "device=cpu", "out_dir=/tmp/x")))
    assert list(runs) == ["gpt2@gpt2/seed1337", "gpt2@modern/seed1337", "alibi@gpt2/seed1337", "alibi@modern/seed1337"]
    for name, run in runs.items():
        recipe = name.split("@")[1].split("/")[0]
        assert (run.train.optimizer, run.train.schedule) == {"gpt2": ("adamw", "cosine"), "modern": ("muon", "wsd")}[
            recipe], name
        assert run.model.designs == (["alibi"] if name.startswith("alibi") else []), name
        assert run.out_dir == f"/tmp/x/{name}" and run.train.max_iters == math.ceil(100_000 / (16 * 128))
    composed = dict(variant_runs(arena_config("recipe=modern", "arena.variants=[gpt2]", "device=cpu")))
    assert composed["gpt2/seed1337"].train.optimizer == "muon"  # without the axis: the composed recipe=
    with pytest.raises(ConfigError, match="unknown recipe 'fast'"):
        arena_config("arena.recipes=[fast]")


@pytest.mark.slow
def test_quick_arena_runs_a_variant_under_both_recipes(tmp_path, data_args):
    out = tmp_path / "arena"
    result = run_script("arena", *FAST, "arena.variants=[gpt2]", "arena.recipes=[gpt2,modern]", f"out_dir={out}",
                        *data_args, timeout=600, env=ONE_THREAD)
    assert result.returncode == 0, result.stderr[-3000:]
    with open(out / "arena.csv") as f:
        rows = {r["group"]: r for r in csv.DictReader(f)}
    assert sorted(rows) == ["gpt2@gpt2", "gpt2@modern"] and all(r["error"] == "" for r in rows.values())
    assert "optimizer muon, schedule wsd" in result.stdout
    assert "each under recipe gpt2 and modern" in (out / "arena.md").read_text()


def test_overrides_and_sizes_are_axes_of_the_grid_each_with_its_own_folder():
    cfg = arena_config("arena.variants=[gpt2,rope]", "arena.seeds=2", "arena.overrides=['train.learning_rate=1e-3',"
                       "'model.designs=[qk_norm]+train.batch_size=8']", "arena.sizes=['model.n_layer=1','n_layer=3']",
                       "arena.tokens=65536", "device=cpu", "out_dir=/tmp/x")
    cells = plan(cfg)
    assert len(cells) == 2 * 2 * 2 * 2  # sizes x variants x overrides x seeds
    first = cells[0]
    assert (first.group, first.slice, first.size, first.seed) == (
        "gpt2@learning_rate=1e-3@n_layer=1", "learning_rate=1e-3@n_layer=1", "n_layer=1", 1337)
    assert first.run.out_dir == "/tmp/x/gpt2@learning_rate=1e-3@n_layer=1/seed1337"
    assert (first.run.train.learning_rate, first.run.model.n_layer) == (1e-3, 1)
    small_batch = next(c for c in cells if c.group == "rope@designs=_qk_norm_batch_size=8@n_layer=3"
                       and c.seed == 1338)
    assert small_batch.run.model.designs == ["rope", "qk_norm"]  # the variant's, and the override's added
    assert small_batch.run.train.batch_size == 8 and small_batch.run.model.n_layer == 3
    assert small_batch.run.train.max_iters == math.ceil(65536 / (8 * 128)) and small_batch.run.seed == 1338


def test_equal_flops_gives_each_design_the_steps_its_count_allows():
    cfg = arena_config("arena.variants=[gpt2,diff,mla]", "arena.flops=2e12", "model.vocab_size=256",
                       "arena.sizes=['model.n_embd=64','model.n_embd=128']", "device=cpu")
    cells = {c.group: c for c in plan(cfg)}
    per_step = 16 * 128
    for group, cell in cells.items():
        fpt = flops.per_token(cell.run.model.build(256))
        assert cell.flops_per_token == fpt
        spent = cell.run.train.max_iters * per_step * fpt
        scale = 1.0 if group.endswith("n_embd=64") else (
            flops.per_token(cells["gpt2@n_embd=128"].run.model.build(256))
            / flops.per_token(cells["gpt2@n_embd=64"].run.model.build(256)))
        assert 2e12 * scale <= spent < 2e12 * scale + per_step * fpt, group  # rounded up to a whole step
    assert cells["diff@n_embd=64"].run.train.max_iters < cells["gpt2@n_embd=64"].run.train.max_iters  # dearer
    assert cells["gpt2@n_embd=64"].run.train.max_iters == cells["gpt2@n_embd=128"].run.train.max_iters  # same tokens


def test_equal_flops_refuses_a_design_that_declares_no_count_and_equal_tokens_takes_it():
    class Silent(registry.Design):
        name = "silent_arena_design"

    registry.register(Silent())
    try:
        with pytest.raises(ConfigError, match="arena variant 'silent_arena_design': attention design "
                                              "'silent_arena_design' declares no FLOPs count"):
            arena_config("arena.variants=[gpt2,silent_arena_design]", "arena.flops=1e12", "device=cpu")
        cells = plan(arena_config("arena.variants=[gpt2,silent_arena_design]", "device=cpu"))
        assert [c.flops_per_token is None for c in cells] == [False, True]
    finally:
        registry.unregister("silent_arena_design")


def test_the_summary_tests_each_variant_against_the_baseline_of_its_own_slice():
    scipy_stats = pytest.importorskip("scipy.stats")
    values = {("gpt2", "gpt2"): [3.50, 3.52, 3.51], ("rope", "gpt2"): [3.40, 3.41, 3.39],
              ("diff", "gpt2"): [3.49, 3.53, 3.50], ("gpt2", "modern"): [3.30, 3.31, 3.29],
              ("rope", "modern"): [3.45, 3.44, 3.46]}
    rows = [{"group": f"{v}@{r}", "variant": v, "slice": r, "size": "", "seed": 1337 + i, "val_bpb": bpb,
             "val_loss": bpb * 0.69, "params": 10, "tokens_per_s": 1.0, "peak_mib": 1.0, "kv_bytes_per_token": 4,
             "decode_tok_s": 1.0, "flops_per_token": 100} for (v, r), seeds in values.items()
            for i, bpb in enumerate(seeds)]
    rows.append({**rows[-1], "seed": 1340, "error": "out of memory"})
    groups = {g["group"]: g for g in summarise(rows, "gpt2", 0.05)}
    expected = scipy_stats.ttest_ind(values["rope", "gpt2"], values["gpt2", "gpt2"], equal_var=False,
                                     alternative="less").pvalue
    assert groups["rope@gpt2"]["p"] == pytest.approx(expected) and groups["rope@gpt2"]["verdict"] == "better"
    assert groups["diff@gpt2"]["verdict"] == "n.s." and groups["rope@modern"]["verdict"] == "worse"
    assert groups["gpt2@modern"]["verdict"] == "baseline" and math.isnan(groups["gpt2@modern"]["p"])
    assert groups["rope@modern"]["delta_bpb"] == pytest.approx(3.45 - 3.30)
    assert (groups["rope@modern"]["seeds"], groups["rope@modern"]["failed"]) == (3, 1)
    table = leaderboard([g for g in groups.values() if g["slice"] == "gpt2"])
    assert table.splitlines()[2].startswith("| 1 | rope | 0.000M | 100 | 3.4000 ± 0.0100 | -0.1100 |")


def test_runs_spread_over_devices_one_at_a_time_each_and_stop_when_asked():
    busy, ran, lock = {}, [], threading.Lock()

    def runner(job, device):
        with lock:
            assert not busy.get(device), f"{device} got a second job while busy"
            busy[device] = True
        time.sleep(0.02)
        with lock:
            busy[device] = False
            ran.append((job, device))
        return {"job": job}

    seen = []
    arena_runs.run_all(list(range(9)), ["cuda:0", "cuda:1", "cuda:2"], runner, lambda job, r: seen.append(job))
    assert sorted(j for j, _ in ran) == list(range(9)) and sorted(seen) == list(range(9))
    assert {d for _, d in ran} == {"cuda:0", "cuda:1", "cuda:2"}
    ran.clear()
    arena_runs.run_all(list(range(9)), ["cuda:0", "cuda:1"], runner, lambda job, r: job == 0)
    assert len(ran) < 9  # after the stop, no device took a new job (those running finished)
    ran.clear()
    arena_runs.run_all(list(range(3)), ["cpu"], runner, lambda job, r: False)
    assert ran == [(0, "cpu"), (1, "cpu"), (2, "cpu")]  # one device: in order, one after another


def test_a_folder_of_another_configuration_or_a_damaged_result_is_refused(tmp_path):
    run = dict(variant_runs(arena_config("arena.variants=[gpt2]", "device=cpu", f"out_dir={tmp_path}")))
    cell = run["gpt2/seed1337"]
    folder = tmp_path / "gpt2" / "seed1337"
    arena_runs.start(folder, cell)
    arena_runs.check_folder(folder, cell)  # the same configuration: resumed
    other = dict(variant_runs(arena_config("arena.variants=[gpt2]", "device=cpu", f"out_dir={tmp_path}",
                                           "train.learning_rate=1e-4")))["gpt2/seed1337"]
    with pytest.raises(ConfigError, match=r"holds an arena run of another configuration \(train.learning_rate "):
        arena_runs.check_folder(folder, other)
    assert arena_runs.finished(folder) is None
    (folder / arena_runs.RESULT_FILE).write_text('{"val_bpb": "3.1"')
    with pytest.raises(UserError, match="not valid JSON"):
        arena_runs.finished(folder)
    (folder / arena_runs.RESULT_FILE).write_text('{"val_bpb": "3.1"}')
    with pytest.raises(UserError, match="params is missing or not a number"):
        arena_runs.finished(folder)


def per_seed(out) -> dict[tuple[str, str], dict[str, str]]:
    with open(out / "arena.csv") as f:
        return {(r["group"], r["seed"]): r for r in csv.DictReader(f)}


@pytest.mark.slow
def test_quick_arena_with_three_seeds_of_three_designs_reports_means_stds_and_p_values(tmp_path, data_args):
    out = tmp_path / "arena"
    started = time.monotonic()
    result = run_script("arena", *FAST, "arena.seeds=3", "arena.variants=[gpt2,rope,'alibi+qk_norm+sink']",
                        f"out_dir={out}", *data_args, timeout=300, env=ONE_THREAD)
    assert result.returncode == 0, result.stderr[-3000:]
    assert time.monotonic() - started < 300  # the Done-when: at most 5 minutes on 2 cores
    rows = per_seed(out)
    groups = ("gpt2", "rope", "alibi_qk_norm_sink")
    assert sorted(rows) == sorted((g, str(s)) for g in groups for s in (1337, 1338, 1339))
    for row in rows.values():
        assert row["error"] == "" and int(row["tokens"]) == 8192 and 0 < float(row["val_bpb"]) < 10
        assert int(row["flops_per_token"]) > 0 and float(row["train_flops"]) == int(row["flops_per_token"]) * 8192
    assert len({rows["gpt2", s]["val_bpb"] for s in ("1337", "1338", "1339")}) == 3  # the seeds differ
    # every parameter counted: alibi drops the 32 x 32 position table, adds 2 layers x (16 + 16 gains + 2 sinks)
    assert int(rows["gpt2", "1337"]["params"]) - int(rows["alibi_qk_norm_sink", "1337"]["params"]) == 32 * 32 - 68
    assert float(rows["gpt2", "1337"]["kv_bytes_per_token"]) == 2 * 2 * 32 * 4  # 2 layers x (k + v) x 32 x fp32
    with open(out / "arena_summary.csv") as f:
        summary = {r["group"]: r for r in csv.DictReader(f)}
    bpb = [float(rows["rope", s]["val_bpb"]) for s in ("1337", "1338", "1339")]
    assert float(summary["rope"]["val_bpb_mean"]) == pytest.approx(sum(bpb) / 3)
    assert 0 < float(summary["rope"]["p"]) < 1 and summary["gpt2"]["verdict"] == "baseline"
    table = (out / "arena.md").read_text()
    assert "| rank | variant | params | FLOPs/token | val bits/byte | vs baseline | p |" in table
    assert " ± " in table and "Welch's one-sided t-test" in table and "3 seeds (1337 to 1339)" in table
    for picture in ("arena_loss.png", "arena_attention.png"):
        assert (out / picture).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    # one seed again, alone, in another folder: the same numbers, bit for bit (in a fork: one thread, as above)
    again = run_forked("arena", *FAST, "seed=1338", "arena.variants=[rope]", f"out_dir={tmp_path / 'again'}",
                       *data_args, timeout=300, env=ONE_THREAD)
    assert again.returncode == 0, again.stderr[-3000:]
    rerun = per_seed(tmp_path / "again")["rope", "1338"]
    for key in ("val_loss", "val_bpb", "params", "steps", "tokens"):
        assert rerun[key] == rows["rope", "1338"][key], key


@pytest.mark.slow
def test_an_interrupted_arena_resumes_where_it_stopped_and_gives_the_same_table(tmp_path, data_args):
    args = [*FAST, "arena.flops=1.2e10", "arena.variants=[gpt2,rope]", *data_args]  # ~136 steps: seconds to stop it
    straight = run_script("arena", *args, f"out_dir={tmp_path / 'straight'}", timeout=300, env=ONE_THREAD)
    assert straight.returncode == 0, straight.stderr[-3000:]
    out = tmp_path / "stopped"
    command = [sys.executable, str(ROOT / "scripts" / "arena.py"), *args, f"out_dir={out}"]
    env = {**os.environ, **ONE_THREAD, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # a group of its own, as a terminal's Ctrl-C reaches it
    second = out / "rope" / "seed1337"
    deadline = time.monotonic() + 240
    while not (second / "ckpt.pt").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C while the second design trains
    stdout, stderr = proc.communicate(timeout=120)
    assert (out / "gpt2" / "seed1337" / arena_runs.RESULT_FILE).exists(), stderr[-3000:]
    assert not (second / arena_runs.RESULT_FILE).exists() and (second / "ckpt.pt").exists(), stdout[-3000:]
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]  # exit 130, one line, as any script
    assert proc.returncode == 130 and "Traceback" not in stderr and len(errors) == 1, stderr[-3000:]
    assert "interrupted (Ctrl-C): 1 of 2 runs finished" in errors[0] and "run the same command again" in errors[0]
    resumed = run_script("arena", *args, f"out_dir={out}", timeout=300, env=ONE_THREAD)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "1 of 2 runs finished already" in resumed.stdout and "[gpt2 seed" not in resumed.stdout  # not redone
    log = (second / "train.log").read_text()  # two starts; the second continued from a checkpoint, not from step 0
    assert log.count("\nmodel: ") + log.startswith("model: ") == 2 and "step 0:" not in log.rsplit("model: ", 1)[1], (
        stdout[-2000:])
    a, b = per_seed(tmp_path / "straight"), per_seed(out)
    assert sorted(a) == sorted(b)
    for key in a:
        for column in ("val_loss", "val_bpb", "params", "steps", "tokens", "flops_per_token", "kv_bytes_per_token"):
            assert a[key][column] == b[key][column], (key, column)


def test_a_resumed_runs_curve_counts_seconds_from_its_first_evaluation_not_backwards(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    from gpt.arena.arena import loss_curve

    writer = SummaryWriter(str(tmp_path))  # evaluations at steps 0, 10 before an interruption; 10 again, 20 after
    for step, wall, val in [(0, 1000.0, 3.0), (10, 1004.0, 2.5), (10, 1500.0, 2.5), (20, 1503.0, 2.0)]:
        writer.add_scalar("val/loss", val, step, walltime=wall)
        writer.add_scalar("train/eval_loss", val + 0.1, step, walltime=wall)
    writer.close()
    curve = loss_curve(tmp_path, tokens_per_step=100, started=1499.0)
    assert [(p["tokens"], p["seconds"], p["val"]) for p in curve] == [(0, 0.0, 3.0), (1000, 5.0, 2.5),
                                                                       (2000, 8.0, 2.0)]

"""Layouts as an arena axis: layout presets and layouts spelt as overrides, each layer's FLOPs counted by its kind
(so equal-FLOPs budgets stay equal), a user's design as a kind, bad layouts refused in one line, and a quick arena
of a layout beside a uniform design that reads its finished runs back when run again."""

import csv
import math
import re
import shlex

import pytest
from hydra import compose, initialize_config_dir

from conftest import ROOT, run_script
from gpt.arena.plan import LAYOUT_PRESETS, parse_variant, plan, presets
from gpt.designs import loading
from gpt.errors import ConfigError
from gpt.model import design as registry
from gpt.model import flops
from gpt.schema import register, typed

register()

FAST = ["arena.quick=true", "arena.tokens=8192", "arena.eval_tokens=1024", "arena.decode_tokens=8", "device=cpu"]
ONE_THREAD = {"OMP_NUM_THREADS": "1"}  # tiny models: a second thread only contends with whatever else runs



def arena_config(*overrides: str):
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base=None):
        return typed(compose(config_name="arena", overrides=list(overrides)))


def per_seed(out) -> dict[tuple[str, str], dict[str, str]]:
    with open(out / "arena.csv") as f:
        return {(r["group"], r["seed"]): r for r in csv.DictReader(f)}


KINDS = "model.layer_kinds={T: {designs: [talking_heads, rope]}, R: {designs: [rope]}}"


def test_layout_presets_are_listed_with_the_others_and_size_their_window_to_the_context():
    assert set(LAYOUT_PRESETS) <= set(presets())
    assert parse_variant("local_global_3to1")["layers"] == "SSSL"
    deltanet = parse_variant("deltanet_3to1")
    assert deltanet["layers"] == "DDDG" and deltanet["norm"] == "rmsnorm"
    assert deltanet["layer_kinds"]["G"]["designs"] == ["gated", "rope"]
    cfg = arena_config("arena.variants=[rope,local_global_1to1,'local_global_1to1+model.window=4']",
                       "model.block_size=64", "model.n_layer=2", "device=cpu")
    cells = {c.group: c.run.model for c in plan(cfg)}
    assert cells["rope"].window is None and cells["local_global_1to1"].window == 16  # a quarter of 64
    local = cells["local_global_1to1_window=4"].build(256)
    assert local.layer(0).window == 4 and local.layer(1).window is None  # the global kind stays global


def test_equal_flops_counts_each_layer_of_its_kind():
    cfg = arena_config("arena.variants=[rope,local_global_3to1,nope_every_4th,deltanet_3to1]", "arena.flops=1e10",
                       "model.vocab_size=256", "arena.quick=true", "arena.sizes=['model.n_layer=4']", "device=cpu")
    cells = {c.group.split("@")[0]: c for c in plan(cfg)}
    per_step = 16 * 32  # batch x the quick model's context
    rest = set()  # what is not attention (MLPs, head) is the same in every cell: each layer counts its own kind
    for name, cell in cells.items():
        model = cell.run.model.build(256)
        rest.add(cell.flops_per_token - sum(flops.attention_layer(model.layer(i), 32) for i in range(4)))
        spent = cell.run.train.max_iters * per_step * cell.flops_per_token
        assert 1e10 <= spent < 1e10 + per_step * cell.flops_per_token, name  # equal compute, to a step
    assert len(rest) == 1
    deltanet = cells["deltanet_3to1"].run.model.build(256)
    assert flops.attention_layer(deltanet.layer(0), 32) != flops.attention_layer(deltanet.layer(3), 32)
    assert cells["deltanet_3to1"].flops_per_token > cells["rope"].flops_per_token  # the delta rule's products
    assert cells["deltanet_3to1"].run.train.max_iters < cells["rope"].run.train.max_iters


def load_talking_heads(folder) -> None:
    """docs/designs.md's design, loaded from a file as designs=[talking_heads.py] does (once per process)."""
    if "talking_heads" not in registry.available():
        text = (ROOT / "docs" / "designs.md").read_text()
        code = re.search(r"^```python file=talking_heads\.py\n(.*?)^```$", text, flags=re.S | re.M).group(1)
        (folder / "talking_heads.py").write_text(code)
        loading.load(str(folder / "talking_heads.py"))


def test_a_users_design_is_a_layer_kind_with_its_own_flops(tmp_path):
    load_talking_heads(tmp_path)
    layout = f"model.layers=TR+{KINDS}"
    cfg = arena_config(f"arena.variants=[rope,'{layout}',talking_heads+rope]", "arena.flops=1e10",
                       "model.vocab_size=256", "arena.quick=true", "device=cpu")
    cells = {c.variant: c for c in plan(cfg)}
    mixed = cells["layers=TR_layer_kinds=_T_designs_talking_heads_rope_R_designs_rope"]
    layers = mixed.run.model.build(256)
    assert layers.layer(0).designs == ["rope", "talking_heads"] and layers.layer(1).designs == ["rope"]
    # one T layer and one R layer: half of the uniform talking-heads model's count plus half of RoPE's
    assert 2 * mixed.flops_per_token == cells["talking_heads_rope"].flops_per_token + cells["rope"].flops_per_token
    assert cells["talking_heads_rope"].flops_per_token > cells["rope"].flops_per_token


@pytest.mark.parametrize("variant, message", [
    ("local_global_2to1", r"unknown preset 'local_global_2to1'"),
    ("local_global_3to1", r"arena variant 'local_global_3to1': model.layers=SSSL has 4 letters, which does not "
                          r"divide model.n_layer=2"),
    ("'model.layers=SX+model.layer_kinds={S: {window: 4}}'", r"names kind 'X', which model.layer_kinds does not "
                                                            r"define"),
    ("'model.layers=SL+model.layer_kinds={S: [window'", r"model.layer_kinds=.* is not valid YAML"),
])
def test_a_bad_layout_is_refused_in_one_line_before_anything_runs(variant, message):
    with pytest.raises(ConfigError, match=message) as err:
        arena_config(f"arena.variants=[rope,{variant}]", "arena.quick=true", "device=cpu")
    if "unknown" in message:  # the hint lists every valid preset, the layouts among them
        assert all(name in err.value.hint for name in LAYOUT_PRESETS)


def test_the_docs_arena_commands_with_layouts_compose(tmp_path):
    load_talking_heads(tmp_path)  # as designs=[talking_heads.py] does
    lines = [line.strip().removesuffix("\\").strip() for doc in ("arena.md", "layouts.md")
             for line in (ROOT / "docs" / doc).read_text().splitlines()
             if line.strip().startswith("python scripts/arena.py") and ("layout" in line or "1to1" in line)]
    assert len(lines) == 3  # arena.md: a layout spelt out, a brought design as a kind; layouts.md: presets
    for line in lines:
        overrides = [o for o in shlex.split(line)[2:] if not o.startswith("designs=")]
        assert plan(arena_config(*overrides, "device=cpu"))


@pytest.mark.slow
def test_quick_arena_of_a_layout_beside_a_uniform_design_and_run_again_reads_it_back(tmp_path, data_args):
    out = tmp_path / "arena"
    args = [*FAST, "arena.variants=[rope,local_global_1to1]", f"out_dir={out}", *data_args]
    first = run_script("arena", *args, timeout=300, env=ONE_THREAD)
    assert first.returncode == 0, first.stderr[-3000:]
    rows = per_seed(out)
    assert sorted(rows) == [("local_global_1to1", "1337"), ("rope", "1337")]
    for row in rows.values():
        assert row["error"] == "" and 0 < float(row["val_bpb"]) < 10 and int(row["tokens"]) == 8192
    # measured KV bytes: rope keeps 32 tokens in each of 2 layers; the layout 8 (its window) + 32 of 2 x 32
    assert float(rows["rope", "1337"]["kv_bytes_per_token"]) == 2 * 2 * 32 * 4
    assert math.isclose(float(rows["local_global_1to1", "1337"]["kv_bytes_per_token"]), 2 * 32 * 4 * (8 + 32) / 32)
    assert rows["rope", "1337"]["flops_per_token"] == rows["local_global_1to1", "1337"]["flops_per_token"]
    with open(out / "arena_summary.csv") as f:
        assert {r["group"] for r in csv.DictReader(f)} == {"rope", "local_global_1to1"}
    again = run_script("arena", *args, timeout=300, env=ONE_THREAD)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "2 of 2 runs finished already" in again.stdout and "[local_global_1to1 seed" not in again.stdout
    assert per_seed(out) == rows


def test_the_probes_name_layouts_as_the_arena_does_with_the_window_sized_to_each_tasks_context():
    from gpt.probes import probe

    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base=None):
        cfg = typed(compose(config_name="probe", overrides=["model.n_layer=2", "probes.tasks=[passkey]",
                                                             "probes.designs=[rope,local_global_1to1]"]))
    cell = next(c for c in probe.plan(cfg) if c.design == "local_global_1to1")
    assert cell.model.layers == "SL" and cell.model.window == cell.model.block_size // 4
    assert cell.model.layer(1).window is None

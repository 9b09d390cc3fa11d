"""scripts/probe.py: the quick card through the real script (every task, two designs, two seeds: accuracies,
p-values, composite, CSV), a rerun that reads every finished cell back, a tampered result or another configuration
in the folder refused, and bad input as one error line each."""

import csv
import json
import math
import re
import shlex

import pytest
from hydra import compose, initialize_config_dir
from test_report import ARENA, summary
from test_short_conv import short_conv

from conftest import ROOT, run_inline, run_script
from gpt.arena import runs as arena_runs
from gpt.errors import ConfigError, UserError
from gpt.probes import cells as probe_cells
from gpt.probes.probe import ProbeConfig, effective, plan
from gpt.probes.registry import build, task_names
from gpt.schema import register, typed

register()
ONE_THREAD = {"OMP_NUM_THREADS": "1"}
QUICK = ["probes.quick=true", "probes.designs=[gpt2,linear]", "probes.seeds=2"]
SMALL = re.search(r'^    SMALL="(.*)"$', (ROOT / "docs" / "probes.md").read_text(), flags=re.M)


def probe_config(*overrides: str) -> ProbeConfig:
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base=None):
        return typed(compose(config_name="probe", overrides=list(overrides)))


def test_each_design_gets_its_fields_the_tasks_context_and_vocabulary():
    cfg = probe_config("probes.designs=[gpt2,linear,window]", "probes.tasks=[mqar,passkey]", "probes.seeds=2",
                       "probes.mqar_pairs=[4,8]")
    cells = plan(cfg)
    assert [(c.task, c.design, c.seed) for c in cells[:3]] == [("mqar@4", "gpt2", 1), ("mqar@4", "gpt2", 2),
                                                               ("mqar@4", "linear", 1)]
    assert len(cells) == 3 * 3 * 2
    by = {(c.task, c.design): c.model for c in cells}
    assert by["mqar@4", "linear"].designs == ["linear"] and by["mqar@4", "window"].window == 16
    assert by["mqar@4", "gpt2"].n_embd == 64 and by["mqar@4", "gpt2"].vocab_size == 1024
    assert by["passkey", "gpt2"].block_size == 8 * 64  # scored up to 8x the training context


def test_a_tampered_result_or_another_configuration_is_refused(tmp_path):
    cfg = probe_config(*QUICK, "probes.tasks=[memorization]", f"out_dir={tmp_path}")
    cell = plan(cfg)[0]
    folder = tmp_path / "memorization" / "gpt2" / "seed1"
    arena_runs.start(folder, cell)
    arena_runs.check_folder(folder, cell)
    other = plan(probe_config(*QUICK, "probes.tasks=[memorization]", f"out_dir={tmp_path}",
                              "probes.learning_rates=[2e-3]"))[0]
    with pytest.raises(ConfigError, match=r"another configuration \(settings.learning_rates differs\)"):
        arena_runs.check_folder(folder, other)
    good = {"metrics": {"memorization": 0.5}, "lr": 0.001, "val": 0.4, "sweep": {"0.001": 0.4}, "params": 10,
            "train_s": 1.0}
    arena_runs.save(folder, good)
    assert probe_cells.finished(cell, ["memorization"], [0.001])["metrics"] == {"memorization": 0.5}
    for change, message in [({"metrics": {"memorization": 1.5}}, r"metrics.memorization must be a number in \[0, 1\]"),
                            ({"lr": 0.01}, "lr must be one of the sweep's"),
                            ({"extra": 1}, "'extra' is not a field a probe result holds"),
                            ({"metrics": {}}, "metrics must hold memorization")]:
        arena_runs.save(folder, {**good, **change})
        with pytest.raises(UserError, match=message):
            probe_cells.finished(cell, ["memorization"], [0.001])


def test_a_corpus_result_holds_bits_per_byte_and_a_negative_or_non_number_one_is_refused(tmp_path):
    cfg = probe_config(*QUICK, "probes.tasks=[corpus]", f"out_dir={tmp_path}")
    cell = plan(cfg)[0]  # validated only: the corpus's vocabulary a placeholder, the data not opened
    assert (cell.task, cell.model.block_size, cell.settings["corpus_lengths"]) == ("corpus", 32, [1, 2])
    assert "corpus_lengths" not in plan(probe_config(*QUICK, "probes.tasks=[induction]"))[0].settings
    folder = tmp_path / "corpus" / "gpt2" / "seed1"
    arena_runs.start(folder, cell)
    good = {"metrics": {"corpus@1x": 3.2, "corpus@2x": 4.1}, "lr": 0.001, "val": 3.3, "sweep": {"0.001": 3.3},
            "params": 10, "train_s": 1.0}
    arena_runs.save(folder, good)
    assert probe_cells.finished(cell, ["corpus@1x", "corpus@2x"], [0.001], math.inf)["val"] == 3.3
    with pytest.raises(UserError, match=r"corpus@1x must be a number in \[0, 1\], got 3.2"):  # as an accuracy
        probe_cells.finished(cell, ["corpus@1x", "corpus@2x"], [0.001])
    for change in ({"val": -0.5}, {"metrics": {"corpus@1x": "3.2", "corpus@2x": 4.1}}):
        arena_runs.save(folder, {**good, **change})
        with pytest.raises(UserError, match="must be a number"):
            probe_cells.finished(cell, ["corpus@1x", "corpus@2x"], [0.001], math.inf)


@pytest.mark.slow
def test_quick_card_runs_every_task_reports_p_and_composite_and_a_rerun_reads_it_back(tmp_path, data_args):
    out = tmp_path / "card"
    first = run_script("probe", *QUICK, *data_args, f"out_dir={out}", "probes.workers=2",
                       env=ONE_THREAD)  # a thread each
    assert first.returncode == 0, first.stderr[-3000:]
    text = (out / "probes.md").read_text()
    metrics = [m for t in build(task_names(), effective(probe_config(*QUICK).probes)) for m in t.metrics()]
    assert metrics[:2] == ["mqar@2", "in_context_recall"] and "passkey@2x" in metrics
    assert metrics[-2:] == ["corpus@1x", "corpus@2x"]  # the corpus's bits per byte at 1x and 2x the context
    header = text.splitlines()[2]
    assert header == "| design | " + " | ".join(metrics) + " | composite |"
    linear = next(line for line in text.splitlines() if line.startswith("| linear |"))
    assert linear.count(", p ") == len(metrics) + 1 and " ± " in linear
    with open(out / "probes.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 * 2 * len(metrics)
    assert all(0 <= float(r["score"]) <= 1 for r in rows if r["task"] != "corpus")
    bpb = [float(r["score"]) for r in rows if r["task"] == "corpus"]  # 6 steps: near the uniform log2(vocab)
    assert len(bpb) == 2 * 2 * 2 and all(3 < b < 8 for b in bpb)
    assert (out / "probes_corpus.png").is_file() and "lower is better, not in the composite" in text
    with open(out / "probes_summary.csv") as f:
        composite = [float(r["mean"]) for r in csv.DictReader(f) if r["metric"] == "composite"]
    accuracies = [[float(r["score"]) for r in rows if r["design"] == d and r["task"] != "corpus"]
                  for d in ("gpt2", "linear")]
    assert composite == pytest.approx([sum(a) / len(a) for a in accuracies])  # the accuracies' mean alone
    again = run_inline("probe", *QUICK, *data_args, f"out_dir={out}")  # reads back, trains nothing: no process
    assert again.returncode == 0, again.stderr[-3000:]
    assert "40 runs (40 finished already" in again.stdout and (out / "probes.md").read_text() == text
    result = out / "mqar@2" / "linear" / "seed2" / arena_runs.RESULT_FILE
    result.write_text(json.dumps({**json.loads(result.read_text()), "val": 2.0}))
    tampered = run_inline("probe", *QUICK, *data_args, f"out_dir={out}")
    assert tampered.returncode == 2 and tampered.stderr.count("error:") == 1
    assert "val must be a number in [0, 1]" in tampered.stderr and "Traceback" not in tampered.stderr


@pytest.mark.parametrize("override, message", [
    ("probes.tasks=[mqar,recal]", "unknown task 'recal'"),
    ("probes.mqar_pairs=[40]", "40 key-value pairs and their 40 queries need an even context of at least 160"),
    ("probes.vocab=20", "probes.vocab=20 holds 9 keys, fewer than 16 pairs"),
    ("probes.seeds=0", "probes.seeds must be positive"),
    ("probes.steps=-3", "probes.steps must be positive"),
    ("seed=0", "seed must be in [1, "),
    ("probes.designs=[gpt2,'model.block_size=32']", "cannot run mqar@4: its context (block_size=32) is shorter"),
    ("probes.designs=[gpt2,hyena]", "unknown preset 'hyena'"),
    ("probes.learning_rates=[]", "probes.learning_rates must be rates in (0, 1)"),
    ("probes.corpus_lengths=[1,-2]", "probes.corpus_lengths must be positive multiples of probes.seq_len"),
    ("probes.corpus_lengths=[]", "probes.corpus_lengths must be positive multiples of probes.seq_len"),
])
def test_bad_input_is_one_error_line_and_exit_2(override, message):
    result = run_inline("probe", override, "out_dir=/nonexistent/never")
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("error:") == 1 and message in result.stderr and "Traceback" not in result.stderr
    if "unknown task" in message:
        assert "the tasks: mqar, in_context_recall, noisy_recall" in result.stderr


def test_the_docs_commands_compose_and_the_first_is_the_quick_card_the_suite_runs(tmp_path):
    text = (ROOT / "docs" / "probes.md").read_text().replace("\\\n", " ")  # continued lines joined
    text = re.sub(r"\$SMALL\b", SMALL.group(1), text)  # the reduced card's sizes, as the doc defines them
    commands = [shlex.split(line.split("python scripts/probe.py", 1)[1]) for line in text.splitlines()
                if "python scripts/probe.py" in line and line.startswith("    ")]
    assert len(commands) >= 5 and commands[0][:-1] == QUICK and commands[0][-1].startswith("out_dir=")
    short_conv(tmp_path)  # the doc's design file, as designs=[short_conv.py] loads it
    summary(tmp_path / "arena_summary.csv", ARENA)  # an arena's summary where the doc names a measured one
    for args in commands:
        args = [f"probes.arena={tmp_path}" if a.startswith("probes.arena=") else a for a in args
                if not a.startswith("designs=")]
        assert plan(probe_config(*args))  # every override typed and every cell's model valid


@pytest.mark.slow
def test_a_users_design_file_gets_a_card_beside_the_built_in_ones(tmp_path):
    text = (ROOT / "docs" / "designs.md").read_text()
    code = re.search(r"^```python file=talking_heads\.py\n(.*?)^```$", text, flags=re.S | re.M).group(1)
    (tmp_path / "talking_heads.py").write_text(code)
    out = tmp_path / "card"
    # a process of its own, as a user's: tests in this worker may have loaded a talking_heads from another file
    # (a module that loads one when collected adds it to GPT_DESIGNS, which the scripts it starts would inherit)
    result = run_script("probe", f"designs=[{tmp_path / 'talking_heads.py'}]", "probes.quick=true",
                        "probes.designs=[gpt2,talking_heads]", "probes.tasks=[induction]", f"out_dir={out}",
                        env={"GPT_DESIGNS": ""})
    assert result.returncode == 0, result.stderr[-2000:]
    card = (out / "probes.md").read_text()
    assert "| talking_heads | " in card and (out / "induction" / "talking_heads" / "seed3").is_dir()

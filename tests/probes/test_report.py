"""The card's report beyond the table: the validity check (Spearman's rho against scipy's and a hand-computed case,
its bootstrap interval, the arena's summary read and a damaged one refused in one line, the card's section) and the
pictures (accuracy by pairs, retrieval by length), from stored per-seed results: nothing trains."""

import csv
import math

import numpy as np
import pytest

from conftest import run_inline
from gpt.arena.report import SUMMARY, write_csv
from gpt.errors import UserError
from gpt.probes import plots, validity
from gpt.probes.report import summarise, write_reports


def test_rho_is_spearmans_by_hand_and_as_scipy_computes_it_with_ties():
    # no ties: rho = 1 - 6 sum d^2 / (n (n^2 - 1)) = 1 - 6 * 2 / 60
    assert validity.spearman(np.array([1.0, 2, 3, 4]), np.array([1.0, 3, 2, 4])) == pytest.approx(0.8, abs=1e-15)
    assert validity.spearman(np.array([1.0, 2, 3]), np.array([3.0, 2, 1])) == pytest.approx(-1.0, abs=1e-15)
    assert math.isnan(validity.spearman(np.array([1.0, 2, 3]), np.array([2.0, 2, 2])))  # no order to agree with
    np.testing.assert_array_equal(validity.ranks(np.array([3.0, 1, 3, 2])), [3.5, 1, 3.5, 2])
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(5)
    for n in (3, 5, 10, 30):
        x, y = rng.integers(0, 4, n).astype(float), rng.normal(size=n)  # x full of ties
        if len(set(x)) > 1:
            assert validity.spearman(x, y) == pytest.approx(stats.spearmanr(x, y).statistic, abs=1e-12)
    batch = rng.normal(size=(7, 6)), rng.normal(size=(7, 6))  # one rho per row
    assert validity.spearman(*batch) == pytest.approx([stats.spearmanr(a, b).statistic for a, b in zip(*batch)])


def test_the_bootstrap_interval_holds_rho_is_reproducible_and_skips_draws_without_order():
    x = np.array([0.9, 0.7, 0.8, 0.4, 0.5, 0.2, 0.3, 0.1])
    y = np.array([3.1, 3.2, 3.4, 3.3, 3.5, 3.7, 3.6, 3.9])
    rho = float(validity.spearman(x, y))
    low, high, used = validity.bootstrap(x, y, resamples=2000)
    assert -1 <= low < rho < high <= 1 and high < 0  # clearly negative: the interval excludes 0
    assert (low, high, used) == validity.bootstrap(x, y, resamples=2000)  # a fixed seed
    assert used == 2000 and validity.bootstrap(x[:3], y[:3], resamples=900)[2] < 900  # of 3 designs, one in 9
    # draws is one design three times: no order, no rho, left out
    assert validity.bootstrap(x, -x, resamples=500)[:2] == pytest.approx((-1.0, -1.0))  # a perfect order stays


def summary(path, rows):
    defaults = {"seeds": 3, "failed": 0, "size": ""}
    write_csv(path, SUMMARY, [{**defaults, **r} for r in rows], "a test summary")


ARENA = [{"group": f"{v}@n_embd={w}", "variant": v, "slice": f"n_embd={w}", "val_bpb_mean": bpb}
         for w, values in ((64, (3.43, 3.16, 3.45, 3.65)), (96, (3.23, 3.02, 3.31, 3.10)))
         for v, bpb in zip(("gpt2", "rope", "linear", "diff"), values)]


def test_an_arena_summary_reads_per_slice_and_a_damaged_one_is_refused_naming_where(tmp_path):
    summary(tmp_path / "arena_summary.csv", ARENA + [{"group": "mla@n_embd=64", "variant": "mla",
                                                      "slice": "n_embd=64", "seeds": 0, "val_bpb_mean": "nan"}])
    read = validity.read_arena(str(tmp_path))  # the out_dir, or the file itself
    assert read == validity.read_arena(str(tmp_path / "arena_summary.csv"))
    assert read["n_embd=64"] == {"gpt2": 3.43, "rope": 3.16, "linear": 3.45, "diff": 3.65}  # mla: no seed finished
    assert list(read) == ["n_embd=64", "n_embd=96"]
    bad = tmp_path / "bad.csv"
    for rows, message in [([{**ARENA[0], "val_bpb_mean": "-1"}], "line 2: val_bpb_mean must be a positive number"),
                          ([ARENA[0], {**ARENA[1], "seeds": "x"}], "line 3: seeds must be a number, got 'x'"),
                          ([ARENA[0], {**ARENA[0], "group": "again"}], "variant 'gpt2' appears twice"),
                          ([{**ARENA[0], "seeds": 0}], "holds no finished group")]:
        summary(bad, rows)
        with pytest.raises(UserError, match=message):
            validity.read_arena(str(bad))
    for text, message in [("group,variant\ngpt2,gpt2\n", "has no column slice"), (b"\xff\xfe", "is not UTF-8"),
                          ("variant,slice,seeds,val_bpb_mean\ngpt2,,3,3.2,extra\n", "one value per column")]:
        bad.write_bytes(text if isinstance(text, bytes) else text.encode())
        with pytest.raises(UserError, match=message):
            validity.read_arena(str(bad))
    with pytest.raises(UserError, match="cannot be read"):
        validity.read_arena(str(tmp_path / "missing.csv"))


def rows(accuracies, metrics=("mqar@4",)):
    """Per-seed card rows as gpt.probes.cells gives them: one task, three seeds per design."""
    return [{"task": "mqar@4", "design": d, "seed": s, "metrics": {m: a + 0.01 * s for m in metrics}, "lr": 1e-3,
             "val": a, "params": 1, "train_s": 1.0, "spec": d} for d, a in accuracies.items() for s in (1, 2, 3)]


def test_the_card_prints_rho_and_its_interval_per_arena_slice_and_writes_its_csv(tmp_path):
    summary(tmp_path / "arena_summary.csv", ARENA)
    out, said = tmp_path / "card", []
    accuracies = {"gpt2": 0.5, "rope": 0.9, "linear": 0.3, "diff": 0.1, "window": 0.2}  # window: not in the arena
    write_reports(out, "heading", rows(accuracies), "gpt2", 0.05, said.append, arena=str(tmp_path))
    text = (out / "probes.md").read_text()
    with open(out / "probes_validity.csv") as f:
        found = list(csv.DictReader(f))
    assert [r["slice"] for r in found] == ["n_embd=64", "n_embd=96"]
    # by hand: the composite's ranks 3,4,2,1 against the bits per byte's 2,1,3,4 (64 wide) and 3,1,4,2 (96 wide)
    assert [float(r["rho"]) for r in found] == pytest.approx([-1.0, -0.4])
    assert found[0]["names"] == "gpt2 rope linear diff" and found[0]["designs"] == "4"
    assert "- n_embd=64: rho -1.000, 95% interval [-1.000, -1.000] over 4 designs (gpt2 rope linear diff)" in text
    assert "- n_embd=96: rho -0.400, 95% interval [" in text and text in said[0]
    write_reports(out, "heading", rows({"gpt2": 0.5, "rope": 0.9}), "gpt2", 0.05, said.append, arena=str(tmp_path))
    assert "- n_embd=64: no rho (2 designs in both, at least 3 needed)" in (out / "probes.md").read_text()


def test_a_missing_arena_summary_is_one_error_line_before_anything_runs(tmp_path):
    result = run_inline("probe", "probes.quick=true", f"probes.arena={tmp_path}", f"out_dir={tmp_path / 'out'}")
    assert result.returncode == 2 and result.stderr.count("error:") == 1 and "Traceback" not in result.stderr
    assert "arena_summary.csv cannot be read" in result.stderr and not (tmp_path / "out").exists()


def test_pictures_are_drawn_for_a_task_scored_at_two_points_or_more(tmp_path):
    said = []
    write_reports(tmp_path / "one", "h", rows({"gpt2": 0.5, "linear": 0.3}), "gpt2", 0.05, said.append)
    assert not list((tmp_path / "one").glob("*.png")) and "png" not in said[0]  # one number of pairs: no curve
    metrics = ("mqar@4", "mqar@16", "passkey@1x", "passkey@2x", "passkey@4x", "induction")
    write_reports(tmp_path / "two", "h", rows({"gpt2": 0.5, "linear": 0.3}, metrics), "gpt2", 0.05, said.append)
    for name in ("probes_mqar.png", "probes_passkey.png"):
        assert (tmp_path / "two" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and name in said[1]
    groups = summarise(rows({"gpt2": 0.5, "linear": 0.3}, metrics), "gpt2", 0.05)
    linear = plots.series(groups, plots.FAMILIES["probes_passkey.png"][0])["linear"]
    assert [x for x, _, _ in linear] == [1, 2, 4]  # x ascending; the mean and std over the seeds
    assert np.array([p[1:] for p in linear]) == pytest.approx(np.array([[0.32, 0.01]] * 3))


def test_bits_per_byte_is_better_below_stays_out_of_the_composite_and_gets_its_picture(tmp_path):
    lower = {"corpus@1x", "corpus@2x"}
    scores = {"gpt2": 2.0, "rope": 1.5, "alibi": 2.5}  # bits per byte, each seed + 0.01 * seed
    per_seed = [{**r, "metrics": {**r["metrics"], "corpus@1x": scores[r["design"]] + 0.01 * r["seed"],
                                  "corpus@2x": 2 * scores[r["design"]] + 0.01 * r["seed"]}}
                for r in rows({"gpt2": 0.5, "rope": 0.5, "alibi": 0.5})]
    said = []
    groups = write_reports(tmp_path, "h", per_seed, "gpt2", 0.05, said.append, lower=lower)
    at = {(g["metric"], g["design"]): g for g in groups}
    assert at["corpus@1x", "rope"]["verdict"] == "better" and at["corpus@1x", "alibi"]["verdict"] == "worse"
    assert at["corpus@1x", "rope"]["p_below"] < 1e-6 and at["corpus@1x", "alibi"]["p"] < 1e-6
    assert at["composite", "rope"]["mean"] == pytest.approx(0.52)  # MQAR's accuracy alone, bits per byte left out
    text = (tmp_path / "probes.md").read_text()
    rope = next(line for line in text.splitlines() if line.startswith("| rope |"))
    assert rope.startswith("| rope | 0.520 ± 0.010 (n.s., p 0.5) | 1.520 ± 0.010 (better, p ")
    assert (tmp_path / "probes_corpus.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "probes_corpus.png" in said[0]
    alone = [{**r, "metrics": {m: v for m, v in r["metrics"].items() if m in lower}} for r in per_seed]
    assert "composite" not in {g["metric"] for g in summarise(alone, "gpt2", 0.05, frozenset(lower))}

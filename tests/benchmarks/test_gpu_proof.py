"""scripts/gpu_proof.sh: its dry run runs every part of the GPU proof on the CPU at tiny sizes and writes both
summaries; run again into the same folder it replaces its earlier run; bad arguments get one error line."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from conftest import ROOT

pytestmark = pytest.mark.slow


def proof(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / "scripts" / "gpu_proof.sh"), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


@pytest.fixture(scope="module")
def first_run(tmp_path_factory) -> Path:
    """One dry run's folder (the first of the two runs in a row that the second test makes)."""
    out = tmp_path_factory.mktemp("gpu_proof")
    started = time.time()
    done = proof("--dry-run", "--out", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    print(f"dry run: {time.time() - started:.0f} s")  # the issue asks for under a minute on a quiet 2-core machine
    return out


def test_the_dry_run_runs_every_part_on_the_cpu_and_writes_both_summaries(first_run):
    tmp_path = first_run
    summary = json.loads((tmp_path / "proof.json").read_text())
    parts = summary["parts"]
    assert list(parts) == ["kernels", "train", "decode", "flex", "arena", "fsdp"]
    assert {name: p["status"] for name, p in parts.items()} == {
        "kernels": "ok", "train": "ok", "decode": "ok", "flex": "ok", "arena": "ok", "fsdp": "skipped"}, parts
    kernels = parts["kernels"]
    assert kernels["cells"] >= 12 and kernels["worst"]["fp32"] < 1e-4 and kernels["worst"]["grad"] < 1e-3
    assert {r["design"] for r in kernels["rows"]} == {"gpt2", "window", "mqa"}  # each design: tests/designs/
    assert {r["kernel"] for r in kernels["rows"]} >= {"manual", "sdpa", "flex"}
    train = parts["train"]["rows"][0]
    assert train["bench_tokens_per_s"] > 0 and train["loop_tokens_per_s"] > 0
    assert [r["precision"] for r in parts["decode"]["rows"]] == ["fp32", "bf16"]
    assert parts["decode"]["rows"][0]["same_tokens_as_transformers"] == 1.0  # fp32: the same greedy tokens
    assert parts["flex"]["fallback_warnings"] == [] and all(0 < n < 8 for n in parts["flex"]["compiled_variants"]
                                                            .values())
    assert [r["variant"] for r in parts["arena"]["rows"]] and not parts["arena"]["failed"]
    markdown = (tmp_path / "proof.md").read_text()
    for heading in ("# GPU proof (dry run, CPU)", "## kernels", "## train", "## decode", "## flex", "## arena"):
        assert heading in markdown


def test_a_second_run_into_the_same_folder_replaces_the_first_and_keeps_what_it_did_not_write(first_run):
    """Run again, the proof replaces its own runs (which, as checkpoints, would refuse a second training run) and
    keeps anything else. Only train and arena run again: they are the parts that leave runs behind (the others
    write only their parts/*.json), so the second run proves the replacement without the first run's full cost."""
    out, before = first_run, json.loads((first_run / "proof.json").read_text())
    (out / "arena" / "stale.txt").write_text("the first run's")
    (out / "runs" / "loop_b4" / "stale.txt").write_text("the first run's")
    (out / "notes.txt").write_text("mine")
    (out / "runs" / "mine").mkdir()
    (out / "runs" / "mine" / "ckpt.pt").write_bytes(b"my run")
    done = proof("--dry-run", "--out", str(out), "--parts", "train,arena")
    assert done.returncode == 0, done.stdout + done.stderr
    after = json.loads((out / "proof.json").read_text())
    assert {name: p["status"] for name, p in after["parts"].items()} == {"train": "ok", "arena": "ok"}, after
    assert after["started"] != before["started"] and after["parts"]["train"]["rows"][0]["loop_tokens_per_s"] > 0
    assert not (out / "arena" / "stale.txt").exists() and not (out / "runs" / "loop_b4" / "stale.txt").exists()
    assert (out / "notes.txt").read_text() == "mine" and (out / "runs" / "mine" / "ckpt.pt").read_bytes() == b"my run"
    assert sorted(p.name for p in (out / "parts").iterdir()) == ["arena.json", "arena.log", "train.json", "train.log"]


def test_a_folder_another_program_wrote_is_refused_and_left_as_it_was(tmp_path):
    (tmp_path / "runs" / "loop_b4").mkdir(parents=True)
    (tmp_path / "runs" / "loop_b4" / "ckpt.pt").write_bytes(b"someone's run")
    done = proof("--dry-run", "--out", str(tmp_path), timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith(f"error: --out {tmp_path} holds files that no GPU proof wrote (runs)"), done.stderr
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["ckpt.pt", "loop_b4", "runs"]
    assert (tmp_path / "runs" / "loop_b4" / "ckpt.pt").read_bytes() == b"someone's run"


@pytest.mark.parametrize("args, message", [(["--parts", "kernels,warp"], "error: unknown part(s) warp"),
                                           (["--wheels", "/nonexistent"], "error: --wheels /nonexistent is not a"),
                                           (["--budget-s", "nan"], "error: --budget-s must be a number of seconds"),
                                           (["--jobs", str(2**64)], "error: --jobs must be in [1, 64]")])
def test_bad_arguments_get_one_error_line(args, message):
    done = proof("--dry-run", *args, timeout=120)
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr, done.stderr

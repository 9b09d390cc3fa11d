"""recipe=modern through the real script: Muon and WSD resume bit for bit after SIGKILL, in one process and under
FSDP (2 gloo processes, distributed Muon), and decaying from a kept checkpoint of the stable phase ends where the
straight WSD run ends."""

from __future__ import annotations

import re
import shlex
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from test_fsdp import KILL_BEFORE_COMMIT_AT_STEP_6, full_state, losses
from test_training import assert_same, env, final_state, load, start, wait_for

import conftest
from conftest import ROOT, run_forked, run_inline
from gpt.errors import UserError
from gpt.train import decay
from gpt.train.config import RunConfig, TrainConfig
from gpt.train.decay import decayed_length

pytestmark = pytest.mark.slow

SCRIPT = ROOT / "scripts" / "train.py"
# dropout: the RNG states matter; grad_accum=2; decay_frac=0.25: the last 3 of 12 steps decay
MODERN = ["recipe=modern", "model=tiny", "model.dropout=0.1", "device=cpu", "train.eval_interval=4",
          "train.eval_iters=2", "train.batch_size=4", "train.grad_accum=2", "train.log_interval=1",
          "train.warmup_iters=2", "train.sample_tokens=0", "train.decay_frac=0.25"]


def train(*args: str) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, str(SCRIPT), *MODERN, *args], cwd=ROOT, env=env(), capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_muon_and_wsd_resume_bit_for_bit_after_sigkill(data_args, tmp_path):
    train(*data_args, "train.max_iters=12", f"out_dir={tmp_path / 'straight'}")
    run_dir = tmp_path / "run"
    proc = start(*MODERN, *data_args, "train.max_iters=12", f"out_dir={run_dir}")
    wait_for(proc, "step 6/12")  # past the step-4 checkpoint
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL
    assert load(run_dir)["step"] == 4
    resumed = train(*data_args, "train.max_iters=12", f"out_dir={run_dir}", "resume=true")
    assert f"resumed from {run_dir / 'ckpt.pt'} at step 4" in resumed.stdout
    straight = final_state(tmp_path / "straight")
    muon_state = [s for s in straight["optimizer"]["state"].values() if "momentum_buffer" in s]
    assert len(muon_state) == 8  # 2 layers x (c_attn, c_proj, c_fc, c_proj): their momentum buffers are saved
    assert_same(final_state(run_dir), straight)


def test_decaying_from_a_kept_stable_checkpoint_ends_as_the_straight_wsd_run(data_args, tmp_path):
    stable = train(*data_args, "train.max_iters=16", "train.keep_checkpoints=true", f"out_dir={tmp_path / 'stable'}")
    kept = tmp_path / "stable" / "checkpoints"
    assert sorted(p.name for p in kept.iterdir()) == [f"step-{s:08d}.pt" for s in (0, 4, 8, 12, 16)]
    # the printed command decays from the latest kept checkpoint of the stable phase (16 - 4 decaying steps = 12)
    command = stable.stdout[stable.stdout.index("decay one of the stable phase"):].splitlines()[1]
    args = shlex.split(command)
    assert args[:2] == ["python", "scripts/train.py"] and f"decay_from={kept / 'step-00000012.pt'}" in args
    assert not any(a.startswith(("train.max_iters=", "train.keep_checkpoints=")) for a in args)

    # the decayed and the straight run, which compare bit for bit, each in a fork of this process (one thread each)
    decayed = run_forked("train", *MODERN, *data_args, f"decay_from={kept / 'step-00000008.pt'}",
                         f"out_dir={tmp_path / 'decayed'}")
    assert decayed.returncode == 0, decayed.stderr[-3000:]
    length = decayed_length(8, 0.25)  # 10: round(0.25 * 10) = 2 decaying steps after step 8
    assert f"train.max_iters={length}" in decayed.stdout
    assert f"decaying from {kept / 'step-00000008.pt'} at step 8" in decayed.stdout
    straight = run_forked("train", *MODERN, *data_args, f"train.max_iters={length}", f"out_dir={tmp_path / 'straight'}")
    assert straight.returncode == 0, straight.stderr[-3000:]
    ours, straight = load(tmp_path / "decayed"), load(tmp_path / "straight")
    assert ours["step"] == straight["step"] == length
    assert abs(ours["eval"]["val"] - straight["eval"]["val"]) <= 0.01
    for key, tensor in straight["model"].items():  # on one CPU it is the same run, bit for bit
        assert torch.equal(ours["model"][key], tensor), key

    # refusals: one line, exit 2, nothing written
    first = kept / "step-00000000.pt"
    refused = run_inline("train", *MODERN, *data_args, f"decay_from={first}", f"out_dir={tmp_path / 'refused'}")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-2000:]
    assert refused.stderr.startswith(f"error: {first} was saved at step 0, inside the warmup (train.warmup_iters=2)")
    assert not (tmp_path / "refused").exists()
    run = RunConfig(train=TrainConfig(schedule="wsd", warmup_iters=2), decay_from=str(kept / "step-00000008.pt"))
    for change, message in [({"schedule": "cosine"}, "decay_from needs train.schedule=wsd (this run's is cosine)"),
                            ({"decay_frac": 1.0}, "decay_from needs train.decay_frac below 1")]:
        with pytest.raises(UserError, match=re.escape(message)):
            decay.plan(replace(run, train=replace(run.train, **change)), log=print)
    with pytest.raises(UserError, match="does not exist"):
        decay.plan(replace(run, decay_from=str(tmp_path / "nowhere")), log=print)
    assert decay.plan(run, log=print)[0].train.max_iters == length




FSDP_MODERN = [a for a in MODERN if not a.startswith("train.eval_interval")] + [
    "train.eval_interval=3", "train.max_iters=6", "train.decay_frac=0.5"]


def torchrun(*args: str, cwd: Path, fault: str = "") -> subprocess.CompletedProcess:
    result = conftest.torchrun(SCRIPT, *FSDP_MODERN, *args, cwd=cwd, fault=fault)
    assert fault or result.returncode == 0, conftest.failure_output(result)
    return result


def torchrun_runs(*runs: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """Several runs in turn in one torchrun launch (conftest.torchrun_runs), each with FSDP_MODERN's settings."""
    result = conftest.torchrun_runs(SCRIPT, *([*FSDP_MODERN, *args] for args in runs), cwd=cwd)
    assert result.returncode == 0, conftest.failure_output(result)
    return result


def test_distributed_muon_under_fsdp_matches_ddp_and_resumes_bit_for_bit_after_sigkill(data_args, tmp_path):
    torchrun_runs([*data_args, f"out_dir={tmp_path / 'ddp'}"],  # the two straight runs in one launch
                  [*data_args, f"out_dir={tmp_path / 'fsdp'}", "train.fsdp=true"], cwd=tmp_path)
    run_dir = tmp_path / "run"
    killed = torchrun(*data_args, f"out_dir={run_dir}", "train.fsdp=true", cwd=tmp_path,
                      fault=KILL_BEFORE_COMMIT_AT_STEP_6)
    assert killed.returncode != 0 and (run_dir / "ckpt.dcp" / "latest").read_text() == "step-00000003"
    resumed = torchrun(*data_args, f"out_dir={run_dir}", "train.fsdp=true", "resume=true", cwd=tmp_path)
    assert "step-00000003 at step 3" in resumed.stdout

    ddp, fsdp = losses(tmp_path / "ddp"), losses(tmp_path / "fsdp")
    assert len(ddp) == 6 and fsdp == pytest.approx(ddp, rel=0, abs=1e-5)  # the gathered update is the whole one
    assert losses(run_dir) == fsdp
    reference, ours, whole = full_state(tmp_path / "fsdp"), full_state(run_dir), full_state(tmp_path / "ddp")
    for key, tensor in reference["model"].items():
        assert torch.equal(ours["model"][key], tensor), key
        torch.testing.assert_close(tensor, whole["model"][key], rtol=1e-4, atol=1e-5)
    buffers = {name for name, s in reference["optimizer"]["state"].items() if "momentum_buffer" in s}
    assert len(buffers) == 8
    for name, moments in reference["optimizer"]["state"].items():
        for key, tensor in moments.items():
            assert torch.equal(ours["optimizer"]["state"][name][key], tensor), (name, key)

"""train.fsdp=true: FSDP2 over 2 gloo processes on CPU against DDP, exact resume, checkpoints that resume either way,
and the refusals of what it cannot do."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import conftest
from conftest import ROOT
from gpt.errors import UserError
from gpt.train.config import TrainConfig
from gpt.train.distributed import Ranks
from gpt.train.parallelize import check_fsdp

SCRIPT = ROOT / "scripts" / "train.py"
# dropout: the ranks' RNG states matter; grad_accum=2: FSDP reduce-scatters every micro-step and accumulates shards
RUN = ["model=tiny", "model.dropout=0.1", "device=cpu", "train.eval_interval=3", "train.eval_iters=2",
       "train.batch_size=4", "train.grad_accum=2", "train.log_interval=1", "train.warmup_iters=2",
       "train.lr_decay_iters=6", "train.sample_tokens=0"]


def torchrun(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    result = conftest.torchrun(SCRIPT, *RUN, *args, cwd=cwd)
    assert result.returncode == 0, conftest.failure_output(result)
    return result


def torchrun_runs(*runs: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """Several runs in turn in one torchrun launch (conftest.torchrun_runs), each with RUN's settings."""
    result = conftest.torchrun_runs(SCRIPT, *([*RUN, *args] for args in runs), cwd=cwd)
    assert result.returncode == 0, conftest.failure_output(result)
    return result


def losses(run_dir: Path) -> list[float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    return [e.value for e in events.Scalars("train/loss")]


# Rank 0 is SIGKILLed as it is about to commit the step-6 save: every rank's shards of it are on disk, the
# pointer still names step 3.
KILL_BEFORE_COMMIT_AT_STEP_6 = """
import os, signal
import gpt.weights.sharded as sharded
_commit = sharded.commit
def commit(run_dir, folder):
    if folder.name.endswith("00000006"):
        os.kill(os.getpid(), signal.SIGKILL)
    _commit(run_dir, folder)
sharded.commit = commit
"""


def full_state(run_dir: Path) -> dict:
    """A run's latest checkpoint as one payload of whole tensors (model and optimizer keyed by name)."""
    from gpt.weights import checkpoint
    from gpt.weights import sharded as sharded_checkpoint

    path = checkpoint.latest(run_dir)
    if path.is_dir():
        return sharded_checkpoint.load_full(path, optimizer=True)
    return torch.load(path, weights_only=True)


@pytest.fixture(scope="module")
def fsdp_run(data_args, tmp_path_factory) -> Path:
    """The straight FSDP run both tests below compare against: 6 steps, sharded saves at steps 3 and 6."""
    root = tmp_path_factory.mktemp("fsdp")
    torchrun(*data_args, "train.max_iters=6", "train.fsdp=true", f"out_dir={root / 'run'}", cwd=root)
    return root / "run"


@pytest.mark.slow
def test_fsdp_matches_ddp_combines_with_checkpointing_and_reads_ddp_checkpoints(data_args, fsdp_run, tmp_path):
    run = lambda name, *args: [*data_args, f"out_dir={tmp_path / name}", *args]  # noqa: E731
    # the straight runs in one launch, then the resumes in another (a new start reads each checkpoint back)
    torchrun_runs(run("ddp", "train.max_iters=6"),
                  run("fsdp_ac", "train.max_iters=6", "train.fsdp=true", "train.activation_checkpointing=true"),
                  run("ddp_then_fsdp", "train.max_iters=3"),
                  run("fsdp_then_ddp", "train.max_iters=3", "train.fsdp=true"), cwd=tmp_path)
    torchrun_runs(run("ddp_then_fsdp", "train.max_iters=6", "train.fsdp=true", "resume=true"),
                  run("fsdp_then_ddp", "train.max_iters=6", "resume=true"),  # DCP reshards the saved shards
                  cwd=tmp_path)

    ddp, fsdp = losses(tmp_path / "ddp"), losses(fsdp_run)
    assert len(ddp) == 6 and fsdp == pytest.approx(ddp, rel=0, abs=1e-5)
    assert losses(tmp_path / "fsdp_ac") == fsdp  # activation checkpointing inside FSDP changes no bit
    assert losses(tmp_path / "ddp_then_fsdp") == pytest.approx(ddp, rel=0, abs=1e-5)
    assert losses(tmp_path / "fsdp_then_ddp") == pytest.approx(ddp, rel=0, abs=1e-5)
    assert (tmp_path / "fsdp_then_ddp" / "ckpt.pt").is_file() and not (tmp_path / "fsdp_then_ddp" / "ckpt.dcp").exists()
    # FSDP runs save sharded (a DCP folder per step, one committed); the DDP checkpoint they resumed is replaced
    assert not (fsdp_run / "ckpt.pt").exists() and not (tmp_path / "ddp_then_fsdp" / "ckpt.pt").exists()
    assert [f.name for f in (fsdp_run / "ckpt.dcp").glob("step-*")] == ["step-00000006"]
    sharded, whole = full_state(fsdp_run), full_state(tmp_path / "ddp")
    for key, tensor in sharded["model"].items():
        torch.testing.assert_close(tensor, whole["model"][key], rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_a_sharded_save_killed_before_its_commit_resumes_exactly_and_consolidates(data_args, fsdp_run, tmp_path):
    from gpt.weights import sharded as sharded_checkpoint
    from gpt.weights.load import load_model

    common = [*RUN, *data_args, "train.max_iters=6", "train.fsdp=true"]
    killed = conftest.torchrun(SCRIPT, *common, f"out_dir={tmp_path / 'run'}", cwd=tmp_path,
                               fault=KILL_BEFORE_COMMIT_AT_STEP_6)
    assert killed.returncode != 0
    run_dir = tmp_path / "run"
    assert (run_dir / "ckpt.dcp" / "latest").read_text() == "step-00000003"
    assert (run_dir / "ckpt.dcp" / "step-00000006" / ".metadata").is_file()  # written, never committed
    resumed = conftest.torchrun(SCRIPT, *common, f"out_dir={run_dir}", "resume=true", cwd=tmp_path)
    assert resumed.returncode == 0, conftest.failure_output(resumed)
    assert "resumed from" in resumed.stdout and "step-00000003 at step 3" in resumed.stdout
    assert losses(run_dir) == losses(fsdp_run)  # bitwise: the resumed FSDP run is the straight one
    sharded, reference = full_state(run_dir), full_state(fsdp_run)
    for key, tensor in reference["model"].items():
        assert torch.equal(sharded["model"][key], tensor), key
    for name, moments in reference["optimizer"]["state"].items():
        for key, tensor in moments.items():
            assert torch.equal(sharded["optimizer"]["state"][name][key], tensor), (name, key)

    # one file from the shards: resumable without FSDP; generate, export and eval read either form
    consolidated = subprocess.run([sys.executable, "-m", "gpt.consolidate", str(run_dir)], cwd=ROOT,
                                  env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True)
    assert consolidated.returncode == 0, consolidated.stderr
    single = torch.load(run_dir / "ckpt.pt", weights_only=True)
    assert single["step"] == 6 and set(single["optimizer"]["state"]) == set(sharded["optimizer"]["state"])
    model, _ = load_model(run_dir / "ckpt.dcp")
    for key, tensor in model.state_dict().items():
        assert torch.equal(single["model"][key], tensor), key
    assert sharded_checkpoint.committed(run_dir).name == "step-00000006"


@pytest.mark.parametrize("change, message", [
    ({}, "train.fsdp=true shards the model over several processes, but this is a single one"),
    ({"compile": True}, "train.fsdp=true with train.compile=true is not supported"),
    ({"eval_iters": 3}, "train.fsdp=true needs train.eval_iters (3) to be a multiple of the number of processes (2)"),
])
def test_fsdp_refuses_what_it_cannot_do(change, message):
    ranks = Ranks() if not change else Ranks(rank=0, world_size=2)
    with pytest.raises(UserError) as err:
        check_fsdp(TrainConfig(**{"fsdp": True, "eval_iters": 4, **change}), "fp32", ranks)
    assert str(err.value) == message


def test_fsdp_refuses_fp16():
    with pytest.raises(UserError, match="does not support precision=fp16"):
        check_fsdp(TrainConfig(fsdp=True, eval_iters=4), "fp16", Ranks(rank=0, world_size=2))

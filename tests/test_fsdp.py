"""train.fsdp=true: FSDP2 over 2 gloo processes on CPU against DDP, exact resume, checkpoints that resume either way,
and the refusals of what it cannot do."""

from __future__ import annotations

import subprocess
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


def losses(run_dir: Path) -> list[float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    return [e.value for e in events.Scalars("train/loss")]


@pytest.mark.slow
def test_fsdp_matches_ddp_resumes_exactly_combines_with_checkpointing_and_reads_ddp_checkpoints(data_args, tmp_path):
    run = lambda name, *args: torchrun(*data_args, f"out_dir={tmp_path / name}", *args, cwd=tmp_path)  # noqa: E731
    run("ddp", "train.max_iters=6")
    run("fsdp", "train.max_iters=6", "train.fsdp=true")
    run("fsdp_resumed", "train.max_iters=3", "train.fsdp=true")  # stopped halfway ...
    resumed = run("fsdp_resumed", "train.max_iters=6", "train.fsdp=true", "resume=true")  # ... and continued
    assert "resumed from" in resumed.stdout + resumed.stderr
    run("fsdp_ac", "train.max_iters=6", "train.fsdp=true", "train.activation_checkpointing=true")
    run("ddp_then_fsdp", "train.max_iters=3")
    run("ddp_then_fsdp", "train.max_iters=6", "train.fsdp=true", "resume=true")

    ddp, fsdp = losses(tmp_path / "ddp"), losses(tmp_path / "fsdp")
    assert len(ddp) == 6 and fsdp == pytest.approx(ddp, rel=0, abs=1e-5)
    assert losses(tmp_path / "fsdp_resumed") == fsdp  # bitwise: the resumed FSDP run is the straight one
    assert losses(tmp_path / "fsdp_ac") == fsdp  # activation checkpointing inside FSDP changes no bit either
    assert losses(tmp_path / "ddp_then_fsdp") == pytest.approx(ddp, rel=0, abs=1e-5)
    weights = {name: torch.load(tmp_path / name / "ckpt.pt", weights_only=True)["model"]
               for name in ("ddp", "fsdp", "fsdp_resumed")}
    for key, tensor in weights["fsdp"].items():  # a plain, whole checkpoint: export and generate read it
        assert torch.equal(weights["fsdp_resumed"][key], tensor), key
        torch.testing.assert_close(tensor, weights["ddp"][key], rtol=1e-4, atol=1e-6)


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

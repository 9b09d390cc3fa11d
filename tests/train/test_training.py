"""Production training through the real script: exact resume after SIGKILL (also mid-save) and SIGTERM,
refusals that protect a run, non-finite losses, TensorBoard contents, 2-process DDP and a multirun table."""

from __future__ import annotations

import json
import math
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import conftest
from conftest import ROOT

pytestmark = pytest.mark.slow

# dropout > 0, so that an exact resume needs the RNG states restored, and grad_accum=2
RUN = ["model=tiny", "model.dropout=0.1", "device=cpu", "train.max_iters=12", "train.eval_interval=4",
       "train.eval_iters=2", "train.batch_size=4", "train.grad_accum=2", "train.log_interval=2",
       "train.warmup_iters=2", "train.sample_tokens=8"]

# Runs the real script in-process after executing argv[1]: the fault to inject.
FAULT_RUNNER = ("import runpy, sys; exec(sys.argv[1]); script = sys.argv[2]; sys.argv = sys.argv[2:]; "
                "runpy.run_path(script, run_name='__main__')")

SCRIPT = ROOT / "scripts" / "train.py"

# The second save of ckpt.pt prints a marker and waits to be killed, its data written but not renamed.
PAUSE_IN_SECOND_SAVE = """
import os, time
from pathlib import Path
_replace, _count = os.replace, [0]
def _slow_replace(src, dst, *args, **kwargs):
    if Path(dst).name == 'ckpt.pt':
        _count[0] += 1
        if _count[0] == 2:
            print('IN SAVE', flush=True)
            time.sleep(120)
    return _replace(src, dst, *args, **kwargs)
os.replace = _slow_replace
"""

# The second save of ckpt.pt fails as on a full disk, half written.
NO_SPACE_IN_SECOND_SAVE = """
import builtins, errno, io
from pathlib import Path
_open, _count = builtins.open, [0]
class _FullDisk(io.FileIO):
    def write(self, data):
        super().write(bytes(data)[:100])
        raise OSError(errno.ENOSPC, 'No space left on device')
def _open_full(file, mode='r', *args, **kwargs):
    if Path(str(file)).name.startswith('.ckpt.pt.') and str(file).endswith('.tmp'):
        _count[0] += 1
        if _count[0] == 2:
            return _FullDisk(file, 'wb')
    return _open(file, mode, *args, **kwargs)
builtins.open = _open_full
"""


def env() -> dict[str, str]:
    # one thread: the test machine is small and shared, and OpenMP threads that wait on each other crawl
    return {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def train(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "train.py"), *args], cwd=cwd or ROOT, env=env(),
                          capture_output=True, text=True, timeout=300)


def start(*args: str, fault: str | None = None) -> subprocess.Popen:
    script = str(SCRIPT)
    cmd = [sys.executable, "-c", FAULT_RUNNER, fault, script, *args] if fault else [sys.executable, script, *args]
    return subprocess.Popen(cmd, cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_for(proc: subprocess.Popen, marker: str) -> str:
    """Read the process's output until a line contains marker; returns what was read."""
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if marker in line:
            return "".join(seen)
    proc.wait()
    pytest.fail(f"the run ended (rc={proc.returncode}) before printing {marker!r}:\n{''.join(seen)}")


def assert_same(a, b, where="ckpt") -> None:
    """Bitwise equality of two checkpoint trees."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert set(a) == set(b), f"{where}: keys {sorted(set(a) ^ set(b))}"
        for k in a:
            assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def load(run_dir: Path) -> dict:
    return torch.load(run_dir / "ckpt.pt", weights_only=True)


def final_state(run_dir: Path) -> dict:
    """What must match between an uninterrupted and a resumed run (not the config: out_dir differs)."""
    ckpt = load(run_dir)
    return {k: v for k, v in ckpt.items() if k != "config"}


@pytest.fixture(scope="module")
def reference(data_args, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """The uninterrupted run every interrupted one is compared with."""
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    result = train(*RUN, *data_args, f"out_dir={run_dir}")
    assert result.returncode == 0, result.stderr
    return run_dir, result


def test_start_prints_the_batch_and_plain_lines_when_not_interactive(reference):
    _, result = reference
    out = result.stdout + result.stderr
    assert "batch: 4 sequences x 2 micro-steps x 1 process(es) x 32 tokens = 256 tokens per optimizer step" in out
    assert "step 6/12: loss " in out and "tok/s" in out and "eta " in out
    assert "\r" not in out  # no progress bar in a log
    assert "mfu" not in out  # no peak FLOP/s known for a CPU


def test_failed_write_then_kill_in_a_save_then_sigterm_and_three_resumes_end_bitwise_identical(
        reference, data_args, tmp_path):
    """One run interrupted three ways, resumed each time; the end state equals the uninterrupted run's."""
    run_dir = tmp_path / "run"
    common = [*RUN, *data_args, f"out_dir={run_dir}"]

    # 1. the disk fills up during the step-4 save: exit 2 with the reason, the step-0 checkpoint stays
    failed = subprocess.run([sys.executable, "-c", FAULT_RUNNER, NO_SPACE_IN_SECOND_SAVE, str(SCRIPT), *common],
                            cwd=ROOT, env=env(), capture_output=True, text=True, timeout=300)
    assert failed.returncode == 2 and "Traceback" not in failed.stderr, failed.stderr
    assert failed.stderr.startswith(f"error: could not write checkpoint {run_dir / 'ckpt.pt'}: No space left on device")
    assert "the previous checkpoint is unchanged" in failed.stderr
    assert load(run_dir)["step"] == 0 and not list(run_dir.glob(".ckpt.pt.*.tmp"))

    # 2. resumed, then SIGKILLed in the middle of the step-8 save (data written, not yet renamed)
    proc = start(*common, "resume=true", fault=PAUSE_IN_SECOND_SAVE)
    assert "resumed from" in wait_for(proc, "IN SAVE")
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL
    assert list(run_dir.glob(".ckpt.pt.*.tmp"))  # the killed process's own temporary file
    assert load(run_dir)["step"] == 4  # the previous checkpoint, intact

    # 3. resumed again, then SIGTERM (a preemption): finish the step, save, print the resume command, exit 0
    proc = start(*common, "resume=true")
    assert f"resumed from {run_dir / 'ckpt.pt'} at step 4" in wait_for(proc, "step 6/12")
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    assert "SIGTERM received: finishing this step and saving" in out
    step = load(run_dir)["step"]
    assert 7 <= step < 12 and f"stopped by SIGTERM after step {step}" in out
    command = next(line for line in out.splitlines() if line.startswith("resume with: ")).removeprefix("resume with: ")
    args = shlex.split(command)
    assert args[:2] == ["python", "scripts/train.py"] and args[-2:] == [f"out_dir={run_dir}", "resume=true"]

    # 4. the printed command, as a user would paste it, finishes the run
    result = train(*args[2:])
    assert result.returncode == 0, result.stderr
    assert_same(final_state(run_dir), final_state(reference[0]))
    assert not list(run_dir.glob(".*.tmp"))  # what the killed process left was cleared by the next run
    # the run's own .hydra/config.yaml is kept; each resume records its config beside it
    assert "resume: false" in (run_dir / ".hydra" / "config.yaml").read_text()
    assert len(list((run_dir / ".hydra").glob("resume-*/config.yaml"))) >= 1


def test_resume_refuses_another_model_shape_naming_the_fields(reference, data_args):
    run_dir, _ = reference
    before = (run_dir / "ckpt.pt").read_bytes()
    shape = train(*RUN, *data_args, f"out_dir={run_dir}", "resume=true", "model.n_layer=3", "model.n_embd=64")
    assert shape.returncode == 2 and "Traceback" not in shape.stderr
    assert shape.stderr.startswith("error: cannot resume")
    assert "model.n_embd is 32 in the checkpoint but 64 now" in shape.stderr and "model.n_layer is 2" in shape.stderr
    assert (run_dir / "ckpt.pt").read_bytes() == before


def test_a_fresh_run_refuses_an_out_dir_that_holds_a_checkpoint(reference):
    from gpt.errors import UserError
    from gpt.model.config import GPTConfig
    from gpt.train.resume import resume_state

    run_dir, _ = reference
    state = load(run_dir)
    model_config = GPTConfig.from_dict(state["model_config"])
    with pytest.raises(UserError, match="already holds a checkpoint") as err:
        resume_state(run_dir, False, model_config, state["tokenizer"], state["config"], print)
    assert "resume=true" in err.value.hint
    notes = []
    config = {**state["config"], "seed": 7}
    resumed = resume_state(run_dir, True, model_config, state["tokenizer"], config, notes.append)
    assert resumed["step"] == 12 and notes == ["note: resuming with changed settings: seed: 1337 -> 7"]


def test_non_finite_loss_is_skipped_then_stops_without_saving_it(data_args, tmp_path):
    run_dir = tmp_path / "run"
    # a real blow-up: the first update at this learning rate sends the weights to ~1e30, the next loss is NaN
    result = train(*RUN, *data_args, f"out_dir={run_dir}", "train.learning_rate=1e30", "train.warmup_iters=0",
                   "train.skip_nonfinite=1")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "step 2: non-finite loss nan, update skipped (1 of train.skip_nonfinite=1)" in result.stdout
    assert result.stderr.startswith("error: non-finite loss nan at step 3; stopped without saving it")
    ckpt = load(run_dir)
    assert ckpt["step"] == 0 and all(torch.isfinite(t).all() for t in ckpt["model"].values())


def test_tensorboard_has_the_scalars_samples_attention_image_and_config(reference):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir, _ = reference
    events = EventAccumulator(str(run_dir), size_guidance={"images": 0, "tensors": 0})
    events.Reload()
    tags = events.Tags()
    assert {"train/loss", "val/loss", "val/ppl", "val/bpb", "lr", "grad_norm", "tokens_per_sec"} <= set(tags["scalars"])
    assert "mfu" not in tags["scalars"]
    assert [e.step for e in events.Scalars("val/loss")] == [0, 4, 8, 12]
    summary = json.loads((run_dir / "summary.json").read_text())
    val_loss, ppl, bpb = (events.Scalars(tag)[-1].value for tag in ("val/loss", "val/ppl", "val/bpb"))
    assert ppl == pytest.approx(math.exp(val_loss), rel=1e-5) and summary["final_val_ppl"] == pytest.approx(ppl)
    assert bpb == pytest.approx(summary["final_val_bpb"]) and bpb == pytest.approx(val_loss / math.log(2))  # 1 B/char
    assert "attention/layer1" in tags["images"] and len(events.Images("attention/layer1")) == 4
    text_tags = set(tags["tensors"])
    assert {"samples/prompt0/text_summary", "samples/prompt1/text_summary", "config/text_summary"} <= text_tags
    assert "_hparams_/experiment" in events.PluginTagToContent("hparams")  # the HParams tab
    config = events.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "max_iters: 12" in config and "dropout: 0.1" in config


@pytest.fixture(scope="module")
def sweep(data_args, tmp_path_factory):
    """A Hydra multirun over both kernels, single process, grad_accum=2, no dropout."""
    sweep_dir = tmp_path_factory.mktemp("sweep") / "runs"
    result = train("-m", "attention=manual,sdpa", *DDP_RUN, "train.grad_accum=2", *data_args, f"out_dir={sweep_dir}")
    assert result.returncode == 0, result.stderr
    return sweep_dir, result


DDP_RUN = ["model=tiny", "device=cpu", "train.max_iters=6", "train.eval_interval=3", "train.eval_iters=4",
           "train.batch_size=4", "train.log_interval=1", "train.sample_tokens=0"]


def test_multirun_gives_one_directory_per_job_and_a_table(sweep):
    sweep_dir, result = sweep
    assert (sweep_dir / "0" / "ckpt.pt").exists() and (sweep_dir / "1" / "ckpt.pt").exists()
    table = (sweep_dir / "summary.md").read_text()
    header = next(line for line in table.splitlines() if line.startswith("| run"))
    for column in ("train loss", "val loss", "val ppl", "val bpb", "tokens/s", "peak memory", "wall time"):
        assert column in header
    assert "| 0   | attention=manual |" in table and "| 1   | attention=sdpa   |" in table
    assert "attention=manual" in result.stdout and f"tensorboard --logdir {sweep_dir}" in result.stdout


# Rank 1 alone gets SIGTERM as its step 3 begins: both ranks must agree to stop after it.
SIGTERM_RANK_1_AT_STEP_3 = """
import os, signal
import gpt.train.optim as optim
_lr = optim.learning_rate
def _learning_rate(step, cfg):
    if step == 3 and os.environ['RANK'] == '1':
        os.kill(os.getpid(), signal.SIGTERM)
    return _lr(step, cfg)
optim.learning_rate = _learning_rate
"""


def torchrun(*args: str, cwd: Path, fault: str = "") -> subprocess.CompletedProcess:
    return conftest.torchrun(SCRIPT, *args, cwd=cwd, fault=fault)


def test_two_gloo_processes_agree_to_stop_resume_and_match_one_process_with_grad_accum_2(sweep, data_args, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sweep_dir, _ = sweep
    run_dir = tmp_path / "ddp"
    common = [*DDP_RUN, "attention=sdpa", "train.grad_accum=1", *data_args, f"out_dir={run_dir}"]
    stopped = torchrun(*common, cwd=tmp_path, fault=SIGTERM_RANK_1_AT_STEP_3)
    assert stopped.returncode == 0, conftest.failure_output(stopped)
    out = stopped.stdout + stopped.stderr
    assert "4 sequences x 1 micro-steps x 2 process(es) x 32 tokens = 256 tokens per optimizer step" in out
    assert "stopped by a signal on another rank after step 4" in out
    assert "resume with: torchrun --nproc_per_node=2 " in out
    assert out.count("step 3: train loss") == 1  # rank 0 alone logs
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ddp"]  # rank 1 wrote nothing of its own
    ckpt = torch.load(run_dir / "ckpt.pt", weights_only=True)
    assert ckpt["step"] == 4 and len(ckpt["rng"]) == 2 and ckpt["world_size"] == 2

    resumed = torchrun(*common, "resume=true", cwd=tmp_path)
    assert resumed.returncode == 0, conftest.failure_output(resumed)
    assert "resumed from" in resumed.stdout + resumed.stderr

    def scalars(path: Path, tag: str) -> list[float]:
        events = EventAccumulator(str(path))
        events.Reload()
        return [e.value for e in events.Scalars(tag)]

    single = sweep_dir / "1"  # attention=sdpa, one process, grad_accum=2
    for tag in ("train/loss", "val/loss", "grad_norm"):
        assert scalars(run_dir, tag) == pytest.approx(scalars(single, tag), rel=1e-5, abs=1e-6), tag
    ddp, one = torch.load(run_dir / "ckpt.pt", weights_only=True), torch.load(single / "ckpt.pt", weights_only=True)
    assert ddp["step"] == one["step"] == 6
    for name, tensor in one["model"].items():
        torch.testing.assert_close(ddp["model"][name], tensor, rtol=1e-4, atol=1e-6)


def test_a_second_process_cannot_write_into_a_run_that_is_still_training(data_args, tmp_path):
    run_dir = tmp_path / "run"
    long_run = [a for a in RUN if not a.startswith("train.max_iters")] + ["train.max_iters=100000"]
    proc = start(*long_run, *data_args, f"out_dir={run_dir}")
    try:
        wait_for(proc, "step 4: train loss")  # the first checkpoint is written
        second = train(*long_run, *data_args, f"out_dir={run_dir}", "resume=true")
        assert second.returncode == 2 and "Traceback" not in second.stderr, second.stderr
        assert second.stderr.startswith(f"error: {run_dir} is in use by another training run (process {proc.pid})")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert not list((run_dir / ".hydra").glob("resume-*"))  # the refused resume recorded nothing


def test_a_wall_clock_budget_ends_the_run_normally_with_a_last_evaluation_and_checkpoint(data_args, tmp_path):
    run_dir = tmp_path / "run"
    budget = [a for a in RUN if not a.startswith("train.max_iters")] + ["train.max_iters=100000",
                                                                        "train.max_seconds=0.001"]
    result = train(*budget, *data_args, f"out_dir={run_dir}")
    assert result.returncode == 0, result.stderr
    assert "train.max_seconds=0.001 reached after step 1 of 100000" in result.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["step"] == 1 and not summary["interrupted"] and math.isfinite(summary["final_val_loss"])
    assert load(run_dir)["step"] == 1 and load(run_dir)["evaluated"]

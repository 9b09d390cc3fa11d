"""The parts of the training loop, in-process: checkpoint writes that fail, signals, attention maps, MFU."""

from __future__ import annotations

import errno
import math
import os
import signal

import pytest
import torch

from gpt.errors import UserError
from gpt.inference.visualize import attention_maps
from gpt.model import GPT
from gpt.model.config import GPTConfig
from gpt.train import distributed, metrics, state
from gpt.train.build import maybe_compile
from gpt.train.resume import resume_command
from gpt.train.signals import SignalGuard
from gpt.weights import checkpoint as checkpoint_files


def test_a_failed_write_leaves_the_previous_checkpoint_and_says_why(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.pt"
    checkpoint_files.save({"model": {"w": torch.ones(3)}, "model_config": {}, "step": 1}, path)
    before = path.read_bytes()

    def full_disk(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint_files.os, "fsync", full_disk)
    with pytest.raises(UserError, match="could not write checkpoint .*ckpt.pt: No space left on device") as err:
        checkpoint_files.save({"model": {"w": torch.zeros(3)}, "model_config": {}, "step": 2}, path)
    assert "previous checkpoint is unchanged" in err.value.hint
    assert path.read_bytes() == before and not list(tmp_path.glob(".ckpt.pt.*tmp"))
    monkeypatch.undo()
    assert checkpoint_files.load(path)["step"] == 1


def test_rng_state_round_trips_through_a_weights_only_checkpoint(tmp_path):
    import random

    import numpy as np

    checkpoint_files.save({"model": {}, "model_config": {}, "rng": state.rng_state()}, tmp_path / "c.pt")
    expected = (random.random(), np.random.rand(), torch.rand(2))
    state.set_rng_state(checkpoint_files.load(tmp_path / "c.pt")["rng"])
    got = (random.random(), np.random.rand(), torch.rand(2))
    assert got[:2] == expected[:2] and torch.equal(got[2], expected[2])


def test_shape_differences_name_fields_but_allow_runtime_choices():
    now = GPTConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=50)
    same_shape = GPTConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=50, dropout=0.2, attention="manual", window=4)
    assert now.shape_differences(same_shape) == []
    assert now.shape_differences(same_shape.to_dict()) == []
    other = GPTConfig(n_layer=3, n_head=2, n_embd=32, vocab_size=50)
    assert now.shape_differences(other) == ["model.n_layer is 3 in the checkpoint but 2 now"]
    gqa = GPTConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=50, n_kv_head=1, window=8)
    assert now.shape_differences(gqa) == ["model.n_kv_head is 1 in the checkpoint but 2 now"]
    newer = {**now.to_dict(), "new_field": 1}
    assert now.shape_differences(newer) == ["model.new_field is 1 in the checkpoint but '(not set)' now"]


def test_runtime_fields_come_from_the_run_and_the_architecture_from_the_weights():
    weights = GPTConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=50, n_kv_head=1)
    run = GPTConfig(n_layer=4, n_head=4, n_embd=64, dropout=0.1, attention="manual", window=8)
    merged = weights.with_runtime_of(run)
    assert (merged.n_layer, merged.n_embd, merged.n_kv_head, merged.vocab_size) == (2, 32, 1, 50)
    assert (merged.dropout, merged.attention, merged.window) == (0.1, "manual", 8)


def test_first_signal_asks_to_stop_a_repeat_is_the_same_request_a_later_one_exits_at_once(monkeypatch):
    exits = []
    monkeypatch.setattr(os, "_exit", lambda code: exits.append(code))
    clock = [100.0]
    monkeypatch.setattr("gpt.train.signals.time.monotonic", lambda: clock[0])
    with SignalGuard() as stop:
        assert stop.received is None
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.received == "SIGTERM" and exits == []
        os.kill(os.getpid(), signal.SIGINT)  # delivered twice at once (terminal and torchrun): one request
        assert exits == []
        clock[0] += 5
        os.kill(os.getpid(), signal.SIGINT)
        assert exits == [128 + signal.SIGINT]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


@pytest.mark.parametrize("options", [{}, {"n_kv_head": 2, "designs": ["rope"], "window": 4}],
                         ids=["gpt2", "gqa-rope-window"])
def test_attention_maps_are_causal_distributions_that_reproduce_the_layer_output(options):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=4, n_embd=32, block_size=16, vocab_size=40, **options)).eval()
    idx = torch.randint(40, (1, 10))
    maps = attention_maps(model, idx)[1]
    assert maps.shape == (4, 10, 10)
    torch.testing.assert_close(maps.sum(-1), torch.ones(4, 10))
    assert torch.all(maps.triu(1) == 0)
    if "window" in options:
        band = torch.ones(10, 10, dtype=torch.bool).tril() & ~torch.ones(10, 10, dtype=torch.bool).tril(-4)
        assert torch.all(maps[:, ~band] == 0) and torch.all(maps[:, band] > 0)  # keys i-3 .. i
    # weights @ v, heads side by side, through c_proj: the attention block's own output
    attn = model.transformer.h[1].attn
    seen = {}
    attn.register_forward_hook(lambda m, args, out: seen.update(x=args[0], out=out))
    model(idx)
    n_kv_head = model.config.n_kv_head
    v = attn.c_attn(seen["x"]).split([32, 8 * n_kv_head, 8 * n_kv_head], dim=2)[2]
    v = v.view(1, 10, n_kv_head, 8).transpose(1, 2).repeat_interleave(4 // n_kv_head, dim=1)
    y = (maps.unsqueeze(0) @ v).transpose(1, 2).reshape(1, 10, 32)
    torch.testing.assert_close(attn.c_proj(y), seen["out"], rtol=1e-5, atol=1e-6)


def test_mfu_peaks_are_known_for_datacentre_gpus_only():
    assert metrics.peak_flops_for_name("NVIDIA H100 80GB HBM3", "bf16") == 989e12
    assert metrics.peak_flops_for_name("NVIDIA H100 PCIe", "bf16") == 756e12
    assert metrics.peak_flops_for_name("NVIDIA A100-SXM4-80GB", "fp32") == 156e12
    assert metrics.peak_flops_for_name("NVIDIA H200", "bf16") == 989e12
    assert metrics.peak_flops_for_name("NVIDIA GeForce RTX 3090", "bf16") is None
    assert metrics.peak_flops(torch.device("cpu"), "fp32") is None
    cfg = GPTConfig()  # GPT-2 small: 124M parameters, ~0.87 GFLOP per token with attention
    flops = metrics.flops_per_token(cfg, 124_000_000)
    assert flops == 6 * 124e6 + 12 * 12 * 768 * 1024
    assert metrics.mfu(1e5, cfg, 124_000_000, 989e12) == pytest.approx(1e5 * flops / 989e12)
    assert metrics.mfu(1e5, cfg, 124_000_000, None) is None


def test_compile_where_unavailable_says_so_once_and_runs_eager(monkeypatch):
    monkeypatch.setattr("gpt.train.build.compile_unavailable", lambda device: "no C/C++ compiler found")
    lines = []
    model = torch.nn.Linear(2, 2)
    assert maybe_compile(model, True, torch.device("cpu"), lines.append) is model
    assert lines == ["train.compile=true but torch.compile is unavailable (no C/C++ compiler found): running eager"]
    assert maybe_compile(model, False, torch.device("cpu"), lines.append) is model and len(lines) == 1


def test_resume_command_keeps_overrides_quotes_them_and_pins_out_dir(tmp_path, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    overrides = ["model=tiny", "data.path=/my texts", "out_dir=x", "resume=false"]
    cmd = resume_command(overrides, tmp_path, "scripts/train.py")
    assert cmd == f"python scripts/train.py model=tiny 'data.path=/my texts' out_dir={tmp_path} resume=true"
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    cmd = resume_command(["model=tiny"], tmp_path, "scripts/train.py")
    launch = "torchrun --nproc_per_node=4 --nnodes=2 <same rendezvous options>"
    assert cmd.startswith(f"{launch} scripts/train.py model=tiny")


def test_ranks_after_the_first_write_no_hydra_output(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    assert distributed.hydra_overrides_for_rank() == []
    monkeypatch.setenv("RANK", "1")
    assert "hydra.output_subdir=null" in distributed.hydra_overrides_for_rank()
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    ranks, device = distributed.setup(torch.device("cpu"))
    assert not ranks.enabled and ranks.is_main and distributed.gather("x", ranks) == ["x"]
    assert math.isclose(distributed.all_reduce_sum(torch.tensor(2.0), ranks).item(), 2.0)


@pytest.mark.slow
@pytest.mark.parametrize(("body", "code", "printed"), [
    ("print('done')", 0, "done"),
    ("sys.exit(3)", 3, ""),
    ("sys.exit('error: a message')", 1, "error: a message"),
    ("raise ValueError('a bug')", 1, "ValueError: a bug"),
])
def test_a_torchrun_worker_ends_with_its_exit_status_and_flushed_output(body, code, printed):
    """run_worker skips the interpreter's teardown (os._exit), so the status and the output must survive it."""
    import subprocess
    import sys

    program = f"import sys\nfrom gpt.train.distributed import run_worker\ndef entry():\n    {body}\nrun_worker(entry)"
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert result.returncode == code
    assert printed in result.stdout + result.stderr


def test_throughput_leaves_out_the_first_step_unless_it_is_the_only_one():
    from gpt.train.metrics import Throughput

    meter = Throughput(tokens_per_step=100)
    meter.step_done(10.0)  # compilation and warm-up
    assert meter.run_rate() == 10.0  # a one-step run still reports its rate, not 0
    meter.step_done(0.5)
    meter.step_done(1.5)
    assert meter.run_rate() == 100.0  # 200 tokens in 2 s: the first step left out

"""The memory planner (gpt.memory) against what training really holds: live-tensor peaks of small models on CPU."""

from __future__ import annotations

import pytest
import torch

from gpt import memory
from gpt.bench.tensor_memory import TensorMemory, measure_training_peak
from gpt.errors import ConfigError, UserError
from gpt.memory.__main__ import main as memory_main
from gpt.model import GPT
from gpt.model.config import GPTConfig
from gpt.train.build import check_fits
from gpt.train.config import TrainConfig
from gpt.train.distributed import Ranks

SMALL = dict(n_layer=3, n_head=4, n_embd=64, block_size=64, vocab_size=128)
GQA_ROPE = dict(n_layer=3, n_head=4, n_embd=64, block_size=64, vocab_size=65, n_kv_head=2, designs=["rope"])
CASES = {  # sizes, batch, precision, activation checkpointing
    "fp32, activations dominate": (SMALL, 8, "fp32", False),
    "fp32, checkpointed": (SMALL, 8, "fp32", True),
    "bf16 autocast": (SMALL, 8, "bf16", False),
    "bf16 autocast, checkpointed": (SMALL, 8, "bf16", True),
    "AdamW state dominates (batch 1)": (dict(n_layer=6, n_head=6, n_embd=192, block_size=64, vocab_size=512), 1,
                                        "fp32", False),
    "manual attention keeps T x T scores": ({**GQA_ROPE, "n_kv_head": None, "designs": [],
                                             "attention": "manual"}, 8, "fp32", False),
    "rope and grouped-query attention": (GQA_ROPE, 8, "fp32", False),
    "linear attention's own T x T weights": ({**SMALL, "block_size": 128, "designs": ["linear"]}, 8, "fp32", False),
    "linear attention, grouped, bf16": ({**SMALL, "designs": ["linear"], "n_kv_head": 2}, 8, "bf16", False),
    "diff attention on SDPA's math backend": ({**SMALL, "block_size": 128, "designs": ["diff"]}, 8, "fp32", False),
    "diff attention, bf16 (float32 maps)": ({**SMALL, "designs": ["diff"]}, 8, "bf16", False),
    "diff attention, manual kernel": ({**SMALL, "designs": ["diff"], "attention": "manual"}, 8, "fp32", False),
    "MLA on SDPA's math backend": ({**SMALL, "block_size": 128, "designs": ["mla"],
                                    "design_options": {"mla": {"latent": 32}}}, 8, "fp32", False),
    "MLA, bf16 (float32 q, k, v, maps)": ({**SMALL, "block_size": 128, "designs": ["mla"],
                                           "design_options": {"mla": {"latent": 16, "rope_dim": 16}}}, 8, "bf16",
                                          False),
    "RMSNorm blocks": ({**SMALL, "norm": "rmsnorm"}, 8, "fp32", False),
    "RMSNorm blocks, bf16": ({**SMALL, "norm": "rmsnorm"}, 8, "bf16", False),
    "gated attention, bf16": ({**SMALL, "designs": ["gated"]}, 8, "bf16", False),
    "Gated DeltaNet, grouped keys": ({**SMALL, "block_size": 128, "designs": ["deltanet"], "n_kv_head": 2}, 8,
                                     "fp32", False),
    "Gated DeltaNet, bf16 (a float32 delta rule)": ({**SMALL, "designs": ["deltanet"]}, 8, "bf16", False),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight")  # diff's RMSNorm in bf16 on CPU
def test_planned_peak_is_within_15_percent_of_the_measured_live_tensor_peak(case):
    sizes, batch, precision, checkpointing = CASES[case]
    config = GPTConfig(**sizes)
    measured = measure_training_peak(config, batch, config.block_size, precision, checkpointing)
    planned = memory.plan(config, batch, precision=precision, checkpointing=checkpointing, fused_adamw=False).peak
    assert planned == pytest.approx(measured, rel=0.15), f"planned {planned:,} vs measured {measured:,}"


def test_checkpointing_cuts_the_planned_and_the_measured_peak_alike():
    config = GPTConfig(**{**SMALL, "n_layer": 6})
    measured = [measure_training_peak(config, 8, 64, "fp32", ac) for ac in (False, True)]
    planned = [memory.plan(config, 8, precision="fp32", checkpointing=ac, fused_adamw=False).peak
               for ac in (False, True)]
    assert measured[1] < 0.6 * measured[0]
    assert planned[0] - planned[1] == pytest.approx(measured[0] - measured[1], rel=0.15)


@pytest.mark.parametrize("sizes", [SMALL, GQA_ROPE, dict(SMALL, bias=False), dict(n_layer=2, n_head=25, n_embd=1600)])
def test_parameter_count_is_the_models(sizes):
    config = GPTConfig(**sizes)
    with torch.device("meta"):
        model = GPT(config)
    per_block = sum(p.numel() for p in model.transformer.h[0].parameters())
    assert memory.count_params(config) == (model.num_params(non_embedding=False), per_block)


def test_the_tensor_counter_sees_allocations_and_frees():
    with TensorMemory() as counter:
        a = torch.zeros(1000)  # 4000 bytes
        b = a * 2
        del b
        c = a.view(10, 100)  # a view: no new storage
        assert counter.peak == 8000
        counter.reset_peak()
        assert counter.peak == counter.current == 4000 and c.numel() == 1000


def test_largest_batch_fits_and_one_more_does_not():
    config = GPTConfig(n_layer=48, n_head=25, n_embd=1600, vocab_size=50257)
    budget = memory.parse_bytes("80GB") - memory.RESERVED
    best = memory.largest_batch(budget, lambda b: memory.plan(config, b, checkpointing=True))
    assert best > 1
    assert memory.plan(config, best, checkpointing=True).peak <= budget < memory.plan(config, best + 1,
                                                                                      checkpointing=True).peak
    fsdp = memory.plan(config, 1, world_size=8, fsdp=True)
    assert fsdp.optimizer * 8 == pytest.approx(memory.plan(config, 1).optimizer, rel=1e-6)


def test_gpt2_xl_does_not_fit_24gb_without_sharding_but_fits_80gb(capsys):
    memory_main(["model=gpt2-xl", "train.batch_size=1", "gpu_memory=24GB"])
    assert "none: not even 1 sequence fits" in capsys.readouterr().out
    memory_main(["model=gpt2-xl", "train.batch_size=1", "train.fsdp=true", "world_size=8", "gpu_memory=24GB"])
    out = capsys.readouterr().out
    assert "FSDP over 8 GPUs" in out and "largest micro-batch on a 24GB GPU" in out and "none" not in out


@pytest.mark.parametrize("args, message", [
    (["gpu_memory=lots"], "gpu_memory='lots' is not an amount of memory"),
    (["train.fsdp=true"], "train.fsdp=true shards over the GPUs of a run, but world_size=1"),
    (["train.batch_size=0"], "train.batch_size must be positive"),
])
def test_bad_planner_input_is_one_line(args, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        memory_main(args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {message}") and "Traceback" not in err


def test_parse_bytes_units():
    assert memory.parse_bytes("80GB") == 80 * 10**9
    assert memory.parse_bytes("24 GiB") == 24 * 2**30
    with pytest.raises(ConfigError):
        memory.parse_bytes("12 parsecs")


def test_training_refuses_a_run_the_plan_puts_above_free_memory(monkeypatch):
    monkeypatch.setattr("gpt.train.build.available_memory", lambda device: 2**30)
    config = GPTConfig(n_layer=4, n_head=4, n_embd=128, block_size=128, vocab_size=256)
    check_fits(config, TrainConfig(batch_size=8), "fp32", torch.device("cpu"), Ranks())  # ~47 MB: fits
    with pytest.raises(UserError, match=r"need about 1\.[0-9] GiB per process .* has 1\.0 GiB available"):
        check_fits(config, TrainConfig(batch_size=256), "fp32", torch.device("cpu"), Ranks())
    check_fits(config, TrainConfig(batch_size=256, activation_checkpointing=True), "fp32", torch.device("cpu"),
               Ranks())


def test_saving_a_checkpoint_streams_it_without_a_second_copy_in_memory(tmp_path):
    from gpt.bench.isolate import PeakMemory
    from gpt.weights import checkpoint

    state = {f"w{i}": torch.randn(256, 1024) for i in range(64)}  # 64 MiB
    size = sum(t.numel() * t.element_size() for t in state.values())
    gauge = PeakMemory(torch.device("cpu"))
    gauge.start()
    checkpoint.save({"model": state}, tmp_path / "ckpt.pt")
    growth = gauge.peak_bytes()
    if growth is None:
        pytest.skip("no resettable peak resident set here (Linux /proc/self/clear_refs)")
    assert growth < 0.1 * size, f"the resident set grew by {growth:,} bytes saving {size:,}"

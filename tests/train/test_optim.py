"""The optimizers and schedules: Muon's update is torch.optim.Muon's bit for bit, its parameter split follows one rule
for any module inside the blocks, its state saves and restores, the schedules' values, and the decay-from length."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from conftest import ROOT
from gpt.errors import ConfigError
from gpt.model import GPT
from gpt.model import design as designs
from gpt.model.config import GPTConfig
from gpt.train.config import TrainConfig
from gpt.train.decay import decayed_length
from gpt.train.muon import MuonAdamW, newton_schulz, split_parameters
from gpt.train.optim import decay_iters, learning_rate, make_optimizer, set_learning_rate

CONFIG = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=50)
CPU = torch.device("cpu")


def batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 50, (4, 16), generator=g), torch.randint(0, 50, (4, 16), generator=g)


def step(model: nn.Module, optimizers: list[torch.optim.Optimizer], seed: int) -> None:
    model(*batch(seed))[1].backward()
    for optimizer in optimizers:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def test_muon_groups_step_exactly_as_torch_muon_and_the_rest_exactly_as_torch_adamw():
    torch.manual_seed(0)
    ours_model = GPT(CONFIG)
    torch_model = copy.deepcopy(ours_model)
    cfg = TrainConfig(optimizer="muon", muon_weight_decay=0.01)
    ours = make_optimizer(ours_model, cfg, CPU)
    ours.ns_dtype = torch.bfloat16  # torch.optim.Muon's (a GPU's); on a CPU the run uses float32
    split = split_parameters(torch_model)
    reference = [
        torch.optim.Muon([p for _, p in split.muon], lr=cfg.muon_lr, weight_decay=0.01, momentum=cfg.muon_momentum),
        torch.optim.AdamW([{"params": [p for _, p in split.adamw_decay], "weight_decay": cfg.weight_decay},
                           {"params": [p for _, p in split.adamw_no_decay], "weight_decay": 0.0}],
                          lr=cfg.learning_rate, betas=(cfg.beta1, cfg.beta2)),
    ]
    for i in range(3):
        step(ours_model, [ours], i)
        step(torch_model, reference, i)
    for (name, ours_p), (_, torch_p) in zip(ours_model.named_parameters(), torch_model.named_parameters()):
        assert torch.equal(ours_p, torch_p), name


def test_newton_schulz_makes_the_singular_values_near_one_in_float32():
    g = torch.randn(96, 32) @ torch.diag(torch.logspace(-1, 0, 32))  # singular values spanning 10x; taller than wide
    s = torch.linalg.svdvals(newton_schulz(g, torch.float32))
    assert newton_schulz(g, torch.float32).shape == (96, 32) and 0.5 < s.min() and s.max() < 1.3


class Mixer(nn.Module):
    """What a brought design might add inside a block: a projection, a raw 2-D matrix, an embedding, a gate."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.mix = nn.Parameter(torch.eye(4))
        self.table = nn.Embedding(10, 8)
        self.gate = nn.Parameter(torch.zeros(()))


def test_muon_takes_the_blocks_linear_weights_and_adamw_everything_else():
    model = GPT(CONFIG)
    model.transformer.h[0].attn.mixer = Mixer()
    split = split_parameters(model)
    muon = {name for name, _ in split.muon}
    assert muon == {f"transformer.h.{i}.{part}.weight" for i in range(2)
                    for part in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")} | {
        "transformer.h.0.attn.mixer.proj.weight"}
    assert {name for name, _ in split.adamw_decay} == {"transformer.wte.weight", "transformer.wpe.weight",
                                                       "transformer.h.0.attn.mixer.mix",
                                                       "transformer.h.0.attn.mixer.table.weight"}
    no_decay = {name for name, _ in split.adamw_no_decay}
    assert "transformer.h.0.attn.mixer.gate" in no_decay and "transformer.h.0.attn.mixer.proj.bias" in no_decay
    assert all(p.dim() < 2 for _, p in split.adamw_no_decay)
    every = [p for _, p in split.muon + split.adamw_decay + split.adamw_no_decay]
    assert len(every) == len({id(p) for p in model.parameters()})  # each once (the tied head is wte)


def test_the_optimizer_state_round_trips_and_continues_bit_for_bit():
    torch.manual_seed(0)
    model = GPT(CONFIG)
    cfg = TrainConfig(optimizer="muon")
    optimizer = make_optimizer(model, cfg, CPU)
    step(model, [optimizer], 0)
    saved_model, saved = copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict())
    assert {"momentum_buffer"} == set(saved["state"][0]) and {"exp_avg", "exp_avg_sq", "step"} == set(
        saved["state"][len(saved["param_groups"][0]["params"])])
    step(model, [optimizer], 1)
    other = GPT(CONFIG)
    other.load_state_dict(saved_model)
    restored = make_optimizer(other, cfg, CPU)
    restored.load_state_dict(saved)
    assert isinstance(restored, MuonAdamW)
    step(other, [restored], 1)
    for (name, a), (_, b) in zip(model.named_parameters(), other.named_parameters()):
        assert torch.equal(a, b), name


def test_muons_learning_rate_follows_the_schedule_at_its_own_peak():
    model = GPT(CONFIG)
    cfg = TrainConfig(optimizer="muon", learning_rate=2e-3, muon_lr=0.05)
    optimizer = make_optimizer(model, cfg, CPU)
    set_learning_rate(optimizer, 1e-3, cfg)
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([0.025, 1e-3, 1e-3])


def test_wsd_warms_up_holds_then_decays_linearly_to_the_final_rate():
    cfg = TrainConfig(schedule="wsd", max_iters=100, warmup_iters=10, decay_frac=0.2, learning_rate=1.0, min_lr=0.0)
    lrs = [learning_rate(s, cfg) for s in range(100)]
    assert lrs[:10] == pytest.approx([(s + 1) / 11 for s in range(10)])
    assert lrs[10:81] == [1.0] * 71  # stable through the decay's first step
    assert lrs[80:] == pytest.approx([1.0 - (s - 80) / 20 for s in range(80, 100)])
    constant = TrainConfig(schedule="constant", max_iters=100, warmup_iters=10, learning_rate=1.0)
    assert [learning_rate(s, constant) for s in range(10, 100)] == [1.0] * 90


def test_cosine_keeps_its_values():
    cfg = TrainConfig(max_iters=100, warmup_iters=10, learning_rate=1.0)
    assert learning_rate(10, cfg) == 1.0 and learning_rate(99, cfg) == pytest.approx(
        0.1 + 0.45 * (1 + math.cos(math.pi * 89 / 90)))
    assert learning_rate(100, cfg) == 0.1


@pytest.mark.parametrize("decay_frac", [0.1, 0.2, 0.25, 1 / 3, 0.5, 0.9])
def test_decaying_from_a_step_gives_the_run_whose_decay_starts_there(decay_frac):
    for step in range(5, 400, 7):
        length = decayed_length(step, decay_frac)
        assert length > step and length - decay_iters(length, decay_frac) == step, (step, length)


@pytest.mark.parametrize("change, message", [
    ({"optimizer": "sgd"}, "train.optimizer must be one of adamw, muon, got 'sgd'"),
    ({"schedule": "linear"}, "train.schedule must be one of cosine, wsd, constant, got 'linear'"),
    ({"decay_frac": 0.0}, "train.decay_frac must be in (0, 1], got 0.0"),
    ({"muon_lr": -1.0}, "train.muon_lr must be positive, got -1.0"),
    ({"muon_momentum": 1.0}, "train.muon_momentum must be in [0, 1), got 1.0"),
])
def test_bad_optimizer_settings_are_refused_with_the_valid_values(change, message):
    with pytest.raises(ConfigError) as err:
        TrainConfig(**change)
    assert str(err.value) == message


def test_the_modern_recipe_reaches_adamws_final_loss_in_70_percent_of_the_steps_and_ends_lower(data_args, tmp_path):
    """The Done-when's gap, small: 200 steps of model=tiny on the test corpus, in this process, recipe by recipe."""
    from hydra import compose, initialize_config_dir
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from gpt.schema import register, typed
    from gpt.train.trainer import train

    register()
    curves = {}
    for recipe in ("gpt2", "modern"):
        with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base=None):
            cfg = compose(config_name="train", overrides=[
                f"recipe={recipe}", "model=tiny", "device=cpu", *data_args, "train.max_iters=200",
                "train.eval_interval=70", "train.eval_iters=10", "train.batch_size=16", "train.warmup_iters=20",
                "train.sample_tokens=0", f"out_dir={tmp_path / recipe}"])
        train(typed(cfg), tmp_path / recipe, log=lambda message: None)
        events = EventAccumulator(str(tmp_path / recipe), size_guidance={"scalars": 0})
        events.Reload()
        curves[recipe] = {e.step: e.value for e in events.Scalars("val/loss")}
    adamw, modern = curves["gpt2"], curves["modern"]
    assert sorted(modern) == [0, 70, 140, 200]
    assert modern[140] <= adamw[200], (modern, adamw)  # AdamW's final loss within 140 of its 200 steps
    assert modern[200] <= adamw[200] - 0.03, (modern, adamw)  # measured gap ~0.3 nats


@pytest.mark.parametrize("name", designs.available())
def test_every_designs_block_matrices_go_to_muon_and_its_other_parameters_to_adamw(name):
    """The split for each registered design (its arena preset on a small model), and a step of recipe=modern."""
    preset = designs.get(name).on_preset()
    torch.manual_seed(0)
    model = GPT(GPTConfig(**{**CONFIG.to_dict(), **preset}))
    split = split_parameters(model)
    muon, decay = {n for n, _ in split.muon}, {n for n, _ in split.adamw_decay}
    no_decay = {n for n, _ in split.adamw_no_decay}
    block_linears = {f"transformer.h.{path}.weight" for path, m in model.transformer.h.named_modules()
                     if isinstance(m, nn.Linear)}
    assert muon == block_linears and muon  # every projection inside the blocks, whatever the design names it
    for i in range(CONFIG.n_layer):  # GPT-2's own projections are there for every design
        assert {f"transformer.h.{i}.attn.c_proj.weight", f"transformer.h.{i}.mlp.c_fc.weight",
                f"transformer.h.{i}.mlp.c_proj.weight"} <= muon
    named = dict(model.named_parameters())
    assert all(named[n].dim() == 2 for n in muon) and "transformer.wte.weight" in decay
    assert {n for n, p in named.items() if p.dim() < 2} == no_decay  # gains, biases, a design's scalars and vectors
    assert muon | decay | no_decay == set(named) and not (muon & decay or muon & no_decay or decay & no_decay)
    optimizer = make_optimizer(model, TrainConfig(optimizer="muon", schedule="wsd"), CPU)
    before = {n: p.detach().clone() for n, p in named.items()}
    step(model, [optimizer], 0)
    assert all(not torch.equal(before[n], named[n]) for n in muon), name  # Muon moved each of its matrices
    assert all(torch.isfinite(p).all() for p in model.parameters())

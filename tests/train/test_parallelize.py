"""Activation checkpointing applied from outside the model: same numbers bit for bit, less memory kept."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from gpt.errors import ConfigError
from gpt.model import GPT
from gpt.model.config import GPTConfig
from gpt.schema import register, typed
from gpt.train.config import TrainConfig
from gpt.train.parallelize import apply_activation_checkpointing
from gpt.train.trainer import train

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
CONFIG = GPTConfig(n_layer=3, n_head=2, n_embd=32, block_size=16, vocab_size=50, dropout=0.2)


def saved_bytes(fn) -> int:
    """Bytes of the distinct storages autograd keeps for the backward pass while ``fn`` runs."""
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(storages.values())


def step(model: GPT, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Loss and gradients of one forward/backward with dropout, from a fixed RNG state."""
    torch.manual_seed(3)
    model.zero_grad(set_to_none=True)
    _, loss = model(x, x)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_checkpointed_blocks_give_bitwise_the_same_loss_gradients_and_rng_and_keep_the_names():
    torch.manual_seed(0)
    plain = GPT(CONFIG)
    patched = GPT(CONFIG)
    patched.load_state_dict(plain.state_dict())
    apply_activation_checkpointing(patched)
    assert list(patched.state_dict()) == list(plain.state_dict())
    x = torch.randint(0, 50, (4, 16))
    (loss_a, grads_a), after_a = step(plain, x), torch.get_rng_state()
    (loss_b, grads_b), after_b = step(patched, x), torch.get_rng_state()
    assert torch.equal(loss_a, loss_b)
    for name, grad in grads_a.items():
        assert torch.equal(grad, grads_b[name]), name
    assert torch.equal(after_a, after_b)  # the recomputation put the generator back where it was
    patched.eval()  # evaluation and generation run the plain forward
    with torch.no_grad():
        assert torch.equal(plain.eval()(x)[0], patched(x)[0])


def test_checkpointing_keeps_only_each_blocks_input():
    torch.manual_seed(0)
    config = GPTConfig(n_layer=4, n_head=4, n_embd=64, block_size=64, vocab_size=50, dropout=0.0)
    model = GPT(config)
    x = torch.randint(0, 50, (8, 64))
    plain = saved_bytes(lambda: model(x, x))
    apply_activation_checkpointing(model)
    checkpointed = saved_bytes(lambda: model(x, x))
    btc = 8 * 64 * 64 * 4  # one fp32 (B, T, C) tensor
    assert plain - checkpointed > 4 * 10 * btc  # at least ten (B, T, C)-sized tensors saved less per block


def run_losses(root: Path, name: str, *overrides: str) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Per-step training losses and final weights of an in-process tiny run with dropout and grad_accum=2."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    register()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        cfg = compose(config_name="train", overrides=[
            "model=tiny", "model.dropout=0.1", "device=cpu", "data=text", f"data.path={root / 'corpus'}",
            f"data.root={root / 'data'}", "train.max_iters=6", "train.eval_interval=3", "train.eval_iters=1",
            "train.batch_size=4", "train.grad_accum=2", "train.log_interval=1", "train.sample_tokens=0",
            f"out_dir={root / name}", *overrides])
    train(typed(cfg), root / name, log=lambda message: None)
    events = EventAccumulator(str(root / name), size_guidance={"scalars": 0})
    events.Reload()
    losses = [e.value for e in events.Scalars("train/loss")]
    return losses, torch.load(root / name / "ckpt.pt", weights_only=True)["model"]


def test_a_run_with_activation_checkpointing_is_bitwise_the_run_without(tmp_path):
    (tmp_path / "corpus").mkdir()
    for i in range(3):
        (tmp_path / "corpus" / f"m{i}.py").write_text(f"def f{i}(x):\n    return x * {i} + 1\n\n" * 60)
    losses, weights = run_losses(tmp_path, "plain")
    losses_ac, weights_ac = run_losses(tmp_path, "ac", "train.activation_checkpointing=true")
    assert len(losses) == 6 and losses == losses_ac
    assert weights.keys() == weights_ac.keys()
    for name, tensor in weights.items():
        assert torch.equal(tensor, weights_ac[name]), name


def test_activation_checkpointing_must_be_a_boolean():
    with pytest.raises(ConfigError, match="train.activation_checkpointing must be true or false"):
        TrainConfig(activation_checkpointing="yes")


def test_an_optimizer_state_keyed_by_parameter_name_as_fsdp_writes_it_loads_into_a_plain_model():
    from gpt.train.optim import make_optimizer
    from gpt.train.parallelize import _keyed_by_name, load_optimizer_state

    def model_and_optimizer() -> tuple[GPT, torch.optim.Optimizer]:
        torch.manual_seed(0)
        model = GPT(CONFIG)
        return model, make_optimizer(model, TrainConfig(), torch.device("cpu"))

    model, optimizer = model_and_optimizer()
    model(torch.randint(0, 50, (2, 16)), torch.randint(0, 50, (2, 16)))[1].backward()
    optimizer.step()
    saved = optimizer.state_dict()
    by_name = _keyed_by_name(model, optimizer, saved)
    assert "transformer.h.0.attn.c_attn.weight" in by_name["state"]
    other_model, other = model_and_optimizer()
    load_optimizer_state(other_model, other, by_name)
    loaded = other.state_dict()
    as_lists = lambda groups: [{**g, "betas": list(g["betas"])} for g in groups]  # noqa: E731 (a tuple comes back a list)
    assert as_lists(loaded["param_groups"]) == as_lists(saved["param_groups"])
    for key, entry in saved["state"].items():
        for name, value in entry.items():
            assert torch.equal(loaded["state"][key][name], value), (key, name)

"""Training samplers: random windows as before, epochs without replacement, disjoint ranks, exact resume."""

import pytest
import torch

from conftest import run_forked
from gpt.data.config import DataConfig
from gpt.data.loader import TokenData
from gpt.data.prepare import prepare
from gpt.data.sampler import EpochSampler, RandomSampler, make_sampler
from gpt.errors import UserError

BLOCK = 16


@pytest.fixture
def data(text_dir, tmp_path) -> TokenData:
    cfg = DataConfig(name="s", source="path", path=str(text_dir), root=str(tmp_path), shard_tokens=3000)
    return TokenData(prepare(cfg, log=lambda *_: None))


def test_random_sampling_draws_what_the_training_loop_always_drew(data):
    """Rank r of W takes the r-th of W batches drawn in turn from one generator seeded with the run's seed."""
    gen = torch.Generator().manual_seed(7)
    expected = [[data.random_starts("train", 4, BLOCK, gen) for _ in range(3)][1] for _ in range(5)]
    sampler = RandomSampler(data, 4, BLOCK, seed=7, rank=1, world_size=3)
    assert [sampler.next() for _ in range(5)] == expected


def test_an_epoch_reads_every_window_once_in_a_seeded_order(data):
    sampler = EpochSampler(data, 8, BLOCK, seed=1)
    n = sampler.windows
    assert n == (len(data.splits["train"]) - 1) // BLOCK
    starts = [s for _ in range(n // 8) for s in sampler.next()]
    assert len(set(starts)) == len(starts) == n // 8 * 8
    assert all(s % BLOCK == 0 and s + BLOCK + 1 <= len(data.splits["train"]) for s in starts)
    again = EpochSampler(data, 8, BLOCK, seed=1)
    assert [s for _ in range(n // 8) for s in again.next()] == starts  # same seed, same order
    assert sorted(sampler.order(0).tolist()) == list(range(n)) and not (sampler.order(1) == sampler.order(0)).all()


@pytest.mark.parametrize("kind", ["random", "epoch"])
def test_ranks_read_disjoint_windows_and_together_what_one_process_reads(data, kind):
    one = make_sampler(kind, data, 4, BLOCK, seed=3)
    ranks = [make_sampler(kind, data, 4, BLOCK, seed=3, rank=r, world_size=2) for r in range(2)]
    for _ in range(20):
        a, b = (r.next() for r in ranks)
        assert a + b == one.next() + one.next()
        if kind == "epoch":
            assert not set(a) & set(b)


@pytest.mark.parametrize("kind", ["random", "epoch"])
def test_a_restored_sampler_continues_exactly_across_epochs(data, kind):
    sampler = make_sampler(kind, data, 8, BLOCK, seed=5)
    steps = sampler.sampler.windows // 8 + 3 if kind == "epoch" else 40  # past the end of the first epoch
    for _ in range(steps // 2):
        sampler.next()
    state = sampler.state_dict()
    ahead = [sampler.next() for _ in range(steps)]
    restored = make_sampler(kind, data, 8, BLOCK, seed=999)  # the seed comes back with the state
    restored.load_state_dict(state)
    assert [restored.next() for _ in range(steps)] == ahead


@pytest.mark.parametrize("kind", ["random", "epoch"])
def test_a_draw_ahead_comes_next_and_a_state_saved_meanwhile_resumes_where_the_run_stood(data, kind):
    """The training loop reads the next micro-batch early (gpt.data.sampler.Lookahead): same order, same checkpoints."""
    plain = make_sampler(kind, data, 4, BLOCK, seed=3)
    expected = [plain.next() for _ in range(5)]
    sampler = make_sampler(kind, data, 4, BLOCK, seed=3)
    assert sampler.next() == expected[0]
    assert sampler.ahead() == expected[1] and sampler.ahead() == expected[1]  # one ahead at most
    saved = sampler.state_dict()  # a checkpoint between the steps: the draw ahead is not in it
    assert [sampler.next() for _ in range(4)] == expected[1:]
    restored = make_sampler(kind, data, 4, BLOCK, seed=99)
    restored.ahead()  # a pending draw of its own is dropped by the load
    restored.load_state_dict(saved)
    assert [restored.next() for _ in range(4)] == expected[1:]


def test_a_checkpoint_of_the_other_sampling_is_refused(data):
    with pytest.raises(UserError, match="written with data.sampling=random, this run has data.sampling=epoch"):
        EpochSampler(data, 4, BLOCK, seed=0).load_state_dict(RandomSampler(data, 4, BLOCK, seed=0).state_dict())
    old = {"train_generator": torch.Generator().manual_seed(0).get_state()}  # a checkpoint from before samplers
    RandomSampler(data, 4, BLOCK, seed=0).load_state_dict(old)


@pytest.mark.slow
def test_epoch_sampling_resumes_bitwise_in_a_real_run(text_dir, tmp_path):
    run = ["model=tiny", "device=cpu", "data=text", f"data.path={text_dir}", f"data.root={tmp_path / 'data'}",
           "data.sampling=epoch", "train.eval_interval=4", "train.eval_iters=1", "train.batch_size=8",
           "train.warmup_iters=1", "train.lr_decay_iters=8", "train.sample_tokens=0", "model.block_size=64"]
    env = {"OMP_NUM_THREADS": "1"}
    for args in (["train.max_iters=8", f"out_dir={tmp_path / 'a'}"], ["train.max_iters=4", f"out_dir={tmp_path / 'b'}"],
                 ["train.max_iters=8", f"out_dir={tmp_path / 'b'}", "resume=true"]):
        result = run_forked("train", *run, *args, env=env)  # the script's main(), each apart in a fork of this one
        assert result.returncode == 0, result.stderr[-2000:]
    a, b = (torch.load(tmp_path / d / "ckpt.pt", weights_only=True) for d in ("a", "b"))
    assert a["data"] == b["data"] and a["data"]["kind"] == "epoch" and a["data"]["position"] == 8 * 8
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])

"""train.passkey (gpt/train/passkey_mix.py): the first rows of each training micro-batch become the evaluation's
passkey sequences, drawn from the seed and the windows' starts alone (a resumed run draws the same ones); a fraction
that gives no row, a context the key line does not fit twice, and chat data are one error line, nothing written."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import run_inline, write_corpus
from gpt.data.config import DataConfig
from gpt.data.loader import TokenData
from gpt.data.prepare import prepare
from gpt.evaluation.positions import IGNORE
from gpt.train.passkey_mix import DIGITS, KEY, PasskeyMix

RUN = ["model=tiny", "model.designs=[rope]", "train.batch_size=4", "train.eval_iters=1", "train.sample_tokens=0",
       "train.pictures=false", "train.schedule=constant", "train.warmup_iters=0", "train.eval_interval=2"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[list[str], TokenData]:
    """The data overrides of a small prepared corpus, and its data."""
    root = tmp_path_factory.mktemp("passkey_mix")
    folder = write_corpus(root / "corpus")
    (folder / "keys.py").write_text("".join(f"PASSKEY = {i * 7919 % 10000:04d}\n" for i in range(200)))
    data = DataConfig(name="text", source="path", path=str(folder), root=str(root / "data"))
    prepare(data, log=lambda message: None)
    return ["data=text", f"data.path={data.path}", f"data.root={data.root}", "device=cpu"], TokenData(
        Path(data.root) / data.name)


def mixed(data: TokenData, starts: list[int], seed: int, length: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = data.windows("train", starts, length, torch.device("cpu"))
    PasskeyMix(0.5, len(starts), length, data.tokenizer, seed).apply(x, y, data.splits["train"], starts)
    return x, y


def test_the_first_rows_become_passkey_sequences_the_rest_stay_the_corpus(corpus):
    _, data = corpus
    starts = [0, 300, 600, 900]
    plain_x, plain_y = data.windows("train", starts, 64, torch.device("cpu"))
    x, y = mixed(data, starts, seed=7)
    assert torch.equal(x[2:], plain_x[2:]) and torch.equal(y[2:], plain_y[2:])
    for row in range(2):
        text = data.tokenizer.decode(x[row].tolist())
        digits = data.tokenizer.decode(y[row, -DIGITS:].tolist())
        assert digits.isdigit() and len(digits) == DIGITS
        assert (y[row, :-DIGITS] == IGNORE).all()  # the loss is on the final digits only
        assert text.endswith(KEY + digits[:-1])  # the key line again at the end, its last digit the last target
        assert text.count(KEY + digits) == 1  # stated once before, at its depth, in the corpus's own text
        depth = text.index(KEY + digits)
        kept = np.r_[0:depth, depth + len(KEY) + DIGITS:64 - len(KEY) - DIGITS + 1]
        assert torch.equal(x[row, kept], plain_x[row, kept])  # the filler is the window itself


def test_the_sequences_come_from_the_seed_and_the_starts_alone(corpus):
    _, data = corpus
    first, again = mixed(data, [0, 300, 600, 900], seed=7), mixed(data, [0, 300, 600, 900], seed=7)
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    assert not torch.equal(first[1][:2, -DIGITS:], mixed(data, [0, 300, 600, 900], seed=8)[1][:2, -DIGITS:])
    assert not torch.equal(first[1][:2, -DIGITS:], mixed(data, [1, 301, 600, 900], seed=7)[1][:2, -DIGITS:])


def final_state(run_dir: Path) -> dict:
    return {k: v for k, v in torch.load(run_dir / "ckpt.pt", weights_only=True).items() if k != "config"}


def train(corpus, out: Path, *args: str) -> None:
    result = run_inline("train", *RUN, *corpus[0], *args, f"out_dir={out}")
    assert result.returncode == 0, result.stderr


def test_the_weighted_loss_is_the_passkey_rows_mean_and_the_text_rows_mean_mixed():
    torch.manual_seed(0)
    logits, y = torch.randn(4, 6, 10), torch.randint(0, 10, (4, 6))
    y[:1, :-2] = IGNORE  # one passkey row (of 4: fraction 0.25), its last 2 targets scored
    mix = PasskeyMix.__new__(PasskeyMix)
    mix.rows, mix.weight = 1, 0.3
    passkey = sum(-torch.log_softmax(logits[0, t].double(), -1)[y[0, t]] for t in (4, 5)) / 2
    text = sum(-torch.log_softmax(logits[r, t].double(), -1)[y[r, t]] for r in range(1, 4) for t in range(6)) / 18
    model_loss = torch.tensor(1.0)
    assert abs(mix.loss(logits, y, model_loss).item() - (0.3 * passkey + 0.7 * text).item()) < 1e-6
    mix.weight = None
    assert mix.loss(logits, y, model_loss) is model_loss  # without a weight: the model's own mean, every target alike


@pytest.mark.parametrize("weight", [[], ["train.passkey_weight=0.5"]], ids=["tokens", "weighted"])
def test_a_run_with_passkeys_trains_on_them_and_resumes_to_the_same_weights(corpus, tmp_path, weight):
    train(corpus, tmp_path / "plain", "train.max_iters=4")
    train(corpus, tmp_path / "straight", "train.max_iters=4", "train.passkey=0.5", *weight)
    train(corpus, tmp_path / "resumed", "train.max_iters=2", "train.passkey=0.5", *weight)
    train(corpus, tmp_path / "resumed", "train.max_iters=4", "train.passkey=0.5", *weight, "resume=true")
    straight, resumed = final_state(tmp_path / "straight"), final_state(tmp_path / "resumed")
    plain = final_state(tmp_path / "plain")
    assert straight.keys() == resumed.keys()
    for name, tensor in straight["model"].items():
        assert torch.equal(tensor, resumed["model"][name]), name
    assert any(not torch.equal(t, plain["model"][k]) for k, t in straight["model"].items())  # the rows were mixed in


@pytest.mark.parametrize("args, message", [
    (["train.passkey=1"], "train.passkey must be in [0, 1), got 1.0"),
    (["train.passkey=-0.5"], "train.passkey must be in [0, 1), got -0.5"),
    (["train.passkey=0.5", "train.passkey_weight=1"], "train.passkey_weight must be in (0, 1) or null, got 1.0"),
    (["train.passkey=0.5", "train.passkey_weight=0"], "train.passkey_weight must be in (0, 1) or null, got 0.0"),
    (["train.passkey_weight=0.5"], "train.passkey_weight=0.5 is set but train.passkey is 0"),
    (["train.passkey=0.1"], "train.passkey=0.1 gives no passkey row in a micro-batch of train.batch_size=4"),
    (["train.passkey=0.5", "model.block_size=16"], "train.passkey: passkey: the key line twice (30 tokens) does "
                                                   "not fit in length 16"),
    (["train.passkey=0.5", "data.path=PLAIN", "data.name=plain"], "train.passkey: character 'P' is not in this "
                                                                   "model's character vocabulary"),
    (["train.passkey=0.5", "chat.data=chats.jsonl"], "train.passkey mixes passkey sequences into the corpus's "
                                                     "windows; chat.data has none"),
])
def test_bad_settings_are_one_error_line_and_nothing_written(corpus, tmp_path, args, message):
    if "data.path=PLAIN" in args:  # a corpus without the key's capitals
        plain = str(write_corpus(tmp_path / "plain"))
        args = [a.replace("PLAIN", plain) for a in args]
    result = run_inline("train", *RUN, "train.max_iters=1", *corpus[0], *args, f"out_dir={tmp_path / 'run'}")
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert lines == [f"error: {message}"] and "Traceback" not in result.stderr, result.stderr
    assert not (tmp_path / "run" / "ckpt.pt").exists()

"""The probe tasks: every generator deterministic from its seed, every answer what the task's definition says (read
back from the sequence itself, and a few checked by hand), and impossible settings refused with the setting named."""

import math

import numpy as np
import pytest
import torch

from conftest import write_corpus
from gpt.data.config import DataConfig
from gpt.errors import ConfigError, UserError
from gpt.model import GPT, GPTConfig
from gpt.probes.corpus import PLACEHOLDER_VOCAB, Corpus, open_corpus
from gpt.probes.registry import build, task_names
from gpt.probes.tasks import IGNORE, TaskSettings

SMALL = TaskSettings(seq_len=32, vocab=64, mqar_pairs=[2, 8], small_vocab=8, memory_keys=6, copy_tokens=4,
                     passkey_digits=3, passkey_lengths=[1, 2], corpus_lengths=[1, 2], motif=2)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """conftest's small text files prepared with characters (the corpus task's data)."""
    root = tmp_path_factory.mktemp("corpus")
    return open_corpus(DataConfig(name="text", source="path", path=str(write_corpus(root / "text")),
                                  root=str(root / "data")))


def tasks(data=None, **changes):
    settings = TaskSettings(**{**SMALL.__dict__, **changes})
    return {t.name: t for t in build(task_names(), settings, data)}


def draw(task, seed=3, n=64, length=None):
    task.constants(seed)
    return task.sample(np.random.default_rng([seed, 0]), n, length)


def test_every_task_is_deterministic_from_its_seed_and_differs_across_seeds(corpus):
    for name, task in tasks(corpus).items():
        for length in task.metrics().values():
            a, b, c = draw(task, 5, 16, length), draw(task, 5, 16, length), draw(task, 6, 16, length)
            assert a[0].shape == a[1].shape == (16, length), name
            assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]), name
            assert not (np.array_equal(a[0], c[0]) and np.array_equal(a[1], c[1])), name
            assert a[0].min() >= 0 and max(a[0].max(), a[1].max()) < task.vocab_size, name
            assert (a[1] != IGNORE).any(), f"{name} has no answer position"


def test_mqar_answers_are_the_values_bound_to_each_queried_key_once_each():
    task = tasks()["mqar@8"]
    inputs, targets = draw(task, n=200)
    for x, y in zip(inputs, targets):
        bound = dict(zip(x[0:16:2].tolist(), x[1:16:2].tolist()))  # the 8 pairs first
        assert len(bound) == 8 and all(1 <= k < 32 <= v < 64 for k, v in bound.items())
        asked = np.flatnonzero(y != IGNORE)
        assert len(asked) == 8 and (asked >= 16).all() and ((asked - 16) % 2 == 0).all()
        assert sorted(x[asked].tolist()) == sorted(bound)  # each key queried once
        assert [bound[k] for k in x[asked].tolist()] == y[asked].tolist()
    inputs, targets = draw(tasks()["mqar@2"], n=2000)
    gaps = (np.flatnonzero(targets[:, 4:].reshape(-1) != IGNORE) % 28) // 2  # 14 query slots after 2 pairs
    assert gaps.mean() < 4.5  # power law (a = 0.01, p ~ 1/gap): short gaps likelier than the uniform mean of 6.5


def test_a_few_answers_checked_by_hand():
    t = tasks()
    x, y = draw(t["mqar@2"], n=1)
    x, y = x[0].tolist(), y[0].tolist()
    (k1, v1, k2, v2), queries = x[:4], [i for i, a in enumerate(y) if a != IGNORE]
    assert {x[q]: y[q] for q in queries} == {k1: v1, k2: v2}
    x, y = draw(t["passkey"], n=1, length=64)
    x, y = x[0].tolist(), y[0].tolist()
    key = x.index(8 + 10)  # the key marker, after 8 filler and 10 digit tokens
    assert x[-3] == 8 + 11 and y[-3:] == x[key + 1:key + 4]  # the query marker and the digits predict the digits
    assert set(y[:-3]) == {IGNORE}
    x, y = draw(t["selective_copying"], n=1)
    x, y = x[0].tolist(), y[0].tolist()
    assert y[-4:] == [v for v in x[:x.index(9)] if v != 8] and set(y[:-4]) == {IGNORE}  # 8 blank, 9 copy
    x, y = draw(t["memorization"], seed=4, n=2)
    task = t["memorization"]
    assert y[0, 1::2].tolist() == task.map[x[0, 0::2]].tolist() and sorted(task.map) == list(range(6, 12))
    x, y = draw(t["induction"], n=1)
    answered = np.flatnonzero(y[0] != IGNORE)
    assert (y[0, answered] == x[0, answered - 16]).all() and len(answered) == 15  # 17 tokens, then again


@pytest.mark.parametrize("name", ["in_context_recall", "noisy_recall", "fuzzy_recall"])
def test_recall_answers_are_the_value_that_followed_the_same_key_earlier(name):
    task = tasks()[name]
    inputs, targets = draw(task, n=100)
    half = 4  # keys 0..3, values 4..7, then noise or pad tokens
    for x, y in zip(inputs, targets):
        seen, key, value, values = {}, [], [], []
        for i, token in enumerate(x.tolist() + [None]):
            if token is not None and token < half:
                if value:
                    seen[tuple(key)] = value
                    key, value = [], []
                key.append(token)
            elif token is not None and half <= token < 2 * half:
                value.append(token)
                values.append((i, tuple(key) in seen and seen[tuple(key)][len(value) - 1] if tuple(key) in seen
                               else None))
            else:  # noise or padding ends a pair
                if value:
                    seen[tuple(key)] = value
                key, value = [], []
        answered = {i + 1: v for i, v in enumerate(y.tolist()) if v != IGNORE and i + 1 < len(x)}  # i predicts i + 1
        expected = {i: v for i, v in values if v is not None and i >= 1}
        assert answered == expected


def test_compression_answers_the_sequence_after_the_compression_token():
    x, y = draw(tasks()["compression"], n=4)
    k = 31 // 2
    assert (x[:, k] == 9).all() and (y[:, k + 1:2 * k + 1] == x[:, :k]).all()


@pytest.mark.parametrize("changes, message", [
    (dict(mqar_pairs=[9]), "9 key-value pairs and their 9 queries need an even context of at least 36 tokens"),
    (dict(vocab=16), "probes.vocab=16 holds 7 keys, fewer than 8 pairs"),
    (dict(passkey_digits=20), "passkey: 20 digits twice and two markers do not fit"),
    (dict(copy_tokens=16), "must exceed twice probes.copy_tokens=16"),
    (dict(passkey_lengths=[0, 2]), "probes.passkey_lengths must be positive"),
    (dict(noise_fraction=1.0), "probes.noise_fraction must be in"),
    (dict(corpus_lengths=[1, 0]), "probes.corpus_lengths must be positive multiples of probes.seq_len"),
    (dict(corpus_lengths=[]), "probes.corpus_lengths must be positive multiples"),
    (dict(corpus_lengths=[2, 2]), "probes.corpus_lengths names a length twice"),
])
def test_impossible_settings_are_refused_naming_the_setting(changes, message):
    with pytest.raises(ConfigError, match=message):
        tasks(**changes)


def test_an_unknown_task_lists_the_known_ones():
    with pytest.raises(ConfigError, match="unknown task 'recall'") as err:
        build(["recall"], SMALL)
    assert err.value.hint == "the tasks: " + ", ".join(task_names()) and "in_context_recall" in err.value.hint


def test_the_corpus_task_trains_on_the_train_split_and_scores_bits_per_byte_of_the_val_split(corpus):
    task = tasks(corpus)["corpus"]
    assert task.metrics() == {"corpus@1x": 32, "corpus@2x": 64} and task.lower_is_better
    assert task.vocab_size == corpus.tokenizer.vocab_size and tasks()["corpus"].vocab_size == PLACEHOLDER_VOCAB
    for draw_from, split in ((task.sample, "train"), (task.held_out, "val")):
        inputs, targets = draw_from(np.random.default_rng(1), 4, 64)
        text = np.asarray(corpus.splits[split].read(0, len(corpus.splits[split])))
        for x, y in zip(inputs, targets):  # each window a run of the split's tokens, every next token a target
            assert np.array_equal(x[1:], y[:-1]) and (y != IGNORE).all()
            hits = [i for i in range(len(text) - 64) if np.array_equal(text[i:i + 64], x)]
            assert hits and np.array_equal(text[hits[0] + 1:hits[0] + 65], y)
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=64, vocab_size=task.vocab_size))
    inputs, targets = task.held_out(np.random.default_rng(2), 5, 64)
    with torch.no_grad():
        logits, _ = model(torch.from_numpy(inputs))
    nats = -torch.log_softmax(logits.double(), -1).gather(-1, torch.from_numpy(targets)[..., None]).sum()
    size = sum(len(corpus.tokenizer.token_bytes(int(t))) for t in targets.flat)  # ASCII: a byte a character
    assert size == targets.size
    assert task.score(model, inputs, targets, torch.device("cpu"), 2) == pytest.approx(float(nats) / math.log(2) / size,
                                                                                       rel=1e-9)


def test_a_corpus_too_short_for_the_longest_length_is_refused(corpus):
    with pytest.raises(UserError, match=r"split of .* has \d+ tokens, fewer than one corpus window of 16385"):
        Corpus(TaskSettings(seq_len=2048, corpus_lengths=[1, 8]), corpus)

"""The demonstration's instruction set: exact answers, every task and phrasing, held-out words and sums never seen
in training, the same set from the same seed; its prompts are the template's generation prompt."""

from __future__ import annotations

import pytest
from test_chat_data import CHARS

from benchmarks.chat_demo import ChatDemoConfig, prompt_ids
from gpt.data.chat import encode_conversation, with_chat_tokens
from gpt.data.instructions import PHRASINGS, split
from gpt.errors import ConfigError
from gpt.tokenizers.tokenizer import CharTokenizer


def test_held_out_items_are_new_and_every_answer_is_exact():
    train, heldout = split(2000, 200, seed=5)
    assert (train, heldout) == split(2000, 200, seed=5) and split(2000, 200, seed=6) != (train, heldout)
    assert not {(i.task, i.key) for i in heldout} & {(i.task, i.key) for i in train}
    assert {i.task for i in heldout} == set(PHRASINGS)
    assert len({i.prompt.replace(i.key, "{}") for i in train if i.task != "add"}) >= 10  # phrasings vary
    for item in train + heldout:
        if item.task == "add":
            a, b = map(int, item.key.split("+"))
            assert item.answer == str(a + b)
        else:
            expected = {"reverse": item.key[::-1], "sort": "".join(sorted(item.key)), "count": str(len(item.key))}
            assert item.answer == expected[item.task] and item.key in item.prompt


def test_a_held_out_prompt_is_the_conversation_up_to_the_reply():
    tokenizer = with_chat_tokens(CharTokenizer(CHARS))
    _, heldout = split(10, 8, seed=1)
    for item in heldout:
        ids, learned = encode_conversation(tokenizer, item.messages())
        prompt = prompt_ids(tokenizer, item)
        assert ids[: len(prompt)] == prompt and not any(learned[: len(prompt)]) and all(learned[len(prompt):-1])



@pytest.mark.parametrize("bad", [[], ["lora", "lora"], ["full", "qlora"]])
def test_ways_names_full_lora_or_both_once_each(bad):
    assert ChatDemoConfig(base="runs/x").ways == ["full", "lora"]
    assert ChatDemoConfig(base="runs/x", ways=["lora"]).ways == ["lora"]
    with pytest.raises(ConfigError, match="ways must name full, lora or both") as err:
        ChatDemoConfig(base="runs/x", ways=bad)
    assert err.value.hint


def test_a_stopped_fine_tuning_stops_the_demonstration_instead_of_measuring_it(tmp_path, monkeypatch):
    """A fine-tuning stopped by a signal has no result: the demo stops in one line (Ctrl-C's exit) naming the
    checkpoint, where it used to measure the unfinished model and report its zeros."""
    from benchmarks import chat_demo
    from gpt.train.records import Summary

    def stopped(run, run_dir, log):
        return Summary(params=1, step=478, tokens=0, best_val_loss=7.97, final_train_loss=7.95, final_val_loss=7.97,
                       tokens_per_sec=1.0, peak_memory_bytes=0, wall_s=1.0, ckpt=run_dir / "ckpt.pt", interrupted=True)

    monkeypatch.setattr(chat_demo, "train", stopped)
    cfg = ChatDemoConfig(base="runs/x", out_dir=str(tmp_path), ways=["full"])
    with pytest.raises(KeyboardInterrupt, match=r"full fine-tuning stopped at step 478; its checkpoint is .*ckpt\.pt"):
        chat_demo.fine_tune(cfg, tmp_path, lora=False, log=lambda *_: None)

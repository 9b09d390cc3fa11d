"""Chat fine-tuning's data: conversation layouts and bad records, ChatML's ids and loss mask against the stored Jinja
template, the chat tokens added to a base model, packing without leakage, and SFT's exact resume."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from gpt import GPT, GPTConfig
from gpt.data.chat import CHATML_TEMPLATE, add_token_rows, batch, encode_conversation, pack, with_chat_tokens
from gpt.data.conversations import read_conversations
from gpt.errors import UserError
from gpt.inference.chat_template import ChatTemplate, Renderer
from gpt.schema import register, typed
from gpt.tokenizers.tokenizer import CharTokenizer
from gpt.train.trainer import train
from gpt.weights import checkpoint

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
CHARS = sorted(set("abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,?!:+-=\n"))
CONVERSATIONS = [
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Reverse abc"},
     {"role": "assistant", "content": "cba"}, {"role": "user", "content": "Sort cab"},
     {"role": "assistant", "content": "abc"}],
    [{"role": "user", "content": "What is 2+3?"}, {"role": "assistant", "content": "5"}],
]


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def test_the_three_layouts_read_as_the_same_messages(tmp_path):
    messages = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    sharegpt = {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}
    alpaca = {"instruction": "hi", "input": "", "output": "hello"}
    convs, skipped = read_conversations(str(write_jsonl(tmp_path / "c.jsonl", [messages, sharegpt, alpaca])))
    assert convs == [messages["messages"]] * 3 and skipped.count == 0
    with_input, _ = read_conversations(str(write_jsonl(tmp_path / "a.jsonl", [alpaca | {"input": "x"}])), "alpaca")
    assert with_input[0][0]["content"] == "hi\n\nx"


@pytest.mark.parametrize("record, why", [
    ("{not json", "not valid JSON"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "message 0 has role 'robot'"),
    ({"messages": [{"role": "user", "content": "x"}]}, "no assistant message"),
    ({"messages": [{"role": "user", "content": "<|im_end|>"}, {"role": "assistant", "content": "y"}]},
     "special token <|im_end|>"),
    ({"text": "plain"}, 'no "messages", "conversations" or "instruction" field'),
])
def test_a_bad_record_is_one_error_naming_file_and_line_or_skipped_and_counted(tmp_path, record, why):
    good = {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}
    path = write_jsonl(tmp_path / "c.jsonl", [good, record, good])
    with pytest.raises(UserError, match=re.escape(f"{path}:2: ") + ".*" + re.escape(why)):
        read_conversations(str(path))
    convs, skipped = read_conversations(str(path), skip_bad=True)
    assert len(convs) == 2 and skipped.count == 1 and skipped.first.startswith(f"{path}:2: ")


def test_a_saved_dataset_folder_reads_like_the_file(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = [{"messages": c} for c in CONVERSATIONS]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "ds"))
    convs, _ = read_conversations(str(tmp_path / "ds"))
    assert convs == CONVERSATIONS


def test_ids_and_loss_mask_match_the_stored_template_token_by_token():
    """The server renders the checkpoint's template (sandboxed Jinja) and encodes it: the same ids as training's;
    the learned tokens are exactly each assistant reply's text and its <|im_end|>, nothing else."""
    tokenizer = with_chat_tokens(CharTokenizer(CHARS))
    assert tokenizer.to_meta()["chat_template"] == CHATML_TEMPLATE
    renderer = Renderer()
    try:
        template = ChatTemplate(CHATML_TEMPLATE, tokenizer, tokenizer.to_meta(), renderer)
        for messages in CONVERSATIONS:
            ids, learned = encode_conversation(tokenizer, messages)
            prompt = template.render(messages)  # ends with the generation prompt <|im_start|>assistant\n
            assert ids + template.encode("<|im_start|>assistant\n") == template.encode(prompt)
            spans, current = [], []
            for token, keep in zip(ids, learned):
                if keep:
                    current.append(token)
                elif current:
                    spans.append(tokenizer.decode(current))
                    current = []
            assert spans == [m["content"] + "<|im_end|>" for m in messages if m["role"] == "assistant"]
    finally:
        renderer.close()


def test_chat_tokens_are_added_rows_at_the_mean_and_nothing_else_changes():
    base = CharTokenizer(CHARS)
    chat = with_chat_tokens(base)
    assert chat.vocab_size == base.vocab_size + 2 and chat.special_tokens == {"<|im_start|>": len(CHARS),
                                                                              "<|im_end|>": len(CHARS) + 1}
    assert chat.encode("Sort cab") == base.encode("Sort cab")
    for tie in (True, False):
        config = GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=32, vocab_size=len(CHARS), tie_head=tie)
        state = GPT(config).state_dict()
        grown_config, grown = add_token_rows(config, state, base, chat)
        assert grown_config.vocab_size == len(CHARS) + 2
        for key in ("transformer.wte.weight", "lm_head.weight"):
            assert torch.equal(grown[key][: len(CHARS)], state[key])
            assert torch.allclose(grown[key][len(CHARS):], state[key].mean(0).expand(2, -1))
        assert all(torch.equal(grown[k], v) for k, v in state.items() if k not in ("transformer.wte.weight",
                                                                                   "lm_head.weight"))
        GPT(grown_config).load_state_dict(grown)


@pytest.mark.parametrize("design", [{}, {"designs": ["rope"]}, {"designs": ["qk_norm"]}])
def test_a_packed_row_keeps_conversations_apart(design):
    """Conversation B's logits in a packed row do not change when conversation A before it changes, and equal B's
    logits alone."""
    tokenizer = with_chat_tokens(CharTokenizer(CHARS))
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=96, vocab_size=tokenizer.vocab_size,
                          **design)).eval()
    a1, a2 = (encode_conversation(tokenizer, [{"role": "user", "content": q}, {"role": "assistant", "content": r}])
              for q, r in (("Sort cab", "abc"), ("What? 12", "XYZ")))
    b = encode_conversation(tokenizer, CONVERSATIONS[1])
    assert len(a1[0]) == len(a2[0]) and a1[0] != a2[0]
    logits = []
    for a in (a1, a2):
        packed = pack([a, b], 96)
        assert len(packed.inputs) == 1
        x, _, extra = batch(packed, [0], torch.device("cpu"))
        logits.append(model(x, **extra)[0][0, len(a[0]) - 1: len(a[0]) - 1 + len(b[0]) - 1])
    alone = model(torch.tensor([b[0][:-1]]))[0][0]
    assert torch.equal(logits[0], logits[1])
    torch.testing.assert_close(logits[0], alone, atol=1e-5, rtol=1e-5)


def save_base(path: Path) -> Path:
    torch.manual_seed(3)
    config = GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=64, vocab_size=len(CHARS))
    checkpoint.save({"model": GPT(config).state_dict(), "model_config": config.to_dict(),
                     "tokenizer": CharTokenizer(CHARS).to_meta()}, path)
    return path


def sft(tmp_path: Path, out: str, *extra: str) -> Path:
    data = write_jsonl(tmp_path / "chat.jsonl", [{"messages": CONVERSATIONS[i % 2]} for i in range(20)])
    register()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        cfg = compose(config_name="train", overrides=[
            "device=cpu", f"chat.data={data}", "train.batch_size=2",
            *([] if any(e.startswith("init_from=") for e in extra) else [f"init_from={tmp_path / 'base.pt'}"]),
            "train.eval_iters=1", "train.sample_tokens=0", "train.warmup_iters=0", "train.learning_rate=1e-2",
            "train.schedule=constant",
            f"out_dir={tmp_path / out}", *extra])
    train(typed(cfg), tmp_path / out, log=lambda message: None)
    return tmp_path / out


def test_sft_resumed_halfway_equals_a_straight_run_and_carries_the_template(tmp_path):
    save_base(tmp_path / "base.pt")
    straight = sft(tmp_path, "straight", "train.max_iters=4", "train.eval_interval=2")
    sft(tmp_path, "halves", "train.max_iters=2", "train.eval_interval=2")
    halves = sft(tmp_path, "halves", "train.max_iters=4", "train.eval_interval=2", "resume=true")
    a, b = (torch.load(run / "ckpt.pt", weights_only=True) for run in (straight, halves))
    assert a["step"] == b["step"] == 4
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert a["tokenizer"]["chat_template"] == CHATML_TEMPLATE and a["model_config"]["vocab_size"] == len(CHARS) + 2
    base = torch.load(tmp_path / "base.pt", weights_only=True)["model"]
    assert not torch.equal(a["model"]["transformer.h.0.mlp.c_fc.weight"], base["transformer.h.0.mlp.c_fc.weight"])


def test_text_the_model_cannot_encode_names_the_conversation(tmp_path):
    from gpt.data.chat import ChatData
    from gpt.train.config import ChatConfig

    good = {"messages": CONVERSATIONS[1]}
    bad = {"messages": [{"role": "user", "content": "café"}, {"role": "assistant", "content": "ok"}]}
    path = write_jsonl(tmp_path / "c.jsonl", [good, bad])
    with pytest.raises(UserError, match=re.escape(f"{path}, conversation 2: character 'é' is not in")):
        ChatData(ChatConfig(data=str(path)), CharTokenizer(CHARS), seed=0, log=lambda m: None)

"""A fine-tuned chat model leaves with its template: the Hugging Face export's tokenizer_config.json carries it and
the added chat tokens, so transformers' apply_chat_template gives the training ids; GPT-2 weights from a local
Hugging Face folder fine-tune with LoRA and export that way, with transformers' logits equal to ours."""

from __future__ import annotations

import json

import pytest
import torch
from test_chat_data import CHARS, CONVERSATIONS, sft, write_jsonl

from conftest import needs_gpt2
from gpt import GPT, GPTConfig
from gpt.data.chat import CHATML_TEMPLATE, encode_conversation, with_chat_tokens
from gpt.interop import formats
from gpt.tokenizers.tokenizer import CharTokenizer, from_meta
from gpt.weights import load as pretrained

transformers = pytest.importorskip("transformers")


def assert_template_round_trip(folder, meta: dict) -> None:
    """apply_chat_template of the exported tokenizer gives training's ids, with and without the generation prompt."""
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    tokenizer = from_meta(meta)
    assert hf_tokenizer.chat_template == CHATML_TEMPLATE
    for messages in CONVERSATIONS:
        ids, _ = encode_conversation(tokenizer, messages)
        as_ids = lambda out: list(out["input_ids"] if hasattr(out, "keys") else out)  # noqa: E731
        assert as_ids(hf_tokenizer.apply_chat_template(messages, tokenize=True)) == ids
        prompt = as_ids(hf_tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True))
        assert prompt == ids + [tokenizer.special_tokens["<|im_start|>"], *tokenizer.encode("assistant\n")]


def test_a_character_chat_model_exports_its_template_and_tokens(tmp_path):
    meta = with_chat_tokens(CharTokenizer(CHARS)).to_meta()
    config = GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=64, vocab_size=meta["vocab_size"])
    out = formats.export(GPT(config).state_dict(), config, meta, tmp_path / "exp")
    assert json.loads((out / "tokenizer_config.json").read_text())["chat_template"] == CHATML_TEMPLATE
    assert_template_round_trip(out, meta)
    _, _, loaded = pretrained.load_weights(str(out))
    assert loaded == meta  # the export reads back with its template and tokens


@needs_gpt2
def test_gpt2_from_a_local_folder_fine_tunes_with_lora_and_exports_with_the_template(tmp_path):
    """No hub here: the local folder is a tiny GPT-2-shaped model saved by transformers, as a user's download is."""
    torch.manual_seed(0)
    hf_config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=32, n_positions=64, vocab_size=50257)
    transformers.GPT2LMHeadModel(hf_config).save_pretrained(tmp_path / "gpt2-local")
    write_jsonl(tmp_path / "chat.jsonl", [{"messages": CONVERSATIONS[i % 2]} for i in range(8)])
    run = sft(tmp_path, "lora", "init_from=gpt2", f"init_path={tmp_path / 'gpt2-local'}", "chat.lora_rank=2",
              "train.max_iters=2", "train.eval_interval=2")
    ckpt = torch.load(run / "ckpt.pt", weights_only=True)
    meta = ckpt["tokenizer"]
    assert meta["kind"] == "gpt2" and meta["added_tokens"] == ["<|im_start|>", "<|im_end|>"]
    assert (run / "adapter.pt").stat().st_size < (run / "ckpt.pt").stat().st_size / 10
    config = GPTConfig.from_dict(ckpt["model_config"])
    out = formats.export(ckpt["model"], config, meta, tmp_path / "exp")
    assert_template_round_trip(out, meta)
    model = GPT(config).eval()
    model.load_state_dict(ckpt["model"])
    ids, _ = encode_conversation(from_meta(meta), CONVERSATIONS[1])
    theirs = transformers.GPT2LMHeadModel.from_pretrained(out).eval()
    with torch.no_grad():
        torch.testing.assert_close(theirs(torch.tensor([ids])).logits, model(torch.tensor([ids]))[0],
                                   atol=1e-4, rtol=1e-4)

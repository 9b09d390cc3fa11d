"""The gpt-attention model inside lm-evaluation-harness: a local task run through simple_evaluate, log-likelihoods
against an unbatched float64 computation and against transformers on the Hugging Face export, KV-cache generation."""

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from gpt.inference.decoding import generate
from gpt.interop import formats
from gpt.model import GPT
from gpt.model.config import GPTConfig
from gpt.tokenizers.tokenizer import CharTokenizer
from gpt.weights import checkpoint

lm_eval = pytest.importorskip("lm_eval", reason="lm-evaluation-harness is not installed (pip install -e '.[eval]')")
from gpt.evaluation.lm_eval_model import GPTAttentionLM  # noqa: E402

CHARS = CharTokenizer(list("\n .,:?abcdefghijklmnopqrstuvwxyzAQT"))
DOCS = [{"query": "the cat sat on the", "choices": ["mat", "sky", "a tree at noon"], "gold": 0},
        {"query": "Q: two and two make", "choices": ["four", "five", "fish"], "gold": 0},
        {"query": "a long road leads to the", "choices": ["sea", "town.", "sky"], "gold": 1},
        {"query": "At night we see the", "choices": ["moon", "sun", "stars in the sky"], "gold": 2}]
TEXTS = [{"text": "the cat sat on the mat. the dog sat too."}, {"text": "a quiet sea at night"}]


def randomised(config: GPTConfig) -> GPT:
    """Random weights scaled up so that log-likelihoods differ clearly between choices."""
    torch.manual_seed(5)
    model = GPT(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if not name.endswith(".bias") and ".ln_" not in name and "ln_f" not in name:
                param.mul_(8.0)
    return model


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lm_eval")
    config = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=48, vocab_size=CHARS.vocab_size, dropout=0.0)
    model = randomised(config)
    checkpoint.save(checkpoint.model_entries(model.state_dict(), config, CHARS.to_meta()), folder / "ckpt.pt")
    return folder, model


def reference_loglik(model: GPT, context: str, continuation: str) -> float:
    """The continuation's log-probability from one float64 pass over the whole (short) text."""
    ids = CHARS.encode(context + continuation)
    logp = F.log_softmax(model.double()(torch.tensor(ids[:-1])[None])[0][0].double(), -1)
    model.float()
    return sum(logp[j - 1, ids[j]].item() for j in range(len(context), len(ids)))


def write_tasks(folder, docs_path, texts_path):
    """Two local lm-eval tasks: a multiple choice over docs_path and a rolling perplexity over texts_path."""
    choice = {"task": "tiny_choice", "dataset_path": "json", "dataset_kwargs": {"data_files": {"validation": str(
        docs_path)}}, "output_type": "multiple_choice", "validation_split": "validation", "doc_to_text": "{{query}}",
              "doc_to_target": "{{gold}}", "doc_to_choice": "{{choices}}",
              "metric_list": [{"metric": "acc"}, {"metric": "acc_norm"}]}
    rolling = {"task": "tiny_rolling", "dataset_path": "json", "dataset_kwargs": {"data_files": {"validation": str(
        texts_path)}}, "output_type": "loglikelihood_rolling", "validation_split": "validation", "doc_to_text": "",
               "doc_to_target": "{{text}}", "metric_list": [{"metric": "word_perplexity"}]}
    for task in (choice, rolling):
        (folder / f"{task['task']}.yaml").write_text(json.dumps(task))  # JSON is YAML


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    """The two local tasks, and one TaskManager for them (building one indexes every task lm-eval ships: slow)."""
    from lm_eval.tasks import TaskManager

    folder = tmp_path_factory.mktemp("tasks")
    (folder / "docs.jsonl").write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    (folder / "texts.jsonl").write_text("".join(json.dumps(d) + "\n" for d in TEXTS))
    write_tasks(folder, folder / "docs.jsonl", folder / "texts.jsonl")
    return TaskManager(include_path=str(folder))


def test_simple_evaluate_on_a_local_task_matches_a_float64_reference(saved, tasks, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    folder, model = saved
    lm = GPTAttentionLM(ckpt=str(folder), device="cpu", batch_size=3)
    out = lm_eval.simple_evaluate(model=lm, tasks=["tiny_choice", "tiny_rolling"], task_manager=tasks)["results"]
    acc, acc_norm = [], []
    for doc in DOCS:
        lls = np.array([reference_loglik(model, doc["query"], " " + c) for c in doc["choices"]])
        acc.append(np.argmax(lls) == doc["gold"])
        acc_norm.append(np.argmax(lls / [len(c) for c in doc["choices"]]) == doc["gold"])
    assert out["tiny_choice"]["acc,none"] == pytest.approx(np.mean(acc))
    assert out["tiny_choice"]["acc_norm,none"] == pytest.approx(np.mean(acc_norm))
    assert 0 < np.mean(acc) < 1 or 0 < np.mean(acc_norm) < 1, "a uniform score would prove little"
    # word_perplexity = exp(-sum of each text's log-likelihood / its words); the first character is the context
    total = sum(reference_loglik(model, t["text"][0], t["text"][1:]) for t in TEXTS)
    words = sum(len(t["text"].split()) for t in TEXTS)
    assert out["tiny_rolling"]["word_perplexity,none"] == pytest.approx(math.exp(-total / words), rel=1e-6)


def test_rolling_windows_score_every_token_of_a_long_text_once(saved):
    folder, model = saved
    lm = GPTAttentionLM(ckpt=str(folder), device="cpu", batch_size=4)
    text = "the cat sat on the mat. " * 4 + "the end"  # 103 characters: windows of 48, 48 and 6 new targets
    ids, block = CHARS.encode(text), model.config.block_size
    expected = 0.0  # lm-eval's windows, the first character as context: the last window keeps a full context
    with torch.no_grad():
        for j in range(1, len(ids)):
            window = (j - 1) // block
            start = 0 if window == 0 else min(block * (window + 1), len(ids) - 1) - block
            logits, _ = model.double()(torch.tensor(ids[start:j])[None])
            expected += F.log_softmax(logits[0, -1].double(), -1)[ids[j]].item()
    model.float()
    got = lm.loglikelihood_rolling([SimpleNamespace(args=(text,))])[0]
    assert got == pytest.approx(expected, abs=1e-4)


def test_generation_is_the_greedy_kv_cache_continuation_cut_at_the_stop_string(saved):
    folder, model = saved
    lm = GPTAttentionLM(ckpt=str(folder), device="cpu", batch_size=2)
    prompts = ["the cat", "a long road leads"]
    greedy = [CHARS.decode(generate(model, torch.tensor([CHARS.encode(p)]), 12, temperature=0.0)[0].tolist()[len(p):])
              for p in prompts]
    stop = greedy[0][3:5]  # a string the first continuation contains
    got = lm.generate_until([SimpleNamespace(args=(prompts[0], {"until": [stop], "max_gen_toks": 12})),
                             SimpleNamespace(args=(prompts[1], {"until": ["\n\n\n"], "max_gen_toks": 12}))])
    assert got == [greedy[0][: greedy[0].find(stop)], greedy[1]] and len(got[1]) == 12


def test_loglikelihoods_agree_with_transformers_on_the_hugging_face_export(saved, tmp_path):
    transformers = pytest.importorskip("transformers")
    folder, model = saved
    export = formats.export(model.state_dict(), model.config, CHARS.to_meta(), tmp_path / "hf", format="hf")
    theirs = transformers.GPT2LMHeadModel.from_pretrained(export).eval()
    lm = GPTAttentionLM(ckpt=str(export), device="cpu", batch_size=5)
    requests = [(d["query"], " " + c) for d in DOCS for c in d["choices"]]
    ours = [ll for ll, _ in lm.loglikelihood([SimpleNamespace(args=r) for r in requests])]
    for (context, continuation), ll in zip(requests, ours):
        ids = CHARS.encode(context + continuation)
        with torch.no_grad():
            logp = F.log_softmax(theirs(torch.tensor([ids[:-1]])).logits[0].double(), -1)
        n = len(continuation)
        assert ll == pytest.approx(sum(logp[len(ids) - 1 - n + k, ids[len(ids) - n + k]].item() for k in range(n)),
                                   abs=1e-4)


def small_bpe(folder):
    """A 300-token byte-level BPE with <|endoftext|> (lm-eval's hf model needs an end-of-text token)."""
    from gpt.tokenizers.tokenizer import BPETokenizer
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    library = Tokenizer(models.BPE())
    library.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    library.decoder = decoders.ByteLevel()
    texts = [d["query"] + " " + " ".join(d["choices"]) for d in DOCS] * 20 + [t["text"] for t in TEXTS]
    library.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                                           initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    folder.mkdir()
    library.save(str(folder / "tokenizer.json"))
    return BPETokenizer.from_file(folder)


def test_lm_eval_harness_runs_transformers_on_a_remote_code_export(tasks, tmp_path, monkeypatch):
    """lm-eval's own hf model (AutoModelForCausalLM with trust_remote_code) on an exported non-GPT-2 design and a
    local task: the log-likelihoods and scores of this project's model on the same export."""
    pytest.importorskip("transformers")
    from lm_eval.models.huggingface import HFLM

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    tokenizer = small_bpe(tmp_path / "tok")
    config = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=48, vocab_size=tokenizer.vocab_size,
                       designs=["alibi", "qk_norm"])
    export = formats.export(randomised(config).state_dict(), config, tokenizer.to_meta(), tmp_path / "hf")
    assert (export / "modeling_gpt_attention.py").is_file()
    theirs = HFLM(pretrained=str(export), trust_remote_code=True, dtype="float32", device="cpu", batch_size=3)
    ours = GPTAttentionLM(ckpt=str(export), device="cpu", batch_size=3)
    requests = [SimpleNamespace(args=(d["query"], " " + c)) for d in DOCS for c in d["choices"]]
    for (a, _), (b, _) in zip(theirs.loglikelihood(requests), ours.loglikelihood(requests)):
        assert a == pytest.approx(b, abs=1e-4)
    scores = [lm_eval.simple_evaluate(model=lm, tasks=["tiny_choice"], task_manager=tasks)["results"]["tiny_choice"]
              for lm in (theirs, ours)]
    assert scores[0]["acc,none"] == scores[1]["acc,none"] and scores[0]["acc_norm,none"] == scores[1]["acc_norm,none"]

"""HellaSwag as lm-evaluation-harness scores it: its text clean-up, its context/continuation split, and acc / acc_norm
from log-likelihoods that match an unbatched float64 computation."""

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import needs_gpt2
from gpt.errors import UserError
from gpt.evaluation import hellaswag
from gpt.evaluation.loglik import encode_pair, loglikelihoods
from gpt.model import GPT
from gpt.model.config import GPTConfig
from gpt.tokenizers.tokenizer import CharTokenizer, GPT2Tokenizer

DOCS = [
    {"activity_label": "Removing ice from car", "ctx_a": "Then, the man writes over the snow.", "ctx_b": "then",
     "endings": [", the man adds wax to the windshield.", ", a woman [step] walks by.", " [title] he stops.",
                 ", the man continues."], "label": 3},
    {"activity_label": "Baking cookies", "ctx_a": "A woman mixes flour.", "ctx_b": "she",
     "endings": ["pours milk.", "eats a shoe  quickly.", "sings.", "opens the oven and waits for the dough."],
     "label": "0"},
    {"activity_label": "Personal Care and Style", "ctx_a": "[header] How to tie a tie [title] Cross it.",
     "ctx_b": "", "endings": ["Pull it.", "Loop it over.", "Drop it.", "Hide."], "label": 1},
]


def test_preprocess_is_lm_evals():
    assert hellaswag.preprocess("  A [title] B [step] C  ") == "A. B C"
    ex = hellaswag.example(DOCS[0])
    assert ex.query == "Removing ice from car: Then, the man writes over the snow. Then"
    assert ex.choices[1] == ", a woman walks by." and ex.gold == 3
    assert ex.choices[2] == " he stops."  # stripped first, so no " [title]" is left to become ". "
    assert hellaswag.example(DOCS[2]).query == "Personal Care and Style: How to tie a tie. Cross it."


@pytest.fixture(scope="module")
def model_and_tokenizer():
    text = "".join(ex.query + " " + "".join(ex.choices) for ex in map(hellaswag.example, DOCS))
    tokenizer = CharTokenizer.from_text(text)
    torch.manual_seed(0)
    config = GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=48, vocab_size=tokenizer.vocab_size, dropout=0.0)
    return GPT(config).double(), tokenizer


def reference_loglik(model, tokenizer, context: str, continuation: str) -> float:
    """The continuation's summed log-probability from one unpadded float64 pass over its last block_size + 1 tokens."""
    ids = tokenizer.encode(context + continuation)[-(model.config.block_size + 1) :]
    logits, _ = model(torch.tensor(ids[:-1])[None])
    logp = F.log_softmax(logits[0].double(), -1)
    n = len(continuation)
    return sum(logp[len(ids) - 1 - n + j, ids[len(ids) - n + j]].item() for j in range(n))


def test_acc_and_acc_norm_match_an_unbatched_float64_computation(model_and_tokenizer, tmp_path):
    model, tokenizer = model_and_tokenizer
    path = tmp_path / "hs.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    examples = hellaswag.read(path)
    scores = hellaswag.evaluate(model, tokenizer, examples, batch_size=5)
    acc, acc_norm = [], []
    for ex in examples:
        lls = np.array([reference_loglik(model, tokenizer, ex.query, " " + c) for c in ex.choices])
        acc.append(int(np.argmax(lls)) == ex.gold)
        acc_norm.append(int(np.argmax(lls / np.array([len(c) for c in ex.choices]))) == ex.gold)
    assert scores["examples"] == 3
    assert scores["acc"] == pytest.approx(np.mean(acc)) and scores["acc_norm"] == pytest.approx(np.mean(acc_norm))


def test_batched_loglikelihoods_equal_the_reference_whatever_the_batch(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    requests = [(ex.query, " " + c) for ex in map(hellaswag.example, DOCS) for c in ex.choices]
    expected = [reference_loglik(model, tokenizer, *r) for r in requests]  # long queries are cut to block_size
    for batch_size in (1, 7):
        got = loglikelihoods(model, [encode_pair(tokenizer, *r) for r in requests], batch_size=batch_size)
        assert [ll for ll, _ in got] == pytest.approx(expected, abs=1e-9)


@needs_gpt2
def test_context_and_continuation_are_split_as_lm_eval_splits_them():
    tok = GPT2Tokenizer()
    assert encode_pair(tok, "Hello ", "world") == (tok.encode("Hello"), tok.encode(" world"))
    assert encode_pair(tok, "", "Hi") == ([tok.eot_token], tok.encode("Hi"))
    context, continuation = encode_pair(tok, "The cat  ", "sat")  # every trailing space moves
    assert context == tok.encode("The cat") and continuation == tok.encode("The cat  sat")[len(context) :]


def test_malformed_files_are_named_by_file_and_line(tmp_path):
    cases = {'{"ctx_a": 1\n': ":1: not valid JSON", json.dumps(DOCS[0]) + "\n[1, 2]\n": ":2: the line must be",
             json.dumps({**DOCS[0], "label": 7}) + "\n": ":1: label 7 does not index",
             json.dumps({**DOCS[0], "label": 1.7}) + "\n": r":1: label 1\.7 does not index",  # never read as 1
             json.dumps({**DOCS[0], "label": None}) + "\n": ":1: label None does not index",
             json.dumps({**DOCS[0], "endings": "abcd"}) + "\n": ":1: endings must be a non-empty list, got 'abcd'",
             json.dumps({**DOCS[0], "endings": ["a", 2]}) + "\n": r":1: endings\[1\] must be a string",
             json.dumps({**DOCS[0], "ctx_b": None}) + "\n": ":1: ctx_b must be a string, got None",
             json.dumps({k: v for k, v in DOCS[0].items() if k != "endings"}) + "\n": ":1: endings is missing",
             '{"label": ' + "9" * 5000 + "}\n": ":1: an integer of 5000 digits",
             "[" * 50000 + "\n": ":1: arrays or objects nested",
             "\n": "holds no HellaSwag examples"}
    for i, (text, message) in enumerate(cases.items()):
        path = tmp_path / f"bad{i}.jsonl"
        path.write_text(text)
        with pytest.raises(UserError, match=message):
            hellaswag.read(path)
    (tmp_path / "hf.jsonl").write_text(json.dumps({**DOCS[0], "label": "2"}) + "\n")  # the Hugging Face copy's label
    assert hellaswag.read(tmp_path / "hf.jsonl")[0].gold == 2


def test_a_missing_file_and_an_offline_download_are_one_line_errors(tmp_path, monkeypatch):
    with pytest.raises(UserError, match="does not exist"):
        hellaswag.locate(str(tmp_path / "none.jsonl"), str(tmp_path))

    def offline(*args, **kwargs):
        raise OSError("network is unreachable")

    monkeypatch.setattr(hellaswag.urllib.request, "urlopen", offline)
    with pytest.raises(UserError, match="could not download HellaSwag") as err:
        hellaswag.locate(None, str(tmp_path))
    assert "hellaswag.path=" in err.value.hint and not (tmp_path / "hellaswag" / hellaswag.FILE).exists()

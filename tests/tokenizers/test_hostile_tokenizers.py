"""Tokenizer files as code-like input (issue 46, class 2), through the real scripts: a tokenizer.json whose Split
pre-tokenizer regex backtracks catastrophically is refused when it is loaded, by every door (preparation, training,
tokenizer evaluation, a checkpoint carrying it), with one `error:` line naming the file; a pattern that passes the
check but still makes the library give up on a text is one error too, not a pyo3 PanicException traceback; Ctrl-C
while a tokenizer is being learnt stops it within seconds."""

from __future__ import annotations

import hashlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, run_inline
from gpt import GPT, GPTConfig
from gpt.tokenizers import bpe
from gpt.tokenizers.split_pattern import problem
from gpt.weights import checkpoint

EXPONENTIAL = r"(a+)+$"  # (a+)+ on "aaaa...b": 2^n ways to split the a's
POLYNOMIAL = r"a*a*a*a*a*a*(?!a)\w"  # n^6 steps at each position of a long run of a's
LINEAR = r"a{0,30}a{0,30}a+(?!a)\d"  # passes the check; 961 n steps at each position: Oniguruma gives up at n ~ 10^4
IN_USE = {  # pre-tokenizer patterns of tokenizers people use: all accepted
    "gpt2": r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""",
    "llama3": r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
              r"""|\s*[\r\n]+|\s+(?!\S)|\s+""",
    "o200k": r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"""
             r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)?"""
             r"""|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
    "deepseek": r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"""
                r"""| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
    "cjk": r"[一-龥\u3040-ゟ゠-ヿ]+",
}
REFUSED = {  # pattern -> what the error says
    r"(a+)+$": "repeats '(a+)'", r"(?:a|ab)*c": "repeats '(?:a|ab)'", r"(\w+\s?)+$": "repeats '(\\w+\\s?)'",
    POLYNOMIAL: "repeats that can share a run ('a*a*a*a*a*a*') followed by a part that can fail ('(?!a)')",
    r"a{0,32}a{0,32}(?!a)\w": "repeats that can share a run", r"a?b?c?d?e?f?g?h?i?j?x": "followed by a part",
    r"(?:x{1,3}){2,}": "repeats '(?:x{1,3})'", r"(a)\1": "back-reference", r"(?(1)a|b)": "conditional",
    "(" * 100 + ")" * 100: "nests groups more than 64 deep", r"[ab": "unterminated '['",
}


def tokenizer_json(pattern: str) -> str:
    """A byte-level BPE (the 256 bytes and <|endoftext|>) whose pre-tokenizer splits on ``pattern`` first."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    table = bpe.bytes_to_unicode()
    tokenizer = Tokenizer(models.BPE(vocab={table[b]: b for b in range(256)}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(bpe.EOT, special=True, normalized=False)])
    return tokenizer.to_str()


def folder_with(path: Path, pattern: str) -> Path:
    path.mkdir(parents=True)
    (path / bpe.FILE_NAME).write_text(tokenizer_json(pattern))
    return path


def corpus(path: Path, *texts: str) -> Path:
    path.mkdir(parents=True)
    for i, text in enumerate(texts):
        (path / f"{i}.txt").write_text(text)
    return path


def snapshot(folder: Path) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


def one_error(result: subprocess.CompletedProcess, code: int, *named: str) -> None:
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr and "PanicException" not in result.stderr, result.stderr
    assert len(errors) == 1 and all(n in errors[0] for n in named), result.stderr


def test_pre_tokenizer_patterns_in_use_are_accepted_and_backtracking_ones_refused():
    for name, pattern in IN_USE.items():
        assert problem(pattern) is None, name
        bpe.check(tokenizer_json(pattern))  # the library compiles it too
    for pattern, said in REFUSED.items():
        assert said in (problem(pattern) or ""), pattern


def test_a_backtracking_pattern_is_refused_by_every_door(tmp_path):
    bad = folder_with(tmp_path / "tok", EXPONENTIAL)
    text = corpus(tmp_path / "corpus", "a" * 40 + "b\n", "def f(x):\n    return x\n")
    data = ["data=text", f"data.path={text}", f"data.root={tmp_path / 'data'}", "data.name=t"]
    before = snapshot(tmp_path)
    named = (str(bad / bpe.FILE_NAME), "Split", "repeats '(a+)'")
    one_error(run_inline("prepare", *data, f"data.tokenizer={bad}"), 2, *named)
    one_error(run_inline("train", *data, f"data.tokenizer={bad}", "model=tiny", "device=cpu",
                         f"out_dir={tmp_path / 'run'}"), 2, *named)
    one_error(run_inline("eval_tokenizer", f"tokenizers=[{bad}]", *data[:2]), 2, *named)
    # the same text inside a checkpoint's tokenizer description (how a model travels with its tokenizer)
    config = GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=257)
    text_json = (bad / bpe.FILE_NAME).read_text()
    meta = {"kind": "bpe", "vocab_size": 257, "special_tokens": {bpe.EOT: 256}, "sha256": bpe.sha256(text_json),
            "json": text_json}
    checkpoint.save({"model": GPT(config).state_dict(), "model_config": config.to_dict(), "tokenizer": meta},
                    tmp_path / "m.pt")
    before = snapshot(tmp_path)
    one_error(run_inline("generate", f"ckpt={tmp_path / 'm.pt'}", "prompt=aaaa", "device=cpu"), 2,
              "Split", "repeats '(a+)'")
    assert snapshot(tmp_path) == before and not (tmp_path / "data").exists() and not (tmp_path / "run").exists()


def test_a_text_the_library_gives_up_on_is_one_error_and_leaves_no_data(tmp_path):
    """A pattern linear at each position passes the load check; Oniguruma's retry limit stops it on a long run of
    a's, and the library's panic (pyo3_runtime.PanicException, a BaseException) becomes one error naming the file."""
    tok = folder_with(tmp_path / "tok", LINEAR)
    text = corpus(tmp_path / "corpus", "def f(x):\n    return x\n" * 20, "a" * 20_000 + "!\n")
    data = ["data=text", f"data.path={text}", f"data.root={tmp_path / 'data'}", "data.name=t"]
    before = snapshot(tmp_path)
    one_error(run_inline("prepare", *data, f"data.tokenizer={tok}"), 2, str(tok / bpe.FILE_NAME),
              "the tokenizers library gave up encoding a text", "retry-limit-in-match")
    one_error(run_inline("eval_tokenizer", f"tokenizers=[{tok}]", *data[:2]), 2, "gave up encoding a text")
    assert snapshot(tmp_path) == before
    assert not [p for p in tmp_path.rglob("*") if p.is_file() and p.suffix in (".tmp", ".bin", ".part")]


@pytest.mark.slow
def test_ctrl_c_while_a_tokenizer_is_learnt_stops_within_seconds(tmp_path):
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 12)))
             for _ in range(100_000)]
    text = corpus(tmp_path / "corpus", *(" ".join(rng.choices(words, k=300_000)) for _ in range(6)))  # ~20 MB
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get(
        "PYTHONPATH", "")])}
    env.pop("HYDRA_FULL_ERROR", None)
    out = tmp_path / "tok"
    proc = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "train_tokenizer.py"), "data=text",
                             f"data.path={text}", "tokenizer.vocab_size=30000", f"out={out}", "evaluate=false"],
                            env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith("training a 30,000-token"), proc.communicate()
    time.sleep(2)  # reading the corpus, then learning the merges in Rust: well over 10 s on this corpus
    assert proc.poll() is None, proc.communicate()
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    waited = time.monotonic() - sent
    one_error(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr), 130, "interrupted (Ctrl-C)")
    assert waited < 3, waited  # was 13.5 s on this corpus before the learning moved off the main thread
    assert not out.exists() or not list(out.iterdir())

"""benchmarks/speculate.py: the speed-up of prompt-lookup speculation is measured on the same tokens both ways, with
fewer model calls, and its table has a row per way."""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch

from conftest import ROOT
from gpt.bench.report import markdown_table
from gpt.model import GPT, GPTConfig
from gpt.tokenizers.tokenizer import CharTokenizer

spec = importlib.util.spec_from_file_location("bench_speculate", ROOT / "benchmarks" / "speculate.py")
bench = importlib.util.module_from_spec(spec)
sys.modules["bench_speculate"] = bench  # its dataclasses look their module up
spec.loader.exec_module(bench)


def test_speculation_gives_the_same_tokens_in_fewer_calls_and_a_row_each_way():
    tokenizer = CharTokenizer(list("abcdefghijklmnopqrstuvwxyz0123456789 ():.,=+-*\n"))
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=96, vocab_size=tokenizer.vocab_size)).eval()
    prompt = tokenizer.encode("for i in range(n):\n    t = t + i\n")
    logged = []
    result = bench.compare(model, tokenizer, prompt, 40, [4], 2, log=logged.append)
    plain, spec4 = result.runs["plain"], result.runs["speculate=4"]
    assert len(plain) == len(spec4) == 2 and len(logged) == 2
    assert all(len(run.tokens) == 40 for run in plain + spec4)
    assert result.identical("speculate=4") and plain[0].tokens == plain[1].tokens == spec4[0].tokens
    assert plain[0].calls == 40 and plain[0].drafted == 0  # a prefill and 39 one-token steps
    assert spec4[0].calls <= 40 // 3  # a random model's greedy tokens repeat: most of a draft kept each check
    assert 0 < spec4[0].accepted <= spec4[0].drafted
    assert all(0 < run.first < run.seconds for run in plain + spec4)
    assert len(result.speedups("speculate=4", decoding=True)) == 2
    table = markdown_table(bench.COLUMNS, bench.rows("tiny", result, 40)).splitlines()
    assert len(table) == 4
    assert table[2].startswith("| tiny | plain |") and table[2].endswith("| 40 | 0 | 0 | - | yes |")
    assert table[3].startswith("| tiny | speculate=4 |") and table[3].endswith(
        f"| {spec4[-1].calls} | {spec4[-1].drafted} | {spec4[-1].accepted} | "
        f"{spec4[-1].accepted / spec4[-1].drafted:.0%} | yes |")


def test_different_tokens_are_reported_not_hidden():
    """A way whose tokens differ from decoding without speculation says NO in its row."""
    run = bench.Run([1, 2, 3], 1.0, 0.5, 3, 0, 0)
    result = bench.Comparison({"plain": [run], "speculate=4": [bench.Run([1, 2, 4], 0.5, 0.25, 2, 4, 1)]})
    assert not result.identical("speculate=4") and result.speedups("speculate=4") == [2.0]
    assert result.speedups("speculate=4", decoding=True) == [2.0]
    assert bench.rows("x", result, 3)[1][-1] == "NO"


def test_bad_settings_are_one_error():
    with pytest.raises(bench.UserError, match="at least 1"):
        bench.main(["--drafts", "0", "--shapes", "small"])


def test_the_header_records_commit_load_and_threads():
    line = bench.header(3)
    assert line.startswith("# ") and " UTC, commit " in line and "load average " in line and "3 thread(s)" in line

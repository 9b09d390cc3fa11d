"""Prompt-lookup speculation's speed-up (docs/serving.md, issue 43): the serving engine (gpt.serve.engine) driven
directly, no HTTP, one greedy request alone in the pool, decoded with and without ``speculate=N`` in turns (the
order turned round every other round, so the machine's load falls on every way alike), on repetitive text: a
prompt of repeated code lines. Random weights of the default model's shape (model=small, the character vocabulary
of scripts/bench_serve.py) and of GPT-2 124M's (its 50257 tokens; the prompt sent as token ids, the tokenizer only
decodes the text). A random model's greedy output falls into repeating itself, which is what prompt lookup guesses:
the figure is for text that repeats, not for a trained model's prose.

    python benchmarks/speculate.py [--shapes small gpt2] [--repeats 5] [--threads 1] [--drafts 4 8] [--onednn]

GPT-2's vocabulary is tiktoken's r50k_base file (TIKTOKEN_CACHE_DIR): without it that shape is skipped, saying so.

Per shape and way: tokens/s (median, lowest-highest over the rounds); the speed-up, the median of each round's time
without speculation over its time with (lowest-highest), for the whole request (the prompt's prefill in it) and
after the first token (the decoding that speculation speeds up); model calls, guesses made and kept, and whether
the tokens are those without speculation in every round (they must be: speculation is exact for greedy decoding).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout, installed or not

from gpt.bench.report import markdown_table  # noqa: E402
from gpt.errors import UserError  # noqa: E402
from gpt.inference.weight_layout import onednn_linears  # noqa: E402
from gpt.model import GPT  # noqa: E402
from gpt.serve.config import ServeConfig  # noqa: E402
from gpt.serve.engine import Engine, Sampling, Sequence  # noqa: E402
from gpt.tokenizers.tokenizer import CharTokenizer, GPT2Tokenizer, Tokenizer  # noqa: E402

CODE = "for i in range(n):\n    total = total + i * i\n"  # a line pair repeated: the "repetitive text"
SHAPES = {  # shape: (configs/model/ file, vocabulary, prompt's repeats of CODE, tokens generated)
    "small": ("small", "char", 1, 64),  # 46 + 64 characters: inside block_size 128 (no slide)
    "gpt2": ("gpt2", "gpt2", 8, 64),
}


@dataclass
class Run:
    """One request through the engine: its tokens, seconds from submit to its last token and to its first, the
    engine's model calls, guesses verified and kept during it."""

    tokens: list[int]
    seconds: float
    first: float
    calls: int
    drafted: int
    accepted: int


@dataclass
class Comparison:
    """Every round's run each way: "plain" (no speculation), "speculate=N" for each draft length."""

    runs: dict[str, list[Run]] = field(default_factory=dict)

    def identical(self, way: str) -> bool:
        """Whether every run this way gave the first plain run's tokens."""
        return all(run.tokens == self.runs["plain"][0].tokens for run in self.runs[way])

    def speedups(self, way: str, decoding: bool = False) -> list[float]:
        """Each round's time without speculation over its time this way (``decoding``: after the first token)."""
        return [(p.seconds - decoding * p.first) / (s.seconds - decoding * s.first)
                for p, s in zip(self.runs["plain"], self.runs[way])]


def run_one(engine: Engine, prompt: list[int], tokenizer: Tokenizer, max_tokens: int) -> Run:
    """One greedy sequence through the (started, idle) engine; timed from submit to its last token."""
    got: list[int] = []
    done = threading.Event()
    errors: list[str] = []
    first: list[float] = []

    def deliver(output) -> None:
        if not first:
            first.append(time.perf_counter())
        if output.error:
            errors.append(output.error)
        got.extend([output.token] if output.token is not None else [])
        if output.finish_reason is not None:
            done.set()

    calls, drafted, accepted = engine.steps, engine.drafted, engine.accepted
    start = time.perf_counter()
    engine.submit([Sequence(prompt, Sampling(max_tokens=max_tokens, temperature=0.0), tokenizer, deliver)])
    if not done.wait(600):
        raise UserError("the engine gave no answer in 600 s", hint="the machine may be overloaded: try again")
    seconds = time.perf_counter() - start
    if errors:
        raise UserError(f"the engine failed the request: {errors[0]}")
    return Run(got, seconds, first[0] - start, engine.steps - calls, engine.drafted - drafted,
               engine.accepted - accepted)


def compare(model: GPT, tokenizer: Tokenizer, prompt: list[int], max_tokens: int, drafts: list[int], repeats: int,
            log=print) -> Comparison:
    """The same greedy request through an engine without speculation and one per draft length (guesses a step),
    one untimed run each, then ``repeats`` rounds, the ways in turns (the order turned round every other round)."""
    engines = {"plain": Engine(model, tokenizer, max_batch=1, max_queue=1)}
    engines |= {f"speculate={n}": Engine(model, tokenizer, max_batch=1, max_queue=1, speculate=n) for n in drafts}
    if not all(engine.speculate for way, engine in engines.items() if way != "plain"):
        raise UserError("this model's cache cannot take guesses (a window's ring or a running state)")
    result, ways = Comparison({way: [] for way in engines}), list(engines)
    for engine in engines.values():
        engine.start()
    try:
        for engine in engines.values():
            run_one(engine, prompt, tokenizer, max_tokens)  # warm up
        for i in range(repeats):
            for way in ways if i % 2 == 0 else ways[::-1]:
                result.runs[way].append(run_one(engines[way], prompt, tokenizer, max_tokens))
            log(f"  round {i + 1}: " + ", ".join(f"{w} {max_tokens / result.runs[w][-1].seconds:,.0f} tokens/s"
                                                 for w in ways))
    finally:
        for engine in engines.values():
            engine.stop()
    return result


def spread(values: list[float], digits: int = 0, suffix: str = "") -> str:
    """A median with the lowest and highest: "1,234 (1,100-1,300)"."""
    f = f"{{:,.{digits}f}}{suffix}"
    return f"{f.format(statistics.median(values))} ({f.format(min(values))}-{f.format(max(values))})"


COLUMNS = ["shape", "way", "tokens/s", "speed-up", "after 1st token", "model calls", "guesses made",
           "guesses kept", "acceptance", "same tokens"]


def rows(shape: str, result: Comparison, max_tokens: int) -> list[list[object]]:
    """The table's rows for one shape, one a way (calls and guesses: the last round's, the same in every round)."""
    out = []
    for way, runs in result.runs.items():
        last = runs[-1]
        out.append([shape, way, spread([max_tokens / r.seconds for r in runs]),
                    *([spread(result.speedups(way, d), 2, "x") for d in (False, True)] if way != "plain"
                      else ["1x", "1x"]), last.calls, last.drafted,
                    last.accepted, f"{last.accepted / last.drafted:.0%}" if last.drafted else "-",
                    "yes" if result.identical(way) else "NO"])
    return out


def shape_model(shape: str) -> tuple[GPT, Tokenizer, list[int], int]:
    """Random weights (seed 0) of a configs/model/ shape, its tokenizer, the repetitive prompt's ids, tokens to
    generate. GPT-2's vocabulary needs tiktoken's r50k_base file (TIKTOKEN_CACHE_DIR): a UserError without it."""
    from omegaconf import OmegaConf

    from gpt.model.config import ModelConfig

    config_file, vocabulary, lines, max_tokens = SHAPES[shape]
    tokenizer = (GPT2Tokenizer() if vocabulary == "gpt2"
                 else CharTokenizer([chr(c) for c in range(32, 127)] + ["\n", "\t"]))  # bench_serve's characters
    values = OmegaConf.to_container(OmegaConf.load(ROOT / "configs" / "model" / f"{config_file}.yaml"))
    torch.manual_seed(0)
    model = GPT(ModelConfig(**values).build(tokenizer.vocab_size)).eval()
    return model, tokenizer, tokenizer.encode(CODE * lines), max_tokens


def header(threads: int) -> str:
    """The run's date, commit, load average, torch and threads: the record a figure needs on a shared machine."""
    try:
        git = ["git", "-C", str(ROOT)]
        commit = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                check=True).stdout.strip()
        if subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                          text=True).stdout.strip():
            commit += " with uncommitted changes"
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return (f"# {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, commit {commit}, load average {load}, "
            f"{os.cpu_count()} CPUs, torch {torch.__version__}, {threads} thread(s)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds, the two ways in turns")
    parser.add_argument("--threads", type=int, default=1, help="torch's CPU threads")
    parser.add_argument("--onednn", action="store_true",
                        help="as the server does by default (serve's onednn=true): the large float32 Linears through "
                        "oneDNN's packed weights in products of 8 rows or more (a check of 7 guesses or more)")
    parser.add_argument("--drafts", type=int, nargs="+", default=[4, 8],
                        help="guesses checked per step, each a way of its own (the engine's speculate=N)")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.threads < 1 or min(args.drafts) < 1:
        raise UserError("--repeats, --threads and --drafts must be at least 1")
    torch.set_num_threads(args.threads)
    print(header(args.threads))
    print(f"one greedy request alone in the engine's pool, prompt: {CODE!r} repeated; random weights, whose greedy "
          "output repeats itself: what prompt lookup guesses")
    table = []
    for shape in args.shapes:
        try:
            model, tokenizer, prompt, max_tokens = shape_model(shape)
        except UserError as err:
            print(f"{shape}: skipped: {err}{f' ({err.hint})' if getattr(err, 'hint', None) else ''}")
            continue
        params = sum(p.numel() for p in model.parameters()) / 1e6
        packed = onednn_linears(model, ServeConfig.max_batch) if args.onednn else 0
        print(f"{shape}: {params:.1f}M parameters, {len(prompt)}-token prompt, {max_tokens} tokens generated, "
              f"{packed} Linears through oneDNN")
        table += rows(shape, compare(model, tokenizer, prompt, max_tokens, args.drafts, args.repeats), max_tokens)
    print(markdown_table(COLUMNS, table))
    print(f"# load average at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    from gpt.cli import bring_designs, report_user_errors

    bring_designs()  # GPT_DESIGNS' files, as every script loads them: one failing is one error line
    report_user_errors(main)

"""Data preparation benchmark: throughput with 1 and N threads, peak memory, launch to first step, single-call baseline.

Throughput divides the corpus by the work itself (timed inside the child, after its imports); the process's
whole wall time, interpreter start included, is reported beside it. Each measurement is repeated and the
median run reported, every run's time beside it: one run on a shared 2-core machine varies by 10%.

Every measurement runs in a fresh process (peak resident memory from wait4's rusage), on a generated JSONL
corpus of standard-library sources (one document per source file, cycled until the size is reached).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpt.data.sources import stdlib_source
from gpt.validate import read_json

ROOT = Path(__file__).resolve().parents[2]
FILE_MB = 8  # size of each generated JSONL file

# Each child prints the seconds of the work itself (after its imports): throughput is corpus / that time.
PREPARE = """
import time
from gpt.data.config import DataConfig
from gpt.data.prepare import prepare
started = time.perf_counter()
prepare(DataConfig(name={name!r}, source="files", path={path!r}, tokenizer="gpt2", root={root!r},
                   num_proc={num_proc}, rebuild=True), log=lambda *_: None)
print(time.perf_counter() - started)
"""

BASELINE = """
import json, pathlib, time, numpy as np, tiktoken
from gpt.tokenizers.tokenizer import load_gpt2_encoding
started = time.perf_counter()
text = "".join(json.loads(line)["text"] for p in sorted(pathlib.Path({path!r}).glob("*.jsonl")) for line in open(p))
ids = load_gpt2_encoding().encode_ordinary(text)
np.asarray(ids, dtype=np.uint16).tofile({out!r})
print(len(ids), time.perf_counter() - started)
"""


def make_corpus(folder: Path, megabytes: int) -> int:
    """Write ``megabytes`` MB of JSONL (standard-library files as documents) into ``folder``; its size in bytes.
    The size is kept in ``folder``/SIZE, which the preparation leaves out (it reads ``folder``/*.jsonl)."""
    marker = folder / "SIZE"
    if marker.exists() and int(marker.read_text()) >= megabytes * 10**6:
        return int(marker.read_text())
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    texts = [t for t in stdlib_source().documents() if t]
    written, part, copy = 0, 0, 0
    out = open(folder / f"part{part:04d}.jsonl", "w")
    while written < megabytes * 10**6:
        for text in texts:
            doc = f"# copy {copy}\n{text}"
            out.write(json.dumps({"text": doc}) + "\n")
            written += len(doc.encode())
            if written >= (part + 1) * FILE_MB * 10**6:
                out.close()
                part += 1
                out = open(folder / f"part{part:04d}.jsonl", "w")
            if written >= megabytes * 10**6:
                break
        copy += 1
    out.close()
    marker.write_text(str(written))
    return written


def run_child(code: list[str], marker: str | None = None) -> tuple[float, int, str]:
    """Run a command in a fresh process: seconds until it printed a line starting with ``marker`` (or until it
    ended), its own peak resident memory (bytes, from wait4) and its standard output."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(code, stdout=subprocess.PIPE, stderr=err, env=env, cwd=ROOT, text=True)
        lines, seen = [], None
        for line in proc.stdout:
            lines.append(line)
            if seen is None and marker and line.startswith(marker):
                seen = time.perf_counter() - start
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0 or (marker and seen is None):
            err.seek(0)
            raise RuntimeError(f"{' '.join(code[:3])} failed: {err.read()[-2000:]}")
    return seen or wall, usage.ru_maxrss * 1024, "".join(lines)


def bench(sizes_mb: list[int], procs: list[int], work: Path, repeat: int = 3, log=print) -> list[dict]:
    """For each corpus size: preparation with each thread count, launch to first step and the baseline, each
    run ``repeat`` times (the thread counts interleaved, so that a noisy stretch hits them alike); one row per
    measurement, its figures the median run's (peak memory: the largest)."""
    rows = []
    for mb in sizes_mb:
        corpus = work / f"corpus_{mb}mb"
        size = make_corpus(corpus, mb)
        runs: dict[int, list[dict]] = {n: [] for n in procs}
        for _ in range(repeat):
            for n in procs:
                runs[n].append(prepare_once(corpus, work, f"bench_{mb}mb", n))
                log({"corpus_mb": size / 1e6, "threads": n, **runs[n][-1]})
        for n in procs:
            rows.append(median_row(runs[n], size, f"prepare, {n} thread(s)"))
        launches = [launch_once(corpus, work, f"bench_{mb}mb") for _ in range(repeat)]
        log({"corpus_mb": size / 1e6, "launch_s": [r["wall_s"] for r in launches]})
        rows.append(median_row(launches, size, "train.py: launch to the first step's log line"))
        baseline = BASELINE.format(path=str(corpus), out=str(work / "base.bin"))
        wall, rss, out = run_child([sys.executable, "-c", baseline])
        n_tokens, work_s = out.split()
        rows.append(median_row([dict(wall_s=wall, work_s=float(work_s), tokens=int(n_tokens), peak=rss)], size,
                               "baseline: one encode_ordinary call"))
        log(rows[-1])
    return rows


def prepare_once(corpus: Path, work: Path, name: str, threads: int) -> dict:
    """One preparation with ``threads`` threads in a fresh process: wall and work seconds, tokens, peak RSS."""
    wall, rss, out = run_child([sys.executable, "-c", PREPARE.format(
        name=name, path=f"{corpus}/*.jsonl", root=str(work / "data"), num_proc=threads)])
    meta = read_json(work / "data" / name / "meta.json")
    return dict(wall_s=wall, work_s=float(out.split()[-1]), peak=rss,
                tokens=sum(s["tokens"] for s in meta["splits"].values()))


def launch_once(corpus: Path, work: Path, name: str) -> dict:
    """scripts/train.py model=tiny on the prepared data: seconds from launch to its first step's log line."""
    wall, rss, _ = run_child([sys.executable, "scripts/train.py", "model=tiny", "device=cpu", "data=files",
                              f"data.path={corpus}/*.jsonl", f"data.root={work / 'data'}", f"data.name={name}",
                              "data.tokenizer=gpt2", "train.max_iters=1", "train.eval_iters=1",
                              "train.sample_tokens=0", "train.log_interval=1", f"out_dir={work / 'run'}"],
                             marker="step 1/")
    shutil.rmtree(work / "run", ignore_errors=True)
    return dict(wall_s=wall, work_s=None, peak=rss, tokens=None)


def median_row(runs: list[dict], size: int, what: str) -> dict:
    """The run of median time (work time, else wall time) as a table row, with every run's times beside it."""
    key = "work_s" if runs[0]["work_s"] is not None else "wall_s"
    ordered = sorted(runs, key=lambda r: r[key])
    mid = ordered[(len(ordered) - 1) // 2]
    work_s = mid["work_s"]
    return dict(corpus_mb=size / 1e6, what=what, runs=[r[key] for r in runs], wall_s=mid["wall_s"], work_s=work_s,
                mb_s=size / 1e6 / work_s if work_s else None,
                tokens_s=mid["tokens"] / work_s if work_s else None, peak_mib=max(r["peak"] for r in runs) / 2**20)


def speedups(rows: list[dict]) -> list[str]:
    """For each corpus, every thread count's median preparation time against one thread's."""
    lines = []
    for mb in sorted({r["corpus_mb"] for r in rows}):
        prep = {r["what"]: r["work_s"] for r in rows if r["corpus_mb"] == mb and r["what"].startswith("prepare")}
        one = prep.get("prepare, 1 thread(s)")
        for what, seconds in prep.items():
            if one and what != "prepare, 1 thread(s)":
                lines.append(f"{mb:.0f} MB: {what} is {one / seconds:.2f}x one thread ({one:.2f} s / {seconds:.2f} s)")
    return lines


def table(rows: list[dict]) -> str:
    lines = ["| corpus MB | what | process wall s | work s | MB/s | tokens/s | peak RSS MiB | every run, s |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        mb_s = f"{r['mb_s']:.2f}" if r["mb_s"] else "-"
        tok_s = f"{r['tokens_s']:,.0f}" if r["tokens_s"] else "-"
        work_s = f"{r['work_s']:.2f}" if r.get("work_s") else "-"
        every = ", ".join(f"{t:.2f}" for t in r["runs"])
        lines.append(f"| {r['corpus_mb']:.0f} | {r['what']} | {r['wall_s']:.1f} | {work_s} | {mb_s} | {tok_s} "
                     f"| {r['peak_mib']:.0f} | {every} |")
    return "\n".join(lines)

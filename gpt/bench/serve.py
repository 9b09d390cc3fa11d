"""Serving throughput and latency under concurrent clients: python scripts/bench_serve.py [ckpt=<run>]

A load generator bounded in count and time, on the loopback address only: each of N client threads sends streamed
completions one after another (the openai client's way: POST /v1/completions, stream=true) until it has sent its
share or the time is up, recording the time to the first token, the whole request's time and the tokens it got.
The server is scripts/serve.py in a process of its own (so the clients' work does not share its interpreter).
"""

from __future__ import annotations

import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional
from urllib.parse import urlparse

from gpt.bench.report import markdown_table
from gpt.device import DeviceConfig
from gpt.errors import ConfigError, UserError, check_positive
from gpt.model.config import ModelConfig

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class BenchServeConfig:
    """scripts/bench_serve.py's settings (configs/bench_serve.yaml), checked as they are built."""

    ckpt: Optional[str] = None  # default: random weights of `model` over a character vocabulary (speed only)
    model: ModelConfig = field(default_factory=ModelConfig)
    clients: list[int] = field(default_factory=lambda: [1, 4, 16])  # concurrent clients, one level after another
    requests: int = 64  # requests per level (shared by its clients), at most
    seconds: float = 60.0  # and at most this long per level
    max_tokens: int = 64  # tokens per request (a character model never stops early)
    prompt: str = "def main():"
    repeats: int = 2  # the levels are run this many times, interleaved (1, 4, 16, 1, 4, 16)
    max_batch: int = 32  # the server's
    device: DeviceConfig = field(default_factory=lambda: DeviceConfig("cpu"))  # the server's (device=cuda)

    def __post_init__(self) -> None:
        check_positive(self, "requests", "seconds", "max_tokens", "repeats", "max_batch")
        if not self.clients or any(c < 1 for c in self.clients):
            raise ConfigError(f"clients must be positive counts, got {self.clients}")


@dataclass
class Result:
    """One request: when it started, its first token came and it ended (seconds), its tokens, or what failed."""

    start: float
    first: float | None = None
    end: float | None = None
    tokens: int = 0
    error: str | None = None


def stream_completion(url: str, body: dict, api_key: str | None = None, timeout: float = 120) -> Result:
    """One streamed completion over HTTP (loopback only), timed."""
    parsed = urlparse(url)
    if parsed.hostname not in ("127.0.0.1", "localhost", "::1"):
        raise UserError(f"the load generator sends to this machine's loopback address only, not {parsed.hostname}")
    result = Result(time.perf_counter())
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=timeout)
    try:
        headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
        conn.request("POST", "/v1/completions", json.dumps({**body, "stream": True,
                                                             "stream_options": {"include_usage": True}}), headers)
        response = conn.getresponse()
        if response.status != 200:
            result.error = f"HTTP {response.status}: {response.read()[:200]!r}"
            return result
        for line in response:
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                result.error = chunk["error"]["message"]
            elif chunk.get("usage"):
                result.tokens = chunk["usage"]["completion_tokens"]
            elif result.first is None:
                result.first = time.perf_counter()
        result.end = time.perf_counter()
    except (OSError, http.client.HTTPException, ValueError) as err:
        result.error = f"{type(err).__name__}: {err}"
    finally:
        conn.close()
    return result


def load(url: str, model: str, clients: int, requests: int, seconds: float, body: dict,
         api_key: str | None = None) -> list[Result]:
    """``clients`` threads sending ``requests`` streamed completions between them, none started after ``seconds``."""
    results: list[Result] = []
    lock = threading.Lock()
    deadline = time.perf_counter() + seconds
    sent = [0]

    def client(k: int) -> None:
        while time.perf_counter() < deadline:
            with lock:
                if sent[0] >= requests:
                    return
                sent[0] += 1
                seed = sent[0]
            result = stream_completion(url, {**body, "model": model, "seed": seed}, api_key)
            with lock:
                results.append(result)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def summary(results: list[Result]) -> dict[str, float]:
    """Tokens per second over the level's wall time, failures, median and 90th-percentile latencies."""
    done = [r for r in results if r.error is None and r.end is not None]
    wall = max((r.end for r in done), default=0) - min((r.start for r in results), default=0)
    latency = sorted(r.end - r.start for r in done)
    first = sorted(r.first - r.start for r in done if r.first is not None)
    pct = lambda xs, q: xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")  # noqa: E731
    return {"requests": len(results), "failed": len(results) - len(done), "tokens": sum(r.tokens for r in done),
            "tokens_per_s": sum(r.tokens for r in done) / wall if wall > 0 else 0.0,
            "latency_p50": statistics.median(latency) if latency else float("nan"), "latency_p90": pct(latency, 0.9),
            "first_token_p50": statistics.median(first) if first else float("nan")}


def describe(device: str) -> str:
    """The machine the server ran on, for the report: its CPUs, and the GPU where it ran on one."""
    import torch

    cpus = f"{os.cpu_count()} CPUs"
    if device != "cpu" and torch.cuda.is_available():
        return f"{cpus}, {torch.cuda.get_device_name()}"
    return cpus


def uptime() -> str:
    """The load average (1, 5, 15 minutes), for the record: the machine is shared."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def start_server(ckpt: str, max_batch: int, device: str = "cpu") -> tuple[subprocess.Popen, str]:
    """scripts/serve.py on a free loopback port, in its own process; its process and URL once it listens."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "serve.py"), f"ckpt={ckpt}", "port=0",
                                f"max_batch={max_batch}", "log_requests=false", f"device={device}"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith("serving at "):
            url = line.split()[2].rstrip("/")
            threading.Thread(target=process.stdout.read, daemon=True).start()  # keep its pipe drained
            return process, url
    process.wait()
    raise UserError("scripts/serve.py did not start", hint="run it by hand to see why")


def random_checkpoint(model: ModelConfig, folder: Path) -> str:
    """A checkpoint of random weights with the model's shape over a character vocabulary (speed only)."""
    import torch

    from gpt import GPT
    from gpt.tokenizers.tokenizer import CharTokenizer
    from gpt.weights import checkpoint

    tokenizer = CharTokenizer([chr(c) for c in range(32, 127)] + ["\n", "\t"])
    torch.manual_seed(0)
    config = model.build(tokenizer.vocab_size)
    path = folder / "random.pt"
    checkpoint.save({"model": GPT(config).state_dict(), "model_config": config.to_dict(),
                     "tokenizer": tokenizer.to_meta()}, path)
    return str(path)


def run(cfg: BenchServeConfig) -> str:
    """Start the server, run every level cfg.repeats times (interleaved), return the report as markdown."""
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = cfg.ckpt or random_checkpoint(cfg.model, Path(tmp))
        process, url = start_server(ckpt, cfg.max_batch, cfg.device.type)
        try:
            rows, best = [], {}
            body = {"prompt": cfg.prompt, "max_tokens": cfg.max_tokens, "temperature": 0.8}
            stream_completion(url, {**body, "model": ckpt.rstrip("/"), "max_tokens": 2})  # warm up
            for repeat in range(cfg.repeats):
                for clients in cfg.clients:
                    before = uptime()
                    s = summary(load(url, ckpt.rstrip("/"), clients, cfg.requests, cfg.seconds, body))
                    best[clients] = max(best.get(clients, 0.0), s["tokens_per_s"])
                    rows.append([clients, repeat + 1, s["requests"], s["failed"], s["tokens"],
                                 f"{s['tokens_per_s']:,.0f}", f"{s['latency_p50']:.2f}", f"{s['latency_p90']:.2f}",
                                 f"{s['first_token_p50'] * 1e3:.0f}", f"{before} / {uptime()}"])
        finally:
            process.terminate()
            process.wait(timeout=30)
    one = best.get(min(cfg.clients), 0.0)
    ratios = ", ".join(f"{c} clients {best[c] / one:.1f}x" for c in cfg.clients if one)
    header = (f"serving benchmark: {cfg.ckpt or 'random weights'}, {cfg.max_tokens} tokens per request, "
              f"max_batch {cfg.max_batch}, {describe(cfg.device.type)}; best tokens/s relative to "
              f"{min(cfg.clients)} client(s): {ratios}")
    table = markdown_table(["clients", "run", "requests", "failed", "tokens", "tokens/s", "latency p50 s",
                            "latency p90 s", "first token p50 ms", "load average before / after"], rows)
    return header + "\n\n" + table

"""Serving throughput and latency under concurrent clients: python scripts/bench_serve.py [ckpt=<run>]

A load generator bounded in count and time, on the loopback address only: at most N client threads send streamed
completions (the openai client's way: POST /v1/completions, stream=true), one after another or at the times of a
Poisson process (``arrival_rate``), with prompt and output lengths drawn from ranges (seeded: every server gets the
same requests), until all are sent or the time is up, recording each request's time to the first token (TTFT),
time per output token after it (TPOT) and its tokens. The server is scripts/serve.py in a process of its own (so
the clients' work does not share its interpreter); ``baseline=<git revision>`` runs that revision's server on the
same requests in the same run, ``peer=<URL>`` an outside OpenAI-compatible server already listening on loopback
(vLLM's, docs/serving.md), and the model's own decode loop (bench_decode's "KV cache" way, batch 1) is timed
beside them, the ceiling one client can approach.
"""

from __future__ import annotations

import http.client
import json
import os
import queue
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
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
    max_tokens: int = 64  # tokens per request (a character model never stops early), unless output_tokens
    prompt: str = "def main():"  # every request's prompt, unless prompt_tokens
    prompt_tokens: Optional[list[int]] = None  # [lo, hi]: random prompts of lo..hi characters instead
    output_tokens: Optional[list[int]] = None  # [lo, hi]: each request's max_tokens drawn from lo..hi
    arrival_rate: Optional[float] = None  # requests per second of a Poisson process (None: back to back)
    seed: int = 0  # of the drawn lengths, prompts and arrival times
    baseline: Optional[str] = None  # a git revision whose server runs the same requests in the same run
    chat_turns: int = 0  # > 0: also a multi-turn chat replay (requests // chat_turns conversations, each turn's
    # prompt the last one's, its answer and a new message), its prefix cache hit rate from /metrics
    repeats: int = 2  # the levels are run this many times, interleaved (1, 4, 16, 1, 4, 16)
    max_batch: int = 32  # the server's
    threads: Optional[int] = None  # torch's CPU threads in the servers and the decode loop (None: torch's default)
    device: DeviceConfig = field(default_factory=lambda: DeviceConfig("cpu"))  # the server's (device=cuda)
    temperature: float = 0.8  # every request's (0: greedy)
    token_ids: bool = False  # send each prompt as its token ids (the checkpoint's tokenizer), so every server reads
    # the same tokens whatever its own tokenizer makes of the text
    peer: Optional[str] = None  # an outside OpenAI-compatible server already listening on loopback (its base URL,
    # e.g. vLLM's http://127.0.0.1:8100, serving the same weights): the same requests, taking turns with ours
    peer_name: str = "peer"  # its name in the table
    peer_model: Optional[str] = None  # the model id it serves (default: the first one its /v1/models lists)
    tokenizer: str = "char"  # random weights' vocabulary: char (97 characters) | gpt2 (GPT-2's 50257 tokens)
    write_random: Optional[str] = None  # write the random-weights model in the GPT-2 layout (scripts/export.py's
    # format=hf) to this folder and stop: what an outside server serves, and ckpt= for ours

    def __post_init__(self) -> None:
        check_positive(self, "requests", "seconds", "max_tokens", "repeats", "max_batch")
        check_positive(self, "arrival_rate", "threads", optional=True)
        if self.temperature < 0:
            raise ConfigError(f"temperature must be 0 (greedy) or more, got {self.temperature}")
        if self.tokenizer not in ("char", "gpt2"):
            raise ConfigError(f"tokenizer must be char or gpt2, got {self.tokenizer!r}")
        if self.peer is not None:
            loopback_url(self.peer, "peer")
        if self.peer_name in ("this", self.baseline):
            raise ConfigError(f"peer_name={self.peer_name!r} is taken by another server in the table",
                              hint="name the peer after what it is, e.g. peer_name=vllm")
        if self.chat_turns < 0:
            raise ConfigError(f"chat_turns must be 0 (no chat replay) or more, got {self.chat_turns}")
        if not self.clients or any(c < 1 for c in self.clients):
            raise ConfigError(f"clients must be positive counts, got {self.clients}")
        for name in ("prompt_tokens", "output_tokens"):
            span = getattr(self, name)
            if span is not None and (len(span) != 2 or not 1 <= span[0] <= span[1]):
                raise ConfigError(f"{name} must be [lo, hi] with 1 <= lo <= hi, got {span}")


@dataclass
class Result:
    """One request: when it started, its first token came and it ended (seconds), its tokens, or what failed."""

    start: float
    first: float | None = None
    end: float | None = None
    tokens: int = 0
    error: str | None = None
    text: str = ""

    @property
    def per_token(self) -> float | None:
        """Seconds per output token after the first (TPOT); None with fewer than two tokens."""
        if self.first is None or self.end is None or self.tokens < 2:
            return None
        return (self.end - self.first) / (self.tokens - 1)


def loopback_url(url: str, name: str = "url"):
    """The parsed URL, refused unless it is http:// on this machine's loopback address with a port."""
    try:
        parsed = urlparse(url)
        parsed.port  # noqa: B018  (raises on a port that is not a number)
    except ValueError as err:
        raise ConfigError(f"{name}={url!r} is not a URL ({err})") from None
    if parsed.scheme != "http" or parsed.hostname not in ("127.0.0.1", "localhost", "::1") or not parsed.port:
        raise ConfigError(f"{name}={url!r}: the load generator sends to this machine's loopback address only",
                          hint="give http://127.0.0.1:<port>, where the server listens")
    return parsed


def stream_completion(url: str, body: dict, api_key: str | None = None, timeout: float = 120) -> Result:
    """One streamed completion over HTTP (loopback only), timed; its tokens from the usage chunk, or, from a server
    that sends none, its streamed pieces that carry text."""
    parsed = loopback_url(url)
    path = parsed.path.rstrip("/").removesuffix("/v1") + "/v1/completions"
    result = Result(time.perf_counter())
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=timeout)
    try:
        headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
        conn.request("POST", path, json.dumps({**body, "stream": True,
                                                             "stream_options": {"include_usage": True}}), headers)
        response = conn.getresponse()
        pieces: int | None = 0  # streamed pieces with text, until a usage chunk gives the tokens (None)
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
                result.tokens, pieces = chunk["usage"]["completion_tokens"], None
            else:
                result.first = result.first or time.perf_counter()
                text = "".join(choice.get("text", "") for choice in chunk.get("choices", []))
                result.text += text
                pieces = pieces if pieces is None else pieces + bool(text)
        result.end = time.perf_counter()
        if pieces is not None:  # no usage sent (llama-cpp-python's server): one streamed piece a token
            result.tokens = pieces
    except (OSError, http.client.HTTPException, ValueError, LookupError, TypeError, AttributeError) as err:
        result.error = f"{type(err).__name__}: {err}"  # a dropped connection, or a chunk not shaped as OpenAI's
    finally:
        conn.close()
    return result


def load(url: str, model: str, clients: int, requests: int, seconds: float, body: dict,
         api_key: str | None = None, bodies: list[dict] | None = None,
         arrivals: list[float] | None = None) -> list[Result]:
    """At most ``clients`` threads sending ``requests`` streamed completions between them, none started after
    ``seconds``: request i is ``bodies[i]`` (else ``body``) with seed i + 1, sent at ``arrivals[i]`` seconds after
    the start (else as soon as a client is free)."""
    begin = time.perf_counter()

    def send(i: int) -> list[Result] | None:
        if arrivals is not None:
            time.sleep(max(0.0, begin + arrivals[i] - time.perf_counter()))
        if time.perf_counter() > begin + seconds:
            return None  # this client stops
        return [stream_completion(url, {**(bodies[i] if bodies else body), "model": model, "seed": i + 1}, api_key)]

    return in_clients(clients, requests, send)


def chat_replay(url: str, model: str, clients: int, conversations: int, turns: int, seed: int) -> list[Result]:
    """``conversations`` chats of ``turns`` turns, ``clients`` at a time, as a chat front end resends the whole
    conversation: one 64-character system prompt shared by every chat and a 4-character first message, then each
    turn the last prompt, its answer (12 tokens) and a new 4-character message (4 turns fit a 128-token context)."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz "
    words = lambda n: "".join(rng.choice(letters) for _ in range(n))  # noqa: E731
    system = words(64)
    plans = [(system + words(4), [words(4) for _ in range(turns)]) for _ in range(conversations)]

    def chat(c: int) -> list[Result]:
        prompt, messages = plans[c]
        results = []
        for turn in range(turns):
            result = stream_completion(url, {"model": model, "prompt": prompt, "max_tokens": 12,
                                             "temperature": 0.8, "seed": c * turns + turn + 1})
            results.append(result)
            prompt += result.text + messages[turn]
        return results

    return in_clients(clients, conversations, chat)


def in_clients(clients: int, jobs: int, work: Callable[[int], list[Result] | None]) -> list[Result]:
    """Jobs 0..jobs-1 shared by ``clients`` threads, each taking the next job until none is left or ``work`` returns
    None (that client stops); every job's results, in the order they finished."""
    results: list[Result] = []
    lock = threading.Lock()
    todo: queue.Queue[int] = queue.Queue()
    for i in range(jobs):
        todo.put(i)

    def client() -> None:
        while True:
            try:
                done = work(todo.get_nowait())
            except queue.Empty:
                return
            if done is None:
                return
            with lock:
                results.extend(done)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def prefix_counters(url: str, model: str) -> tuple[float, float] | None:
    """(prompt tokens prefilled or found, prompt tokens found in the prefix cache) from /metrics; None where the
    server has no /metrics (an older revision)."""
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
            text = response.read().decode()
    except (OSError, ValueError):
        return None
    values = {}
    for line in text.splitlines():
        if line.startswith(("gpt_serve_prompt_tokens_total{", "gpt_serve_prefix_cache_reused_tokens_total{")) \
                and f'model="{model}"' in line:
            values[line.split("{")[0]] = float(line.rsplit(" ", 1)[1])
    return values.get("gpt_serve_prompt_tokens_total", 0.0), values.get("gpt_serve_prefix_cache_reused_tokens_total",
                                                                        0.0)


def hit_rate(before: tuple[float, float] | None, after: tuple[float, float] | None) -> str:
    """The share of a level's prompt tokens found in the prefix cache, from /metrics before and after it."""
    if before is None or after is None or after[0] == before[0]:
        return "n/a"
    return f"{(after[1] - before[1]) / (after[0] - before[0]):.0%}"


def workload(cfg: BenchServeConfig, vocabulary: str, seed: int,
             encode: Callable[[str], list[int]] | None = None) -> tuple[list[dict], list[float] | None]:
    """Each request's body (its prompt, as token ids where ``encode`` is given, and max_tokens drawn from the
    ranges) and arrival time, drawn from seed."""
    rng = random.Random(seed)
    bodies = []
    for _ in range(cfg.requests):
        prompt = cfg.prompt
        if cfg.prompt_tokens:
            prompt = "".join(rng.choice(vocabulary) for _ in range(rng.randint(*cfg.prompt_tokens)))
        tokens = rng.randint(*cfg.output_tokens) if cfg.output_tokens else cfg.max_tokens
        bodies.append({"prompt": encode(prompt) if encode else prompt, "max_tokens": tokens,
                       "temperature": cfg.temperature})
    if cfg.arrival_rate is None:
        return bodies, None
    arrivals, t = [], 0.0
    for _ in range(cfg.requests):
        t += rng.expovariate(cfg.arrival_rate)
        arrivals.append(t)
    return bodies, arrivals


def percentile(values: list[float], q: float) -> float:
    """The q-th quantile (nearest rank) of values; NaN when there are none."""
    xs = sorted(values)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def summary(results: list[Result]) -> dict[str, float]:
    """Tokens per second over the level's wall time, failures, latency, TTFT and TPOT quantiles."""
    done = [r for r in results if r.error is None and r.end is not None]
    wall = max((r.end for r in done), default=0) - min((r.start for r in results), default=0)
    latency = [r.end - r.start for r in done]
    first = [r.first - r.start for r in done if r.first is not None]
    per_token = [r.per_token for r in done if r.per_token is not None]
    return {"requests": len(results), "failed": len(results) - len(done), "tokens": sum(r.tokens for r in done),
            "tokens_per_s": sum(r.tokens for r in done) / wall if wall > 0 else 0.0,
            "latency_p50": statistics.median(latency) if latency else float("nan"),
            "latency_p90": percentile(latency, 0.9),
            "first_token_p50": statistics.median(first) if first else float("nan"),
            "first_token_p99": percentile(first, 0.99),
            "per_token_p50": statistics.median(per_token) if per_token else float("nan"),
            "per_token_p99": percentile(per_token, 0.99)}


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


def start_server(ckpt: str, max_batch: int, device: str = "cpu", root: Path = ROOT,
                 threads: int | None = None) -> tuple[subprocess.Popen, str]:
    """scripts/serve.py of the project at ``root`` on a free loopback port, in its own process (``threads``: torch's
    CPU threads there, OMP_NUM_THREADS); its process and URL once it listens."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
           "PYTHONUNBUFFERED": "1", **({"OMP_NUM_THREADS": str(threads)} if threads else {})}
    process = subprocess.Popen([sys.executable, str(root / "scripts" / "serve.py"), f"ckpt={ckpt}", "port=0",
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


def random_checkpoint(model: ModelConfig, folder: Path, vocabulary: str = "char") -> str:
    """A checkpoint of random weights with the model's shape over a character vocabulary or GPT-2's (speed only)."""
    import torch

    from gpt import GPT
    from gpt.tokenizers.tokenizer import CharTokenizer, GPT2Tokenizer
    from gpt.weights import checkpoint

    tokenizer = (GPT2Tokenizer() if vocabulary == "gpt2"
                 else CharTokenizer([chr(c) for c in range(32, 127)] + ["\n", "\t"]))
    torch.manual_seed(0)
    config = model.build(tokenizer.vocab_size)
    path = folder / "random.pt"
    checkpoint.save({"model": GPT(config).state_dict(), "model_config": config.to_dict(),
                     "tokenizer": tokenizer.to_meta()}, path)
    return str(path)


def write_random(cfg: BenchServeConfig) -> str:
    """The random-weights model (cfg.model over cfg.tokenizer) exported in the GPT-2 layout to cfg.write_random."""
    from gpt.interop import formats
    from gpt.weights.load import load_weights

    out = Path(cfg.write_random).expanduser()
    with tempfile.TemporaryDirectory() as tmp:
        config, state, tokenizer = load_weights(random_checkpoint(cfg.model, Path(tmp), cfg.tokenizer))
        formats.export(state, config, tokenizer, out, format="hf")
    unique = {v.data_ptr(): v.numel() for k, v in state.items() if not k.endswith("attn.bias")}  # tied: once
    params = sum(unique.values())
    return f"wrote {out}: random weights, {params / 1e6:.2f}M parameters, {config.vocab_size}-token vocabulary"


def prompt_ids(ckpt: str) -> Callable[[str], list[int]]:
    """The checkpoint's tokenizer's encode: prompts sent as token ids read the same on every server."""
    from gpt.tokenizers.tokenizer import from_meta
    from gpt.weights.load import load_weights

    return from_meta(load_weights(ckpt)[2]).encode


def served_model(url: str) -> str:
    """The first model id an OpenAI-compatible server lists at /v1/models."""
    try:
        with urllib.request.urlopen(url.rstrip("/").removesuffix("/v1") + "/v1/models", timeout=30) as response:
            return json.loads(response.read())["data"][0]["id"]
    except (OSError, ValueError, KeyError, IndexError, TypeError) as err:
        raise UserError(f"peer={url}: no model listed at /v1/models ({type(err).__name__}: {err})",
                        hint="start that server first, or name its model with peer_model=") from None


def checkout(revision: str, folder: Path) -> Path:
    """The project's gpt/, scripts/ and configs/ at a git revision, unpacked into folder (git archive)."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", revision, "gpt", "scripts",
                              "configs"], capture_output=True)
    if archive.returncode != 0:
        raise UserError(f"baseline={revision}: git cannot read it ({archive.stderr.decode().strip()[:200]})",
                        hint="give a commit, a branch or a tag of this repository")
    folder.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
    return folder


def decode_speed(ckpt: str, device: str, tokens: int, threads: int | None = None) -> float:
    """Tokens per second of the model's own decode loop, one sequence (bench_decode's "KV cache" way, greedy) after
    an 11-token prompt, the weights stored as bench_decode and the server store them (gemv_layout): the ceiling of
    one client's speed through the server."""
    import torch

    from gpt.inference.decoding import generate
    from gpt.inference.weight_layout import gemv_layout
    from gpt.weights.load import load as load_model

    model = load_model(ckpt, torch.device(device)).model
    gemv_layout(model)
    if threads:
        torch.set_num_threads(threads)
    prompt = torch.randint(0, model.config.vocab_size, (1, 11), device=device)
    generate(model, prompt, 8, temperature=0.0)  # warm up
    start = time.perf_counter()
    generate(model, prompt, tokens, temperature=0.0)
    return tokens / (time.perf_counter() - start)


LEVEL_COLUMNS = ["engine", "clients", "run", "requests", "failed", "tokens", "tokens/s", "TTFT p50 ms",
                 "TTFT p99 ms", "TPOT p50 ms", "TPOT p99 ms", "prefix hit rate", "load average before / after"]


def level_row(engine: str, clients: int, repeat: int, s: dict, before: str, hits: str) -> list:
    return [engine, clients, repeat, s["requests"], s["failed"], s["tokens"], f"{s['tokens_per_s']:,.0f}",
            f"{s['first_token_p50'] * 1e3:.0f}", f"{s['first_token_p99'] * 1e3:.0f}",
            f"{s['per_token_p50'] * 1e3:.1f}", f"{s['per_token_p99'] * 1e3:.1f}", hits, f"{before} / {uptime()}"]


def run(cfg: BenchServeConfig) -> str:
    """Start the server (and the baseline's; a peer already listens), run every level cfg.repeats times
    (interleaved, the servers taking turns), time the model's own decode loop each time round; return the report as
    markdown (or, with write_random, write that model and say so)."""
    if cfg.write_random:
        return write_random(cfg)
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = (cfg.ckpt or random_checkpoint(cfg.model, Path(tmp), cfg.tokenizer)).rstrip("/")
        roots = {"this": ROOT} | ({cfg.baseline: checkout(cfg.baseline, Path(tmp) / "baseline")}
                                  if cfg.baseline else {})
        servers = {}  # name: (its process, None for a peer; its URL; the model id it serves ours as)
        try:
            for name, root in roots.items():
                servers[name] = (*start_server(ckpt, cfg.max_batch, cfg.device.type, root, cfg.threads), ckpt)
            if cfg.peer:
                servers[cfg.peer_name] = (None, cfg.peer.rstrip("/"), cfg.peer_model or served_model(cfg.peer))
            rows, best, ceiling = levels(cfg, ckpt, servers)
        finally:
            for process, _, _ in servers.values():
                if process is not None:
                    process.terminate()
                    process.wait(timeout=30)
    return report(cfg, rows, best, ceiling)


def levels(cfg: BenchServeConfig, ckpt: str, servers: dict) -> tuple[list, dict, list[float]]:
    """Every level cfg.repeats times, the servers taking turns on the same requests, and the chat replay: the
    table's rows, the best tokens/s per (server, clients), the decode loop's tokens/s each round."""
    vocabulary = "".join(chr(c) for c in range(97, 123)) + " ():=\n"
    encode = prompt_ids(ckpt) if cfg.token_ids else None
    bodies, arrivals = workload(cfg, vocabulary, cfg.seed, encode)
    rows, best, ceiling = [], {}, []
    for _, url, model in servers.values():
        stream_completion(url, {**bodies[0], "model": model, "max_tokens": 2})  # warm up
    for repeat in range(cfg.repeats):
        ceiling.append(decode_speed(ckpt, cfg.device.type, max(b["max_tokens"] for b in bodies), cfg.threads))
        for level, clients in enumerate(cfg.clients):  # new prompts each level, the same for every server
            bodies, arrivals = workload(cfg, vocabulary, cfg.seed + 1 + repeat * len(cfg.clients) + level, encode)
            for name, (_, url, model) in servers.items():
                before, counters = uptime(), prefix_counters(url, model)
                s = summary(load(url, model, clients, cfg.requests, cfg.seconds, {}, None, bodies, arrivals))
                best[name, clients] = max(best.get((name, clients), 0.0), s["tokens_per_s"])
                rows.append(level_row(name, clients, repeat + 1, s, before,
                                      hit_rate(counters, prefix_counters(url, model))))
        for name, (_, url, model) in servers.items() if cfg.chat_turns else ():
            before, counters = uptime(), prefix_counters(url, model)
            s = summary(chat_replay(url, model, max(cfg.clients), max(1, cfg.requests // cfg.chat_turns),
                                    cfg.chat_turns, cfg.seed + repeat))
            rows.append(level_row(f"{name}, chat replay", max(cfg.clients), repeat + 1, s, before,
                                  hit_rate(counters, prefix_counters(url, model))))
    return rows, best, ceiling


def report(cfg: BenchServeConfig, rows: list, best: dict, ceiling: list[float]) -> str:
    """The header (what ran, the ratios that matter) and the table."""
    lengths = (f"prompts of {cfg.prompt_tokens[0]}-{cfg.prompt_tokens[1]} characters" if cfg.prompt_tokens
               else f"prompt {cfg.prompt!r}")
    outputs = (f"{cfg.output_tokens[0]}-{cfg.output_tokens[1]}" if cfg.output_tokens else str(cfg.max_tokens))
    arrivals = f"Poisson arrivals at {cfg.arrival_rate:g}/s" if cfg.arrival_rate else "requests back to back"
    lengths += " (sent as token ids)" * cfg.token_ids
    lines = [f"serving benchmark: {cfg.ckpt or 'random weights'}, {lengths}, {outputs} tokens per request, {arrivals},"
             f" temperature {cfg.temperature:g}, max_batch {cfg.max_batch}, {describe(cfg.device.type)}"
             + (f", {cfg.threads} torch thread(s) each" if cfg.threads else ""),
             f"the model's own decode loop (one sequence): {statistics.median(ceiling):,.0f} tokens/s (median of "
             f"{', '.join(f'{c:,.0f}' for c in ceiling)})"]
    one = min(cfg.clients)
    lines.append(f"best tokens/s with {one} client(s) against the decode loop: " + ", ".join(
        f"{name} {best[name, one] / statistics.median(ceiling):.0%}" for name, c in best if c == one))
    for other in (cfg.baseline, cfg.peer and cfg.peer_name):
        if other:
            lines.append(f"best tokens/s, this engine against {other}'s: " + ", ".join(
                f"{c} clients {best['this', c] / best[other, c]:.2f}x" for c in cfg.clients if best[other, c]))
    return "\n".join(lines) + "\n\n" + markdown_table(LEVEL_COLUMNS, rows)

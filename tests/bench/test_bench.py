"""The benchmarks through the real scripts in their quick modes, plus the pure helpers behind them."""

import csv
import re

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir

from conftest import ROOT, needs_gpt2, run_script
from gpt import kernels as attention
from gpt.bench.attention import BenchAttentionConfig, Result, tables
from gpt.bench.train import BenchTrainConfig
from gpt.errors import ConfigError
from gpt.model.config import GPTConfig
from gpt.schema import register, typed
from gpt.train.metrics import PEAK_FLOPS, flops_per_token

register()


@pytest.mark.slow
def test_bench_attention_quick_mode_writes_tables_csv_and_plots(tmp_path):
    out = tmp_path / "attention"
    result = run_script("bench_attention", "device=cpu", "seq_lens=[64,128]", "repeats=2", "warmup=1", "threads=1",
                        f"out_dir={out}")
    assert result.returncode == 0, result.stderr
    kernels = attention.available()
    for kernel in kernels:
        for mode in ("fwd", "fwd+bwd"):
            assert f"| {kernel} | {mode} |" in result.stdout
    assert "| kernel | mode | T=64 | T=128 |" in result.stdout and "peak MiB" in result.stdout
    with open(out / "attention.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(kernels) * 2 * 2
    by_case = {(r["kernel"], r["mode"], r["seq_len"]): r for r in rows}
    for kernel in ("manual", "sdpa"):  # these run everywhere: figures, no note
        for mode in ("fwd", "fwd+bwd"):
            row = by_case[(kernel, mode, "128")]
            assert float(row["median_ms"]) > 0 and float(row["peak_mib"]) > 0 and row["note"] == ""
    # FlexAttention has no backward on CPU: the reason is the result, not a crash.
    flex_backward = by_case[("flex", "fwd+bwd", "64")]
    assert "backward" in flex_backward["note"] and flex_backward["median_ms"] == ""
    assert float(by_case[("flex", "fwd", "64")]["median_ms"]) > 0
    for name in ("attention_time.png", "attention_memory.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "attention.md").read_text().startswith("attention benchmark:")


@pytest.mark.slow
def test_bench_train_quick_mode_reports_each_variant(tmp_path):
    out = tmp_path / "train"
    result = run_script("bench_train", "device=cpu", "model=tiny", "batch_size=4", "steps=2", "warmup=1", "threads=1",
                        "compile=[false]", "precisions=[fp32,fp16]", "activation_checkpointing=[false,true]",
                        f"out_dir={out}")
    assert result.returncode == 0, result.stderr
    assert "| eager | fp32 |" in result.stdout and "| eager | fp16 |" in result.stdout
    assert "| eager + AC | fp32 |" in result.stdout
    with open(out / "train.csv") as f:
        table = list(csv.DictReader(f))
    rows = {r["precision"]: r for r in table if r["activation_checkpointing"] == "False"}
    checkpointed = next(r for r in table if r["activation_checkpointing"] == "True" and r["precision"] == "fp32")
    assert float(checkpointed["loss"]) == float(rows["fp32"]["loss"])  # the same steps, recomputed
    assert float(rows["fp32"]["tokens_per_s"]) > 0 and float(rows["fp32"]["ms_per_step"]) > 0
    assert float(rows["fp32"]["peak_mib"]) > 0 and rows["fp32"]["note"] == ""
    assert "fp16 needs a CUDA GPU" in rows["fp16"]["note"]  # cannot run here: says why
    assert (out / "train.md").exists()


@pytest.mark.slow
def test_bench_decode_quick_mode():
    result = run_script("bench_decode", "device=cpu", "model=tiny", "new_tokens=5", "prompt_lens=[1,8]", "repeats=1")
    assert result.returncode == 0, result.stderr
    assert "| prompt tokens | prefill ms |" in result.stdout
    assert "| 1 |" in result.stdout and "| 8 |" in result.stdout


def compose_bench(name: str, *overrides: str):
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base=None):
        return compose(config_name=name, overrides=list(overrides))


@pytest.mark.parametrize("override, message", [
    ("kernels=[nope]", "unknown attention kernel 'nope'"),
    ("kernels=[manual:flash]", "has no backend 'flash'"),
    ("modes=[backward]", "modes must be"),
    ("dtype=fp64", "dtype must be one of"),
    ("repeats=0", "repeats must be positive, got 0"),
    ("max_seconds=nan", "max_seconds must be positive, got nan"),
])
def test_bench_attention_refuses_bad_settings_before_running(override, message):
    with pytest.raises(ConfigError, match=message):
        typed(compose_bench("bench_attention", override))


@pytest.mark.parametrize("override, message", [
    ("seq_len=4096", "seq_len must be in 1..block_size (128)"),
    ("precisions=[fp64]", "precisions must be a non-empty list"),
    ("learning_rate=-1", "learning_rate must be positive, got -1"),
])
def test_bench_train_refuses_bad_settings_before_running(override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        typed(compose_bench("bench_train", override))


def test_bench_configs_compose_with_their_defaults():
    cfg = typed(compose_bench("bench_attention"))
    assert isinstance(cfg, BenchAttentionConfig)
    assert cfg.kernels is None and cfg.seq_lens is None and list(cfg.modes) == ["fwd", "fwd+bwd"]
    cfg = typed(compose_bench("bench_train", "model=gpt2", "compile=[true]"))
    assert isinstance(cfg, BenchTrainConfig) and cfg.model.build(cfg.vocab_size).n_layer == 12
    assert list(cfg.compile) == [True] and list(cfg.precisions) == ["fp32", "bf16"]


def test_flops_per_token_is_six_n_plus_the_attention_term():
    config = GPTConfig()  # GPT-2 124M
    n = 124_000_000
    assert flops_per_token(config, n, 1024) == 6 * n + 12 * 12 * 12 * 64 * 1024
    assert set(dict(PEAK_FLOPS)["H100"]) == {"bf16", "fp16", "fp32"}


def test_tables_show_a_footnote_for_each_distinct_reason():
    results = [
        Result("sdpa", "fwd", 64, median_ms=1.5, peak_mib=2.0),
        Result("flex", "fwd", 64, note="no backward here"),
        Result("flex", "fwd+bwd", 64, note="no backward here"),
        Result("manual", "fwd", 64, note="timeout"),
    ]
    text = tables(results, [64], compiled=False)
    assert "| sdpa | fwd | 1.50 |" in text and "| flex | fwd+bwd | - [1] |" in text
    assert "| manual | fwd | - [2] |" in text
    assert "[1] no backward here" in text and "[2] timeout" in text


@pytest.mark.slow
@needs_gpt2
def test_bench_data_prepares_with_each_thread_count_and_reports_medians_and_speedups(tmp_path):
    result = run_script("bench_data", "--sizes", "1", "--procs", "1", "2", "--repeat", "1", "--work", str(tmp_path))
    assert result.returncode == 0, result.stderr
    for what in ("prepare, 1 thread(s)", "prepare, 2 thread(s)", "train.py: launch to the first step's log line",
                 "baseline: one encode_ordinary call"):
        assert f"| 1 | {what} |" in result.stdout
    assert re.search(r"1 MB: prepare, 2 thread\(s\) is \d+\.\d\dx one thread", result.stdout)
    one, two = (np.fromfile(tmp_path / "data" / "bench_1mb" / "train_000000.bin", dtype=np.uint16),
                np.fromfile(tmp_path / "base.bin", dtype=np.uint16))
    assert one.size > 0 and np.count_nonzero(one == 50256) > 0  # documents end with <|endoftext|>
    assert np.array_equal(one[one != 50256][:1000], two[:1000])  # the same BPE as one encode_ordinary call


def test_bench_data_reports_the_median_run_and_the_speedup_from_medians():
    from gpt.bench.data import median_row, speedups

    runs = [dict(wall_s=w + 1, work_s=w, tokens=100, peak=2**20 * p) for w, p in ((3.0, 5), (2.0, 7), (4.0, 6))]
    row = median_row(runs, 10**6, "prepare, 1 thread(s)")
    assert row["work_s"] == 3.0 and row["wall_s"] == 4.0 and row["runs"] == [3.0, 2.0, 4.0]
    assert row["peak_mib"] == 7 and row["mb_s"] == pytest.approx(1 / 3)
    two = median_row([dict(wall_s=2.5, work_s=1.5, tokens=100, peak=0)], 10**6, "prepare, 2 thread(s)")
    assert speedups([row, two]) == ["1 MB: prepare, 2 thread(s) is 2.00x one thread (3.00 s / 1.50 s)"]


def decode_config(*overrides: str):
    from omegaconf import OmegaConf

    return OmegaConf.to_object(compose_bench("bench_decode", "device=cpu", "model=tiny", *overrides))


def test_bench_decode_interleaves_cache_and_recompute_and_checks_their_tokens():
    from gpt.bench.decode import run

    out = run(decode_config("new_tokens=40", "prompt_lens=[1,8]", "repeats=2", "threads=1"))
    assert "1 threads" in out and "2 interleaved repeats" in out
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith("| 1 |") or line.startswith("| 8 |")]
    assert len(rows) == 2
    assert "speed-up: KV cache over recompute, both eager (lowest-highest repeat)" in out
    assert "every way eager but those named compiled" in out
    for row in rows:  # prompt, prefill ms, prefill tok/s, cache tok/s, recompute tok/s, speed-up, same tokens
        median, spread = row[5].split("x (")  # "3.9x (3.1-4.4)": the median and the repeats' lowest and highest
        low, high = map(float, spread.rstrip(")").split("-"))
        assert 0 < low <= float(median) <= high and row[6] == "yes |"


def test_bench_decode_against_transformers_runs_both_on_the_same_weights(monkeypatch):
    import gpt.bench.decode_hf as decode_hf

    pytest.importorskip("transformers")
    cfg = decode_config("repeats=1", "hf_new_tokens=6")
    tiny = dict(n_layer=2, n_head=2, n_embd=32, block_size=64, vocab_size=300, dropout=0.0, bias=True)
    table = decode_hf.against_transformers(cfg, torch.device("cpu"), tiny)
    assert "2 layers of 32" in table and "6 new tokens" in table
    rows = {line.split(" | ")[0][2:]: line.split(" | ") for line in table.splitlines()[4:] if line.startswith("| ")}
    assert set(rows) == {"ours, KV cache", "transformers generate", "ours, KV cache, (out, in) weights",
                         "ours, KV cache, MKL only, (in, out) weights", decode_hf.FLOOR}
    floor = rows.pop(decode_hf.FLOOR)
    assert all(row[3] == "yes |" for row in rows.values())  # greedy tokens equal transformers', in either storage
    assert floor[3] == "- |"  # the memory's floor: no tokens of its own
    assert "torch.sum over that many bytes took" in table
    bf16 = decode_hf.against_transformers(decode_config("repeats=1", "hf_new_tokens=6", "hf_bf16=true"),
                                          torch.device("cpu"), tiny).split("bf16 on both sides")[1]
    rows = {line.split(" | ")[0][2:]: line.split(" | ") for line in bf16.splitlines() if line.startswith("| ")}
    assert set(rows) == {"decoder", "---", "ours, KV cache, bf16", "transformers generate, bf16",
                         decode_hf.FLOOR + ", bf16"}
    assert rows["ours, KV cache, bf16"][3] == "yes" and rows["transformers generate, bf16"][2] == "1.00x"
    assert "not comparable with the fp32 table" in bf16 and "MB read in" in bf16
    monkeypatch.setattr(decode_hf, "hf_twin", lambda model: None)
    assert "skipped (transformers is not installed" in decode_hf.against_transformers(cfg, torch.device("cpu"), tiny)

TINY_DELTANET = dict(n_layer=2, n_head=2, n_embd=32, block_size=48, vocab_size=256, designs=["deltanet"])  # model=tiny


def test_bench_decode_times_steps_after_each_context_and_a_recurrent_state_keeps_its_bytes():
    from gpt.bench.decode import run

    def table(*overrides):
        out = run(decode_config("new_tokens=2", "prompt_lens=[1]", "repeats=1", "contexts=[4,40]", "context_steps=3",
                                "model.block_size=48", *overrides))
        rows = [line.split(" | ") for line in out.splitlines() if line.startswith(("| 4 |", "| 40 |"))]
        assert len(rows) == 2 and rows[0][2] == "1.00x" and float(rows[1][1]) > 0, out
        return [int(row[3].strip(" |").replace(",", "")) for row in rows]  # the cache's bytes at each context

    from gpt import GPTConfig, memory
    from gpt.errors import ConfigError

    state = memory.kv_bytes_per_token(GPTConfig(**TINY_DELTANET), 4) * 48  # its fixed state, all layers
    assert table("model.designs=[deltanet]") == [state, state]  # Gated DeltaNet: whatever the context
    table()  # softmax attention: the same table
    with pytest.raises(ConfigError, match="contexts: 40 cached tokens . 9 steps exceed block_size 48"):
        run(decode_config("contexts=[40]", "context_steps=9", "model.block_size=48"))


@pytest.mark.slow
def test_bench_serve_runs_the_same_requests_on_a_peer_server(tmp_path):
    """peer=<base URL>: an outside OpenAI-compatible server (vLLM's, in docs/serving.md) gets the same requests as
    ours, taking turns; here the peer is a second server of ours on the same weights, so greedy requests sent as
    token ids give both the same tokens, and the peer's model id comes from its /v1/models."""
    pytest.importorskip("fastapi")
    from gpt.bench.serve import BenchServeConfig, run, start_server
    from gpt.model.config import ModelConfig

    folder = tmp_path / "export"
    small = ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=64)
    cfg = BenchServeConfig(model=small, write_random=str(folder))
    assert run(cfg).startswith(f"wrote {folder}: random weights")
    process, url = start_server(str(folder), max_batch=8)
    try:
        table = run(BenchServeConfig(ckpt=str(folder), clients=[1, 4], requests=6, repeats=1, seconds=120,
                                     prompt_tokens=[4, 12], output_tokens=[6, 10], temperature=0.0, token_ids=True,
                                     threads=1, peer=url + "/v1", peer_name="again"))
    finally:
        process.terminate()
        process.wait(timeout=30)
    assert "(sent as token ids)" in table and "temperature 0," in table
    assert "this engine against again's: 1 clients" in table
    rows = [line.split(" | ") for line in table.splitlines() if line.startswith(("| this |", "| again |"))]
    assert [(r[0], r[1]) for r in rows] == [("| this", "1"), ("| again", "1"), ("| this", "4"), ("| again", "4")]
    for ours, theirs in (rows[:2], rows[2:]):
        assert ours[4] == theirs[4] == "0" and ours[5] == theirs[5] != "0"  # none failed, the same tokens


@pytest.mark.parametrize("override, message", [
    ({"peer": "http://example.com:8000"}, "loopback address only"),
    ({"peer": "127.0.0.1:8000"}, "loopback address only"),
    ({"peer": "http://127.0.0.1:x"}, "is not a URL"),
    ({"peer": "http://127.0.0.1:8000", "peer_name": "this"}, "taken by another server"),
    ({"tokenizer": "bpe"}, "tokenizer must be char or gpt2"),
    ({"temperature": -1.0}, "temperature must be 0"),
])
def test_bench_serve_refuses_bad_settings_before_running(override, message):
    from gpt.bench.serve import BenchServeConfig

    with pytest.raises(ConfigError, match=message):
        BenchServeConfig(**override)


@pytest.mark.parametrize("usage", [True, False], ids=["usage sent", "no usage (llama-cpp-python)"])
def test_a_streamed_completion_counts_its_tokens_from_usage_or_else_its_pieces(usage):
    """vLLM and ours end a stream with a usage chunk; llama-cpp-python's server sends none, one piece a token: the
    load generator then counts the pieces that carry text, so a peer's tokens/s is not 0."""
    import http.server
    import json
    import threading

    from gpt.bench.serve import stream_completion

    pieces = ["a", "b", "", "c"]  # an empty piece (a role or a finish chunk) is no token

    class Streamer(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802  (http.server's name)
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            chunks = [{"choices": [{"text": p}]} for p in pieces]
            chunks += [{"choices": [], "usage": {"completion_tokens": 7}}] if usage else []
            for chunk in chunks:
                self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            self.wfile.write(b"data: [DONE]\n\n")

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Streamer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        result = stream_completion(f"http://127.0.0.1:{server.server_port}/v1", {"prompt": "x"})
    finally:
        server.shutdown()
        server.server_close()
    assert result.error is None and result.text == "abc"
    assert result.tokens == (7 if usage else 3)


def test_a_streamed_chunk_not_shaped_as_openais_is_that_request_s_error():
    """A peer's odd chunk (usage not an object, a choice not an object) ends that request with an error, counted as
    failed in the table, not a traceback that stops the benchmark."""
    import http.server
    import threading

    from gpt.bench.serve import stream_completion

    bodies = [b'data: {"usage": 7}\n\n', b'data: {"choices": ["a"]}\n\n']

    class Odd(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802  (http.server's name)
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(bodies.pop(0))

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Odd)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        results = [stream_completion(f"http://127.0.0.1:{server.server_port}/v1", {"prompt": "x"}) for _ in range(2)]
    finally:
        server.shutdown()
        server.server_close()
    assert [r.error.split(":")[0] for r in results] == ["TypeError", "AttributeError"]

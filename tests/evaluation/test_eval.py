"""scripts/eval.py's body: the full pass on the data a run trained on, JSON results, one-line errors for bad input."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import needs_gpt2, run_inline, run_script, write_corpus
from gpt.data.config import DataConfig
from gpt.data.loader import TokenData
from gpt.data.prepare import prepare
from gpt.device import DeviceConfig
from gpt.errors import ConfigError, UserError
from gpt.evaluation.config import EvalConfig
from gpt.evaluation.heldout import full_pass
from gpt.evaluation.run import run
from gpt.model import GPT
from gpt.model.config import GPTConfig
from gpt.tokenizers.tokenizer import CharTokenizer
from gpt.weights import checkpoint
from gpt.weights.load import load_model


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> DataConfig:
    root = tmp_path_factory.mktemp("eval")
    data = DataConfig(name="text", source="path", path=str(write_corpus(root / "corpus")), root=str(root / "data"))
    prepare(data, log=lambda message: None)
    return data


def save_run(folder: Path, data: DataConfig | None, chars: list[str], block_size: int = 16) -> Path:
    """A run folder holding a checkpoint of a fresh character model that records ``data`` as its training data."""
    folder.mkdir()
    torch.manual_seed(0)
    config = GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=block_size, vocab_size=len(chars), dropout=0.0)
    payload = checkpoint.model_entries(GPT(config).state_dict(), config, CharTokenizer(chars).to_meta())
    if data is not None:
        payload["config"] = {"data": {"name": data.name, "root": data.root}}
    checkpoint.save(payload, folder / checkpoint.LATEST)
    return folder


def vocab(data: DataConfig) -> list[str]:
    return TokenData(Path(data.root) / data.name).tokenizer.chars


def test_the_full_pass_runs_on_the_runs_own_data_and_writes_its_json(prepared, tmp_path, capsys):
    run_dir = save_run(tmp_path / "run", prepared, vocab(prepared))
    out = tmp_path / "results.json"
    results = run(EvalConfig(ckpt=str(run_dir), out=str(out), batch_size=3, device=DeviceConfig("cpu")))
    model, tokenizer = load_model(run_dir)  # the same pass, straight through the library
    val = TokenData(Path(prepared.root) / prepared.name).splits["val"]
    expected = full_pass(model, val, tokenizer, block_size=16)
    written = json.loads(out.read_text())
    assert written == results
    assert written["loss"] == pytest.approx(expected.loss, abs=1e-9) and written["tokens"] == len(val) - 1
    assert written["bpb"] == pytest.approx(expected.bpb, abs=1e-9) and written["split"] == "val"
    assert "bits per byte" in capsys.readouterr().out


def test_limit_scores_exactly_that_many_windows_and_stride_overlaps_them(prepared, tmp_path):
    run_dir = save_run(tmp_path / "run", prepared, vocab(prepared))
    results = run(EvalConfig(ckpt=str(run_dir), limit=3, stride=4, split="train", device=DeviceConfig("cpu")))
    assert results["windows"] == 3 and results["tokens"] == 16 + 2 * 4 and results["stride"] == 4


def test_a_model_with_another_tokenizer_than_the_data_is_refused(prepared, tmp_path):
    run_dir = save_run(tmp_path / "run", prepared, vocab(prepared)[:-1])
    with pytest.raises(UserError, match="tokenizer .* is not the one"):
        run(EvalConfig(ckpt=str(run_dir), device=DeviceConfig("cpu")))


def test_a_split_shorter_than_one_window_is_refused(prepared, tmp_path):
    val_tokens = len(TokenData(Path(prepared.root) / prepared.name).splits["val"])
    run_dir = save_run(tmp_path / "run", prepared, vocab(prepared), block_size=val_tokens)
    with pytest.raises(UserError, match="fewer than one window"):
        run(EvalConfig(ckpt=str(run_dir), device=DeviceConfig("cpu")))


def test_missing_inputs_are_named(prepared, tmp_path):
    no_data = save_run(tmp_path / "run", None, vocab(prepared))
    with pytest.raises(UserError, match="records no training data"):
        run(EvalConfig(ckpt=str(no_data), device=DeviceConfig("cpu")))
    named = run(EvalConfig(ckpt=str(no_data), data=prepared, limit=1, device=DeviceConfig("cpu")))  # data=<name>
    assert named["windows"] == 1 and named["data"] == str(Path(prepared.root) / prepared.name)
    with pytest.raises(UserError, match="meta.json missing"):
        run(EvalConfig(ckpt=str(no_data), data_dir=str(tmp_path), device=DeviceConfig("cpu")))
    with pytest.raises(UserError, match="folder of out="):
        run(EvalConfig(ckpt=str(no_data), out=str(tmp_path / "nowhere" / "r.json"), device=DeviceConfig("cpu")))
    payload = checkpoint.load(no_data / checkpoint.LATEST)
    del payload["tokenizer"]
    checkpoint.save(payload, no_data / checkpoint.LATEST)
    with pytest.raises(UserError, match="has no tokenizer entry"):
        run(EvalConfig(ckpt=str(no_data), data_dir=str(tmp_path), device=DeviceConfig("cpu")))


@pytest.mark.parametrize("values, message", [
    (dict(task="mmlu"), "unknown task"), (dict(split="test"), "unknown split"), (dict(stride=0), "stride"),
    (dict(out="r.txt"), "json"), (dict(init_path="x"), "init_path"), (dict(batch_size=0), "batch_size"),
])
def test_bad_settings_are_refused_when_the_config_is_built(values, message):
    with pytest.raises(ConfigError, match=message):
        EvalConfig(ckpt="runs/x", **values)


@pytest.mark.slow
def test_the_script_prints_a_table_and_writes_json_or_one_error_line(prepared, tmp_path):
    run_dir = save_run(tmp_path / "run", prepared, vocab(prepared))
    out = tmp_path / "r.json"
    done = run_script("eval", f"ckpt={run_dir}", f"out={out}", "limit=2", "device=cpu")
    assert done.returncode == 0, done.stderr
    assert "perplexity" in done.stdout and json.loads(out.read_text())["windows"] == 2
    bad = (tmp_path / "bad.jsonl")
    bad.write_text('{"activity_label": "a"}\n{oops\n')
    failed = run_inline("eval", f"ckpt={run_dir}", "task=hellaswag", f"hellaswag.path={bad}", "device=cpu")
    assert failed.returncode == 2 and failed.stderr.startswith(f"error: {bad}:1: ctx_a is missing")
    assert "Traceback" not in failed.stderr
    assert np.isfinite(json.loads(out.read_text())["loss"])  # the earlier results are untouched


@pytest.mark.parametrize("kind", ["char", pytest.param("gpt2", marks=needs_gpt2)])
def test_bits_per_byte_counts_the_bytes_prepare_counted(kind, prepared, tmp_path):
    """The scored targets' bytes are the split's text bytes (meta.json) less the first token's: end-of-text has none."""
    data = DataConfig(name=f"text_{kind}", source="path", path=prepared.path, root=str(tmp_path), tokenizer=kind)
    folder = prepare(data, log=lambda message: None)
    tokens = TokenData(folder)
    config = GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=64, vocab_size=tokens.tokenizer.vocab_size)
    model = GPT(config)
    result = full_pass(model, tokens.splits["val"], tokens.tokenizer, block_size=64, batch_size=16)
    first = int(tokens.splits["val"][0:1][0])
    assert result.bytes + len(tokens.tokenizer.token_bytes(first)) == tokens.meta["splits"]["val"]["bytes"]
    assert result.bpb == pytest.approx(result.loss * result.tokens / math.log(2) / result.bytes)


def test_the_eval_config_composes_with_a_data_group_or_a_folder():
    from hydra import compose, initialize_config_dir

    from gpt.schema import register, typed

    register()
    with initialize_config_dir(config_dir=str(Path(__file__).resolve().parents[2] / "configs"), version_base=None):
        plain = typed(compose(config_name="eval", overrides=["ckpt=runs/x"]))
        named = typed(compose(config_name="eval", overrides=["ckpt=runs/x", "data=stdlib_gpt2", "task=hellaswag",
                                                             "hellaswag.path=hs.jsonl", "limit=5"]))
        folder = typed(compose(config_name="eval", overrides=["ckpt=runs/x", "data_dir=prepared/here"]))
        with pytest.raises(ConfigError, match="unknown config key bogus"):
            typed(compose(config_name="eval", overrides=["ckpt=runs/x", "+bogus=1"]))
        with pytest.raises(ConfigError, match="data and data_dir are both given"):
            typed(compose(config_name="eval", overrides=["ckpt=runs/x", "data=stdlib_char", "data_dir=x"]))
    assert isinstance(plain, EvalConfig) and plain.data is None and plain.task == "heldout" and plain.split == "val"
    assert named.data.name == "stdlib_gpt2" and named.hellaswag.path == "hs.jsonl" and named.limit == 5
    assert folder.data_dir == "prepared/here" and folder.data is None


@pytest.mark.parametrize("settings", [{"designs": ["rope"], "n_kv_head": 1, "window": 8},  # Starcoder2
                                      {"designs": ["qk_norm"], "window": 8}])  # remote code
def test_an_export_for_transformers_evaluates_as_its_checkpoint_does(settings, prepared, tmp_path):
    """scripts/eval.py ckpt=<export folder>: the weights and config.json read back (never the modeling file)."""
    from gpt.interop.formats import export

    torch.manual_seed(0)
    chars = vocab(prepared)
    config = GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=len(chars), **settings)
    model = GPT(config)
    (tmp_path / "run").mkdir()
    checkpoint.save(checkpoint.model_entries(model.state_dict(), config, CharTokenizer(chars).to_meta()),
                    tmp_path / "run" / checkpoint.LATEST)
    export(model.state_dict(), config, CharTokenizer(chars).to_meta(), tmp_path / "export")
    results = [run(EvalConfig(ckpt=str(tmp_path / source), data_dir=str(Path(prepared.root) / prepared.name),
                              batch_size=3, limit=4, device=DeviceConfig("cpu"))) for source in ("run", "export")]
    assert results[0]["loss"] == results[1]["loss"] and results[0]["tokens"] == results[1]["tokens"]

"""The battery of user mistakes, through the real scripts: exit code 2, one `error:` line naming the
problem (and a hint), no traceback, and the run and data already on disk left byte for byte as they were."""

import hashlib
from pathlib import Path

import pytest
import torch

from conftest import run_forked, run_inline, run_script, write_corpus

pytestmark = pytest.mark.slow

TINY = ["model=tiny", "train.max_iters=4", "train.eval_interval=2", "train.eval_iters=1", "train.batch_size=4",
        "train.sample_tokens=0", "device=cpu"]


def snapshot(*folders: Path) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest()
            for folder in folders for p in sorted(folder.rglob("*")) if p.is_file()}


def untouched(before: dict[str, str], root: Path, run: Path) -> bool:
    """Every file that existed is byte-for-byte the same, and the run directory gained nothing."""
    after = snapshot(root)
    same = all(after.get(path) == digest for path, digest in before.items())
    run_files = {p for p in after if p.startswith(str(run) + "/")}
    return same and run_files == {p for p in before if p.startswith(str(run) + "/")}


@pytest.fixture(scope="module")
def existing(tmp_path_factory):
    """A finished tiny run and its prepared data, which no failing command may touch."""
    root = tmp_path_factory.mktemp("existing")
    corpus = write_corpus(root / "corpus")
    (root / "empty_dir").mkdir()
    (root / "empty.txt").write_text("")
    (root / "short.txt").write_text("tiny text\n")
    (root / "not_a_dir").write_text("a file")
    run = root / "run"
    data = [f"data.path={corpus}", f"data.root={root / 'data'}"]
    result = run_forked("train", *TINY, "data=text", *data, f"out_dir={run}")  # the run, not its process, is the point
    assert result.returncode == 0, result.stderr
    return root, run, data


CASES = {
    "n_head does not divide n_embd": (["model.n_head=3"], "model.n_embd (32) must be divisible by model.n_head (3)"),
    "n_kv_head does not divide n_head": (["model.n_kv_head=3"],
                                         "model.n_head (2) must be a multiple of model.n_kv_head (3)"),
    "zero layers": (["model.n_layer=0"], "model.n_layer must be a positive integer, got 0"),
    "zero iterations": (["train.max_iters=0"], "train.max_iters must be positive, got 0"),
    "negative batch size": (["train.batch_size=-2"], "train.batch_size must be positive, got -2"),
    "zero learning rate": (["train.learning_rate=0"], "train.learning_rate must be positive, got 0"),
    "dropout of 1": (["model.dropout=1.0"], "model.dropout must be in [0, 1), got 1.0"),
    "unknown kernel by key": (["model.attention=fast"],
                              "unknown attention kernel 'fast'; valid: einsum, flex, heads, manual, sdpa"),
    "absent cuda": (["device=cuda"], "device=cuda was asked for but no CUDA GPU is available"),
    "absent mps": (["device=mps"], "device=mps was asked for but MPS is not available here"),
    "fp16 on cpu": (["precision=fp16"], "precision=fp16 needs a CUDA GPU (device is cpu)"),
    "flex training on cpu": (["attention=flex"], "attention=flex cannot train on CPU"),
    "text shorter than a block": (["data.path={root}/short.txt", "data.name=short"], "fewer than block_size + 1"),
    "missing data path": (["data.path={root}/nowhere", "data.name=x"], "data.path '{root}/nowhere' does not exist"),
    "empty folder": (["data.path={root}/empty_dir", "data.name=x"], "no text files found under data.path"),
    "empty file": (["data.path={root}/empty.txt", "data.name=x"], "holds only empty files"),
    "data prepared with another tokenizer": (["data.tokenizer=gpt2"], "was prepared from"),
    "fresh run into an existing run": ([], "already holds a checkpoint"),
    "resume with another model shape": (["resume=true", "model.n_embd=64"], "model.n_embd"),
    "out_dir below a file": (["out_dir={root}/not_a_dir/run"], "not_a_dir, which is a file, not a folder"),
    "a model too large for memory": (
        ["model.n_layer=96", "model.n_embd=16384", "model.n_head=128", "out_dir={root}/big"], "out of memory: 309,"),
    "a batch too large for memory": (["train.batch_size=100000000", "out_dir={root}/big"], "out of memory:"),
    "a misspelt key added with +": (["+train.lerning_rate=0.1"], "unknown config key train.lerning_rate"),
    "a NaN learning rate": (["train.learning_rate=nan"], "train.learning_rate must be positive, got nan"),
    "fsdp without torchrun": (["train.fsdp=true"], "train.fsdp=true shards the model over several processes"),
}


@pytest.mark.parametrize("case", CASES)
def test_train_refuses_with_one_line_and_touches_nothing(existing, case):
    root, run, data = existing
    args, message = CASES[case]
    args = [a.format(root=root) for a in args]
    if "device=cuda" in args and torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present")
    if "device=mps" in args and torch.backends.mps.is_available():
        pytest.skip("MPS is present")
    before = snapshot(root)
    out_dir = [] if any(a.startswith("out_dir=") for a in args) else [f"out_dir={run}"]
    run_as = run_script if case == "n_head does not divide n_embd" else run_inline  # one as a real process
    result = run_as("train", *TINY, "data=text", *data, *out_dir, *args)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("error: ") and message.format(root=root) in result.stderr
    assert untouched(before, root, run)


@pytest.mark.parametrize("override, listed", [("attention=nope", "sdpa"), ("model=nope", "gpt2-xl"),
                                              ("data=nope", "stdlib_char"), ("device=nope", "cpu"),
                                              ("model.n_layers=3", "n_layers")])
def test_unknown_config_names_are_refused_by_hydra_with_the_valid_ones(existing, override, listed):
    root, run, data = existing
    before = snapshot(root)
    result = run_inline("train", *TINY, "data=text", *data, f"out_dir={run}", override)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert listed in result.stderr
    assert untouched(before, root, run)


def test_gpt2_encoding_unreachable_offline(existing, tmp_path):
    root, run, data = existing
    offline = {"TIKTOKEN_CACHE_DIR": str(tmp_path), "HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9"}
    result = run_script("train", *TINY, "data=text", *data, "data.name=bpe", "data.tokenizer=gpt2",
                        f"out_dir={tmp_path / 'run'}", env=offline, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "the GPT-2 encoding (r50k_base) could not be loaded" in result.stderr
    assert "TIKTOKEN_CACHE_DIR" in result.stderr


@pytest.mark.parametrize("args, message", [
    (["max_new_tokens=0"], "max_new_tokens must be positive"),
    (["top_p=1.5"], "top_p must be in (0, 1]"),
    (["temperature=-0.1"], "temperature must be >= 0"),
    (["prompt=QQQ"], "character 'Q' is not in this model's character vocabulary"),
])
def test_generate_refuses_bad_settings(existing, args, message):
    root, run, _ = existing
    before = snapshot(root)
    run_as = run_script if args == ["max_new_tokens=0"] else run_inline  # one as a real process
    result = run_as("generate", f"ckpt={run}", "device=cpu", *args)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.startswith("error: ") and message in result.stderr
    assert untouched(before, root, run)


def test_the_existing_run_still_resumes_after_all_that(existing):
    root, run, data = existing
    result = run_forked("train", *TINY, "train.max_iters=6", "data=text", *data, f"out_dir={run}", "resume=true")
    assert result.returncode == 0, result.stderr
    assert torch.load(run / "ckpt.pt", weights_only=True)["step"] == 6

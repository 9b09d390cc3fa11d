"""Through the real scripts, as a user runs them: prepare, train a tiny model, sample from it. (The runs that only
compare what a script writes with another setting run in a fork of the test: conftest.run_forked.)"""

import pytest
import torch

from conftest import run_forked, run_inline, run_script, write_corpus

pytestmark = pytest.mark.slow

TINY_RUN = ["model=tiny", "train.max_iters=30", "train.eval_interval=15", "train.eval_iters=2",
            "train.batch_size=8", "train.sample_tokens=20", "device=cpu"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e")
    corpus = write_corpus(root / "corpus")
    run_dir = root / "run"
    result = run_script("train", *TINY_RUN, "data=text", f"data.path={corpus}", f"data.root={root / 'data'}",
                        f"out_dir={run_dir}")
    assert result.returncode == 0, result.stderr
    return root, run_dir, result


def test_training_writes_checkpoints_logs_and_a_summary(trained):
    root, run_dir, result = trained
    assert (root / "data" / "text" / "meta.json").exists()
    for name in ("ckpt.pt", "best.pt", ".hydra/config.yaml"):
        assert (run_dir / name).exists(), name
    assert list(run_dir.glob("events.out.tfevents.*"))
    out = result.stdout + result.stderr
    assert "step 30: train loss" in out and "best val loss" in out
    assert f"python scripts/generate.py ckpt={run_dir}" in out


def test_checkpoint_is_plain_tensors_and_values(trained):
    _, run_dir, _ = trained
    ckpt = torch.load(run_dir / "ckpt.pt", weights_only=True)
    assert ckpt["step"] == 30 and ckpt["model_config"]["n_layer"] == 2
    assert ckpt["tokenizer"]["kind"] == "char" and "optimizer" in ckpt
    assert ckpt["config"]["train"]["max_iters"] == 30


def test_tensorboard_has_the_scalars(trained):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _, run_dir, _ = trained
    events = EventAccumulator(str(run_dir))
    events.Reload()
    assert {"train/loss", "val/loss", "lr", "tokens_per_sec"} <= set(events.Tags()["scalars"])


def test_generate_samples_and_another_kernel_gives_the_same_text(trained):
    _, run_dir, _ = trained
    common = [f"ckpt={run_dir}", "prompt=def f1", "max_new_tokens=40", "temperature=0", "device=cpu"]
    sdpa = run_script("generate", *common)
    manual = run_forked("generate", *common, "attention=manual")
    assert sdpa.returncode == 0, sdpa.stderr
    assert sdpa.stdout.startswith("def f1") and len(sdpa.stdout) > 40
    assert manual.stdout == sdpa.stdout
    flex = run_forked("generate", *common, "attention=flex")  # flex samples on CPU (no backward needed)
    assert flex.returncode == 0, flex.stderr
    assert flex.stdout == sdpa.stdout
    sampled = run_forked("generate", f"ckpt={run_dir}", "num_samples=2", "max_new_tokens=10", "seed=3", "top_k=5")
    assert sampled.returncode == 0 and sampled.stdout.count("-" * 40) == 1


def test_prepare_script(tmp_path, text_dir):
    result = run_script("prepare", "data=text", f"data.path={text_dir}", f"data.root={tmp_path}")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "text" / "train_000000.bin").exists() and "ready:" in result.stdout


def test_fine_tuning_starts_from_exported_weights_and_checks_the_tokenizer(trained, tmp_path):
    import re

    root, run_dir, result = trained
    exported = run_script("export", f"ckpt={run_dir / 'ckpt.pt'}", f"out={tmp_path / 'export'}")
    assert exported.returncode == 0, exported.stderr
    data = [f"data.path={root / 'corpus'}", f"data.root={root / 'data'}"]
    tuned = run_script("train", *TINY_RUN, "train.max_iters=2", "data=text", *data, f"init_from={tmp_path / 'export'}",
                       "model.n_layer=7", f"out_dir={tmp_path / 'tuned'}")
    assert tuned.returncode == 0, tuned.stderr
    log = tuned.stdout + tuned.stderr
    final_val = re.findall(r"step 30: train loss [\d.]+, val loss ([\d.]+)", result.stdout + result.stderr)
    assert "step 0: train loss" in log and re.search(rf"step 0: train loss [\d.]+, val loss {final_val[0]}", log)
    assert "2 layers" in log  # the architecture comes from the weights, not model.n_layer=7
    other = tmp_path / "other"
    other.mkdir()
    (other / "t.txt").write_text("a completely different alphabet: QXZ! " * 40)
    refused = run_inline("train", *TINY_RUN, "data=text", f"data.path={other}", "data.name=other",
                         f"data.root={root / 'data'}", f"init_from={run_dir}", f"out_dir={tmp_path / 'refused'}")
    assert refused.returncode == 2 and "uses a different tokenizer" in refused.stderr
    assert "Traceback" not in refused.stderr

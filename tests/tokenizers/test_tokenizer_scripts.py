"""A trained tokenizer through the real scripts, as a user runs them: train it, prepare and train with it, then
resume, generate, evaluate and export with no tokenizer argument; transformers opens the export and continues a
prompt with the same greedy text; resuming with another tokenizer is refused with one line (more refusals:
tests/tokenizers/test_tokenizer_bpe.py). Training the tokenizer and the first training run are processes; the
runs after them, which check what the scripts read and write, run in forks of the test (conftest.run_forked)."""

import json
import shutil
from pathlib import Path

import pytest

from conftest import run_forked, run_inline, run_script

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TINY = ["model=tiny", "train.eval_interval=10", "train.eval_iters=2", "train.batch_size=8", "train.sample_tokens=0",
        "device=cpu"]


def test_train_a_tokenizer_then_use_it_everywhere(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for path in sorted((ROOT / "gpt" / "data").glob("*.py")):
        shutil.copy(path, corpus / path.name)
    tok = tmp_path / "tok"
    trained = run_script("train_tokenizer", "data=text", f"data.path={corpus}", "tokenizer.vocab_size=500",
                         f"out={tok}", "evaluate=false")
    assert trained.returncode == 0, trained.stderr
    assert "learnt 500 tokens" in trained.stdout and (tok / "tokenizer.json").is_file()
    data = ["data=text", f"data.path={corpus}", f"data.root={tmp_path / 'data'}", "data.name=bpe"]
    run = tmp_path / "run"
    first = run_script("train", *TINY, *data, f"data.tokenizer={tok}", "train.max_iters=10", f"out_dir={run}")
    assert first.returncode == 0, first.stderr
    assert "with the 500-token BPE" in first.stdout  # prepared with it
    resumed = run_forked("train", *TINY, *data, "train.max_iters=20", f"out_dir={run}", "resume=true")
    assert resumed.returncode == 0, resumed.stderr
    assert "step 20: train loss" in resumed.stdout + resumed.stderr
    before = (run / "ckpt.pt").read_bytes()
    other = run_inline("train", *TINY, *data, "data.tokenizer=char", "train.max_iters=30", f"out_dir={run}",
                       "resume=true")
    assert other.returncode == 2 and other.stderr.startswith("error: ") and "Traceback" not in other.stderr
    assert "with the 500-token BPE" in other.stderr and "with the char tokenizer" in other.stderr
    assert (run / "ckpt.pt").read_bytes() == before
    generated = run_forked("generate", f"ckpt={run}", "prompt=def main", "max_new_tokens=15", "temperature=0",
                           "device=cpu")
    assert generated.returncode == 0 and generated.stdout.startswith("def main"), generated.stderr
    scored = run_forked("eval", f"ckpt={run}", "device=cpu", f"out={tmp_path / 'eval.json'}")
    assert scored.returncode == 0, scored.stderr
    assert 0 < json.loads((tmp_path / "eval.json").read_text())["bpb"] < 8
    exported = run_forked("export", f"ckpt={run}", f"out={tmp_path / 'export'}")
    assert exported.returncode == 0, exported.stderr
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "export").eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "export")
    ids = tokenizer("def main", return_tensors="pt")
    out = model.generate(**ids, max_new_tokens=15, do_sample=False)
    assert generated.stdout[:-1] == tokenizer.decode(out[0]).split("<|endoftext|>")[0]  # generate.py stops there

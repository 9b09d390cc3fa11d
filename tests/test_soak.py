"""Load and soak: thousands of steps with frequent evaluation and checkpoints, in one process.

Memory must stay flat from evaluation to evaluation (no leak from logging, TensorBoard figures, the
data loader or caches) and the run directory must not fill up with files.

The run has a process of its own, with glibc's mmap threshold fixed at its initial 128 KiB. Left dynamic,
the threshold rises whenever a large block is freed, and later large blocks then come from the heap, which
grows for a thousand steps before it levels off: seen after tests/memory/test_memory.py had freed its tensors, and
in a fresh process whose start-up imports differed. Fixed, every block
of 128 KiB or more is unmapped when freed, so resident memory follows live memory and a leak still shows.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow

SOAK = """
import json, resource, sys
from pathlib import Path
from hydra import compose, initialize_config_dir
from gpt.schema import register, typed
from gpt.train.trainer import train

def rss_mib():
    return int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize() / 2**20

register()
with initialize_config_dir(config_dir=sys.argv[1], version_base=None):
    cfg = compose(config_name="train", overrides=sys.argv[3:])
memory = []

def log(message):
    if message.startswith("step "):
        memory.append(rss_mib())

summary = train(typed(cfg), Path(sys.argv[2]), log=log)
print(json.dumps({"tokens": summary.tokens, "memory": memory}))
"""


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="reads resident memory from /proc (Linux)")
def test_two_thousand_steps_keep_memory_flat_and_files_bounded(text_dir, tmp_path):
    overrides = [
        "model=tiny", "device=cpu", "data=text", f"data.path={text_dir}", f"data.root={tmp_path / 'data'}",
        "train.max_iters=2000", "train.eval_interval=100", "train.eval_iters=1", "train.batch_size=2",
        "train.log_interval=10", "train.sample_tokens=8", f"out_dir={tmp_path / 'run'}",
    ]
    result = subprocess.run([sys.executable, "-c", SOAK, str(ROOT / "configs"), str(tmp_path / "run"), *overrides],
                            capture_output=True, text=True, cwd=ROOT, timeout=240,
                            env={**os.environ, "MALLOC_MMAP_THRESHOLD_": str(128 * 1024)})
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.splitlines()[-1])
    memory = report["memory"]
    assert report["tokens"] > 0 and len(memory) >= 20  # an evaluation and a checkpoint every 100 steps
    settled = memory[len(memory) // 4]  # after the first evaluations have loaded everything lazily
    assert memory[-1] - settled < 25, f"memory grew from {settled:.0f} to {memory[-1]:.0f} MiB: {memory}"
    files = [p for p in (tmp_path / "run").rglob("*") if p.is_file()]
    assert len(files) <= 10, sorted(str(p) for p in files)

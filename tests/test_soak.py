"""Load and soak: thousands of steps with frequent evaluation and checkpoints, in one process.

Memory must stay flat from evaluation to evaluation (no leak from logging, TensorBoard figures, the
data loader or caches) and the run directory must not fill up with files.
"""

import resource
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from gpt.schema import register, typed
from gpt.train.trainer import train

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
pytestmark = pytest.mark.slow


def rss_mib() -> float:
    """Current resident set size of this process, from /proc (Linux); peak RSS elsewhere."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * resource.getpagesize() / 2**20
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def test_two_thousand_steps_keep_memory_flat_and_files_bounded(text_dir, tmp_path):
    register()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        cfg = compose(config_name="train", overrides=[
            "model=tiny", "device=cpu", "data=text", f"data.path={text_dir}", f"data.root={tmp_path / 'data'}",
            "train.max_iters=2000", "train.eval_interval=100", "train.eval_iters=1", "train.batch_size=2",
            "train.log_interval=10", "train.sample_tokens=8", f"out_dir={tmp_path / 'run'}",
        ])
    memory: list[float] = []

    def log(message: str) -> None:
        if message.startswith("step "):
            memory.append(rss_mib())

    summary = train(typed(cfg), tmp_path / "run", log=log)
    assert summary.tokens > 0 and len(memory) >= 20  # an evaluation and a checkpoint every 100 steps
    settled = memory[len(memory) // 4]  # after the first evaluations have loaded everything lazily
    assert memory[-1] - settled < 25, f"memory grew from {settled:.0f} to {memory[-1]:.0f} MiB: {memory}"
    files = [p for p in (tmp_path / "run").rglob("*") if p.is_file()]
    assert len(files) <= 10, sorted(str(p) for p in files)

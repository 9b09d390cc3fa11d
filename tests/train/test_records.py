"""The run's TensorBoard writer: what it loads, and that what it writes reads back."""

from __future__ import annotations

import subprocess
import sys

CHILD = """
import importlib.util, sys
from gpt.train.records import summary_writer
writer = summary_writer(sys.argv[1])
writer.add_scalar("train/loss", 1.5, 3)
writer.close()
loaded = sorted({"boto3", "botocore", "fsspec"} & set(sys.modules))
assert not loaded, f"TensorBoard's writer loaded {loaded}"
for name in ("boto3", "fsspec"):  # left importable for the rest of the process
    if importlib.util.find_spec(name) is not None:
        __import__(name)
print("ok")
"""


def test_the_writer_loads_no_cloud_file_system_and_its_scalars_read_back(tmp_path):
    # a fresh process: another test may already have imported boto3 or fsspec into this one
    done = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [(3, 1.5)]

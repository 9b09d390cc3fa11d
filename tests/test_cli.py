"""The one way an entry script is made (gpt.cli.hydra_entry): what it does to the process around it."""

from __future__ import annotations

import gc
import subprocess
import sys

import pytest

from conftest import ROOT, run_inline


def test_a_script_called_from_python_leaves_the_callers_garbage_collector_alone():
    """main(argv) from a notebook or a test must not freeze the caller's objects (they could never be collected)."""
    before = gc.get_freeze_count()
    done = run_inline("generate", "--cfg", "job")
    assert done.returncode == 0, done.stderr
    assert "ckpt" in done.stdout  # the composed config was printed: main() ran
    assert gc.get_freeze_count() == before


@pytest.mark.slow
def test_a_script_run_as_a_command_ends_without_walking_its_heap():
    """As a command, start-up's objects and, at the end, everything left are frozen: the collections of the run and
    the interpreter's last one skip torch's million objects (about 1 s of each process's exit, docs/benchmarks.md)."""
    probe = ("import atexit, gc, runpy, sys; atexit.register(lambda: print('frozen', gc.get_freeze_count())); "
             "sys.argv = ['scripts/generate.py', '--cfg', 'job']; runpy.run_path(sys.argv[0], run_name='__main__')")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    frozen = int(done.stdout.split("frozen")[-1])
    assert frozen > 100_000, done.stdout  # torch alone leaves several hundred thousand objects

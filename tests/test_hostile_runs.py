"""Issue 46's battery for runs' own files and bounds: the arena's and time-to-loss's records on resume, plans that
cannot finish, folders the arena did not write, adapters on resume, users' design files at every script.

Each case: exit code 2 (130 for Ctrl-C), exactly one `error:` line naming the problem, no traceback, every file
already written byte for byte as it was, no temporary file left. Refusals that need no fresh interpreter call the
script's main() in this process (conftest.run_inline); the cases about signals start a process and are slow.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, run_inline, save_char_model
from gpt.arena import runs as arena_runs
from gpt.interop import formats

QUICK = ["arena.quick=true", "arena.tokens=8192", "arena.eval_tokens=1024", "arena.decode_tokens=8", "device=cpu"]


def snapshot(folder: Path) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


def refused(result, named: str, code: int = 2) -> str:
    """The one error line of a refused command (exit ``code``, no traceback) naming ``named``."""
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == code, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and len(errors) == 1 and named in errors[0], result.stderr[-3000:]
    return errors[0]


def no_temporary_files(folder: Path) -> None:
    left = [p for p in folder.rglob("*") if ".tmp" in p.name or p.name.startswith(".tmp")]
    assert not left, left


# --- class 6: bounds --------------------------------------------------------------------------------------------

def test_an_arena_plan_that_cannot_finish_is_refused_at_once_saying_what_it_costs(tmp_path):
    started = time.perf_counter()
    result = run_inline("arena", "arena.seeds=100000000", "arena.variants=[gpt2,rope]", f"out_dir={tmp_path / 'a'}")
    line = refused(result, "200,000,000 runs (2 variants x 100,000,000 seeds)")
    assert "training tokens" in line and "more than the 1,000 runs" in line
    assert time.perf_counter() - started < 10  # not a plan of a hundred million cells built first
    assert not (tmp_path / "a").exists()


def test_plans_of_more_tokens_or_runs_than_can_finish_are_refused(tmp_path):
    line = refused(run_inline("arena", "arena.tokens=1000000000000000000", f"out_dir={tmp_path / 'a'}"),
                   "7 runs (7 variants x 1 seeds) of 1,000,000,000,000,000,000 tokens")
    assert "more than the 1e+15 training tokens" in line
    seeds = "seeds=[" + ",".join(str(i) for i in range(600)) + "]"
    refused(run_inline("time_to_loss", seeds, f"out_dir={tmp_path / 't'}"),
            "2 recipes x 600 seeds is 1,200 training runs, more than the 1,000")
    refused(run_inline("time_to_loss", "seeds=[3,-1]", f"out_dir={tmp_path / 't'}"),
            "seeds must be in [0, 2**31), got -1")  # at once, not after the runs before it trained
    line = refused(run_inline("arena", "arena.flops=1e40", "arena.variants=[gpt2]", f"out_dir={tmp_path / 'a'}"),
                   "1 runs (1 variants x 1 seeds) of 1e+40 FLOPs = ")  # 8.6e29 steps a run were planned
    assert "training tokens: more than the 1e+15" in line
    refused(run_inline("arena", "arena.timeout_s=1e300", f"out_dir={tmp_path / 'a'}"),
            "arena.timeout_s must be at most 10,000,000 s")  # an OverflowError once the first cell started
    refused(run_inline("time_to_loss", "timeout_s=1e300", f"out_dir={tmp_path / 't'}"),
            "timeout_s must be at most 10,000,000 s")
    assert not (tmp_path / "a").exists() and not (tmp_path / "t").exists()


def test_a_variant_value_of_the_wrong_type_names_the_setting_and_the_value():
    result = run_inline("arena", "arena.variants=['model.dropout=high']", "out_dir=/tmp/never")
    line = refused(result, "model.dropout")
    assert "'high'" in line and "not supported" not in line


# --- class 5: the arena's own files on resume ----------------------------------------------------------------------

def finished_arena(out: Path, data_args: list[str], variants: str = "[gpt2,rope]") -> list[str]:
    """An arena out_dir whose every cell is finished (arena_cell.json as the arena writes it, an arena_result.json
    of plausible figures), reported once by the real script: the arguments that read it back."""
    from hydra import compose, initialize_config_dir

    from conftest import ROOT
    from gpt.arena.arena import plan
    from gpt.schema import register, typed

    args = [*QUICK, f"arena.variants={variants}", f"out_dir={out}", *data_args]
    register()
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base=None):
        cfg = typed(compose(config_name="arena", overrides=args))
    for i, cell in enumerate(plan(cfg)):
        folder = Path(cell.run.out_dir)
        arena_runs.start(folder, cell.run)
        arena_runs.save(folder, {
            "params": 1000 + i, "steps": 4, "tokens": 8192, "val_loss": 2.0 + i, "val_bpb": 3.0 + i,
            "val_tokens": 1024, "tokens_per_s": 5000.0, "peak_mib": 100.0, "kv_bytes_per_token": 512,
            "decode_tok_s": 300.0, "train_s": 2.0,
            "curve": [{"tokens": 2048 * k, "seconds": float(k), "train": float("nan") if k == 0 else 2.5,
                       "val": 2.5 - k / 10} for k in range(3)],
            "attention": [[1.0, 0.0], [0.5, 0.5]]})
    result = run_inline("arena", *args)
    assert result.returncode == 0, result.stderr[-3000:]
    return args


TAMPERED = {  # what a tampered result holds -> what the error names
    "renamed row": ({"group": "gpt2", "variant": "../gpt2"}, "'group' is not a field an arena result holds"),
    "string figure": ({"val_bpb": "3.1"}, "val_bpb is missing or not a number"),
    "huge integer": ({"params": "HUGE"}, "params"),
    "ragged map": ({"attention": [[1.0], [0.5, 0.5]]}, "attention[0] must be 2 weights"),
    "map of text": ({"attention": [["a", "b"], [0.5, 0.5]]}, "attention[0] must be 2 weights"),
    "curve of a number": ({"curve": 7}, "curve must be a non-empty list, got 7"),
    "curve point": ({"curve": [{"tokens": [], "seconds": 1, "train": 1, "val": 1}]}, "curve[0].tokens"),
    "deep nesting": ({"curve": "DEEP"}, "nested"),
    "empty map": ({"attention": []}, "attention must be a non-empty list"),
    "empty curve": ({"curve": []}, "curve must be a non-empty list"),
    "huge map": ({"attention": [[0.5] * 3000] * 3000}, "attention must be at most"),
    "not an object": (None, "must be a JSON object"),
    "negative count": ({"steps": -4}, "steps must be an integer >= 0, got -4"),
    "fractional count": ({"params": 1000.5}, "params must be an integer >= 0, got 1000.5"),
    "negative figure": ({"val_bpb": -3.0}, "val_bpb must be a number >= 0, got -3.0"),
    "map beyond [0, 1]": ({"attention": [[7.0, 0.0], [0.5, 0.5]]}, "attention[0] must be 2 weights in [0, 1]"),
    "curve longer than its run": ({"curve": [{"tokens": 0, "seconds": 0, "train": 1, "val": 1}] * 1000},
                                  "curve holds 1,000 evaluations, more than the"),
}


@pytest.fixture(scope="module")
def arena_out(tmp_path_factory, data_args) -> tuple[Path, list[str]]:
    out = tmp_path_factory.mktemp("arena") / "out"
    return out, finished_arena(out, data_args)


@pytest.mark.parametrize("case", list(TAMPERED))
def test_a_tampered_arena_result_is_refused_and_no_row_is_replaced(arena_out, case):
    out, args = arena_out
    path = out / "rope" / "seed1337" / arena_runs.RESULT_FILE
    original = path.read_bytes()
    change, named = TAMPERED[case]
    text = original.decode()
    if change is None:
        text = "[1, 2]"
    else:
        row = json.loads(text)
        row.update(change)
        text = json.dumps(row)
        text = text.replace('"HUGE"', "9" * 5000).replace('"DEEP"', "[" * 5000 + "]" * 5000)
    before = snapshot(out)
    path.write_text(text)
    try:
        refused(run_inline("arena", *args), named)
        assert snapshot(out) == {**before, str(path): hashlib.sha256(text.encode()).hexdigest()}
        no_temporary_files(out)
    finally:
        path.write_bytes(original)


@pytest.mark.parametrize("content, named", [
    ('{"a": ' * 5000 + "1" + "}" * 5000, "nested"),
    ('{"seed": ' + "7" * 5000 + "}", "5000 digits"),
    ("[1, 2]", "is not a JSON object"),
    ('{"seed": "1337"}', "another configuration"),
], ids=["deep", "huge integer", "array", "wrong type"])
def test_a_tampered_arena_cell_record_is_refused(arena_out, content, named):
    out, args = arena_out
    path = out / "gpt2" / "seed1337" / arena_runs.CELL_FILE
    original = path.read_bytes()
    path.write_text(content)
    before = snapshot(out)
    try:
        refused(run_inline("arena", *args), named)
        assert snapshot(out) == before
    finally:
        path.write_bytes(original)


def test_the_arena_refuses_an_out_dir_whose_folders_hold_a_training_run_it_did_not_write(tmp_path, data_args):
    for inside in ("gpt2", "", "rope/seed1337"):
        out = tmp_path / f"out{len(inside)}"
        (out / inside).mkdir(parents=True)
        save_char_model(out / inside / "ckpt.pt", "ab", n_layer=1, n_head=1, n_embd=8, block_size=8)
        (out / inside / "train.log").write_text("step 0\n")
        before = snapshot(out)
        line = refused(run_inline("arena", *QUICK, "arena.variants=[gpt2,rope]", f"out_dir={out}", *data_args),
                       "that this arena did not start")
        assert str(out / inside).rstrip("/") in line
        assert snapshot(out) == before and not (out / "arena.md").exists()


# --- signals -----------------------------------------------------------------------------------------------------

def start_script(name: str, *args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.Popen:
    """scripts/<name>.py (or ``-m module`` when name starts with -m) in a process of its own, output piped; ``env``
    adds variables."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get(
        "PYTHONPATH", "")]), **(env or {})}
    env.pop("HYDRA_FULL_ERROR", None)
    command = name.split() if name.startswith("-m ") else [str(ROOT / "scripts" / f"{name}.py")]
    return subprocess.Popen([sys.executable, *command, *args], env=env, text=True, cwd=cwd or ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def wait_for_line(proc: subprocess.Popen, text: str, timeout: float = 120) -> str:
    """The output of ``proc`` up to the line holding ``text`` (it must come before ``timeout`` seconds)."""
    seen, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if text in line:
            return "".join(seen)
    proc.kill()
    pytest.fail(f"{text!r} never came; output:\n{''.join(seen)[-3000:]}")


@pytest.mark.slow
def test_sigterm_during_a_long_evaluation_inside_training_stops_it_within_seconds(tmp_path, data_args):
    proc = start_script("train", "model=tiny", *data_args, "device=cpu", f"out_dir={tmp_path / 'run'}",
                        "train.eval_iters=1000000", "train.max_iters=10")  # an evaluation of hours
    wait_for_line(proc, "batch:")  # the step-0 evaluation starts next
    time.sleep(2)
    proc.send_signal(signal.SIGTERM)
    started = time.monotonic()
    out, _ = proc.communicate(timeout=60)
    assert time.monotonic() - started < 30, out
    assert proc.returncode == 0 and "Traceback" not in out and "stopped by SIGTERM after step 0" in out, out
    assert (tmp_path / "run" / "ckpt.pt").is_file()


def test_ctrl_c_mid_write_under_the_trainers_guard_lets_the_checkpoint_finish(tmp_path):
    """The trainer's SignalGuard answers Ctrl-C with "finish this step and save": a Ctrl-C that lands while that
    save is being written must not throw the save away (it did: the writer raised KeyboardInterrupt after writing,
    and the run stopped without its checkpoint or its "stopped by" line). Without a guard, Ctrl-C still stops the
    write and keeps the previous file."""
    from gpt.files import atomic_write
    from gpt.train.signals import SignalGuard

    target = tmp_path / "ckpt.pt"
    target.write_bytes(b"step 10")

    def write(f, data: bytes) -> None:
        f.write(data[:4])
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C lands mid-write
        f.write(data[4:])

    try:
        with SignalGuard(verbose=False) as guard:
            atomic_write(target, lambda f: write(f, b"step 20"), what="checkpoint")
    except KeyboardInterrupt:  # a failure of this test, not a Ctrl-C that ends the test session
        pytest.fail("the Ctrl-C the guard answered threw the save away")
    assert guard.received == "SIGINT" and target.read_bytes() == b"step 20"
    with pytest.raises(KeyboardInterrupt):
        atomic_write(target, lambda f: write(f, b"step 30"), what="checkpoint")
    assert target.read_bytes() == b"step 20" and [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]


def test_ctrl_c_while_consolidate_writes_exits_130_and_leaves_no_partial_file(tmp_path, monkeypatch, capsys):
    import torch
    from test_sharded_checkpoint import write_step

    from gpt import GPT, GPTConfig, files
    from gpt.consolidate import main as consolidate_main
    from gpt.weights import sharded

    monkeypatch.setattr("test_sharded_checkpoint.CONFIG", GPTConfig(n_layer=2, n_head=2, n_embd=256, block_size=8,
                                                                     vocab_size=12))
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=256, block_size=8, vocab_size=12))
    optimizer = torch.optim.AdamW(model.parameters())
    x = torch.randint(0, 12, (2, 8))
    model(x, x)[1].backward()
    optimizer.step()
    run_dir = tmp_path / "run"
    sharded.commit(run_dir, write_step(run_dir, 3, model, optimizer))
    (run_dir / "ckpt.pt").write_bytes(b"an older consolidation")
    before = snapshot(run_dir)

    class CtrlCMidway:  # the file torch.save streams into; Ctrl-C arrives once a megabyte is written
        def __init__(self, f):
            self.f, self.n = f, 0

        def write(self, data):
            self.n += len(data)
            if self.n > 1 << 20 and self.n - len(data) <= 1 << 20:
                os.kill(os.getpid(), signal.SIGINT)
            return self.f.write(data)

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    monkeypatch.setattr(files, "open", lambda path, mode: CtrlCMidway(open(path, mode)), raising=False)
    with pytest.raises(SystemExit) as stop:
        consolidate_main([str(run_dir)])
    err = capsys.readouterr().err
    assert stop.value.code == 130 and "Traceback" not in err and "interrupted (Ctrl-C)" in err, err
    assert snapshot(run_dir) == before
    no_temporary_files(run_dir)


# --- left from rounds 2 and 3: prepared data ------------------------------------------------------------------

@pytest.fixture
def tiny_disk(tmp_path):
    """A 512 KiB file system (tmpfs; needs root), or a skip where it cannot be mounted."""
    folder = tmp_path / "disk"
    folder.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(folder)],
                      capture_output=True).returncode != 0:
        pytest.skip("no tmpfs could be mounted here (needs root): test_a_short_write_... covers the same path")
    yield folder
    subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def big_corpus(folder: Path, files: int = 40) -> Path:
    folder.mkdir(parents=True)
    for i in range(files):
        (folder / f"big{i:02d}.txt").write_text("".join(f"line {i} {j} of some text\n" for j in range(2000)))
    return folder


def check_full_disk_refusal(result, root: Path, before: dict[str, str]) -> None:
    refused(result, "could not write the prepared data")
    assert "is as it was" in result.stderr and "free disk space" in result.stderr
    assert {k: v for k, v in snapshot(root).items() if "/.text.preparing/" not in k} == before
    no_temporary_files(root)
    from gpt.data.loader import TokenData

    assert len(TokenData(root / "text").splits["train"][:100]) == 100  # the old prepared data is still usable


def test_a_full_disk_during_data_rebuild_is_one_error_and_the_old_data_stays_usable(tmp_path, tiny_disk):
    from conftest import write_corpus

    root = tiny_disk / "data"
    args = ["data=text", f"data.root={root}"]
    assert run_inline("prepare", *args, f"data.path={write_corpus(tmp_path / 'small')}").returncode == 0
    before = snapshot(root)
    result = run_inline("prepare", *args, f"data.path={big_corpus(tmp_path / 'big')}", "data.rebuild=true",
                        "data.shard_tokens=100000")
    check_full_disk_refusal(result, root, before)


def test_a_file_size_limit_during_data_rebuild_is_one_error_and_the_old_data_stays_usable(tmp_path):
    """The kernel refuses the write (EFBIG under RLIMIT_FSIZE, as ENOSPC on a full disk; Python ignores SIGXFSZ):
    a real failed write through numpy, where the tmpfs above needs root."""
    import resource

    from conftest import write_corpus

    root = tmp_path / "data"
    args = ["data=text", f"data.root={root}"]
    assert run_inline("prepare", *args, f"data.path={write_corpus(tmp_path / 'small')}").returncode == 0
    before = snapshot(root)
    corpus = big_corpus(tmp_path / "big", 8)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (150_000, hard))  # a 100,000-token shard of uint16 is 200,000 bytes
    try:
        result = run_inline("prepare", *args, f"data.path={corpus}", "data.rebuild=true", "data.shard_tokens=100000")
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    check_full_disk_refusal(result, root, before)


def test_a_short_write_during_data_rebuild_is_one_error_and_the_old_data_stays_usable(tmp_path, monkeypatch):
    from conftest import write_corpus
    from gpt.data import shards

    root = tmp_path / "data"
    args = ["data=text", f"data.root={root}"]
    assert run_inline("prepare", *args, f"data.path={write_corpus(tmp_path / 'small')}").returncode == 0
    before = snapshot(root)
    append = shards.ShardWriter.append

    def disk_fills(self, ids):  # as numpy's tofile reports a full disk: part of the tokens written, then OSError
        append(self, ids[: ids.size // 2])
        raise OSError(f"{ids.size} requested and {ids.size // 2} written")

    monkeypatch.setattr(shards.ShardWriter, "append", disk_fills)
    result = run_inline("prepare", *args, f"data.path={big_corpus(tmp_path / 'big', 4)}", "data.rebuild=true")
    check_full_disk_refusal(result, root, before)


# --- class 4: users' design files at every entry point ----------------------------------------------------------

def run_main(main, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """``main(args)`` in this process with ``env`` added, as run_inline does for scripts/<name>.py."""
    import contextlib
    import io

    out, err, saved = io.StringIO(), io.StringIO(), dict(os.environ)
    os.environ.update(env)
    code = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main(args)
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


BAD_DESIGNS = {
    "registers a name twice": "from gpt.model.design import Design, register\n\n\nclass Mine(Design):\n"
                              "    name = 'mine_twice'\n\n\nregister(Mine())\nregister(Mine())\n",
    "takes a built-in's name": "from gpt.model.design import Design, register\n\n\nclass Rope(Design):\n"
                               "    name = 'rope'\n\n\nregister(Rope())\n",
    "raises on import": "raise RuntimeError('this design is broken')\n",
    "has a syntax error": "from gpt.model.design import Design\n\n\nclass Mine(Design:\n    name = 'mine'\n",
    "calls sys.exit": "import sys\n\nsys.exit(0)\n",  # would end the command silently, exit 0, as if it had worked
}
SAYS = {"registers a name twice": "ValueError: attention design 'mine_twice' is already registered (pass override=True"
                                  " to replace it) (at {path}:9)",  # the user's line, not the registry's
        "takes a built-in's name": "ValueError: attention design 'rope' is already registered (pass override=True "
                                   "to replace it) (at {path}:8)",
        "raises on import": "RuntimeError: this design is broken (at {path}:1)",
        "has a syntax error": "SyntaxError: ",  # the parser's words vary with Python's version
        "calls sys.exit": "it called sys.exit(0) (at {path}:3)"}


@pytest.mark.parametrize("how", ["designs=[...]", "GPT_DESIGNS"])
@pytest.mark.parametrize("case", list(BAD_DESIGNS))
def test_a_design_file_that_fails_on_import_is_one_error_line_at_every_entry_point(tmp_path, case, how):
    from gpt.attention.__main__ import main as design_list
    from gpt.memory.__main__ import main as memory
    from gpt.model import design as registry

    path = tmp_path / "bad_design.py"
    path.write_text(BAD_DESIGNS[case])
    args, env = ([f"designs=[{path}]"], {}) if how == "designs=[...]" else ([], {"GPT_DESIGNS": str(path)})
    known = registry.available()
    entries = {"train": lambda a: run_inline("train", "model=tiny", "device=cpu", f"out_dir={tmp_path / 'run'}", *a,
                                             env=env),
               "memory planner": lambda a: run_main(memory, a, env),
               "arena": lambda a: run_inline("arena", f"out_dir={tmp_path / 'arena'}", *a, env=env),
               "decode benchmark": lambda a: run_inline("bench_decode", *a, env=env)}
    if how == "GPT_DESIGNS":
        entries["design list"] = lambda a: run_main(design_list, a, env)
    for entry, run in entries.items():
        line = refused(run(args), f"designs: importing {path} failed: " + SAYS[case].format(path=path))
        assert case != "has a syntax error" or line.endswith(f"(at {path}:4)"), line  # the user's line, not ours
        assert registry.available() == known, entry  # nothing of the failed file stays registered
    assert not (tmp_path / "run").exists() and not (tmp_path / "arena").exists()


@pytest.mark.slow
@pytest.mark.parametrize("entry", ["bench_interop", "-m gpt.attention", "-m gpt.evaluation.lm_eval_model"])
def test_a_design_file_that_fails_on_import_is_one_error_line_in_a_real_process(tmp_path, entry):
    """The entry points that are not Hydra scripts, as a user starts them (bench_interop printed a traceback)."""
    path = tmp_path / "bad_design.py"
    path.write_text(BAD_DESIGNS["has a syntax error"])
    proc = start_script(entry, env={"GPT_DESIGNS": str(path)})
    out, _ = proc.communicate(timeout=120)
    refused(subprocess.CompletedProcess(entry, proc.returncode, "", out), f"designs: importing {path} failed: Syntax")
    assert list(tmp_path.iterdir()) == [path]


@pytest.mark.slow
def test_lm_evals_command_line_through_this_project_says_a_users_mistake_in_one_line(tmp_path):
    """`python -m gpt.evaluation.lm_eval_model run ...` (docs/evaluation.md): a checkpoint that is not there was
    lm-eval's traceback of our UserError."""
    pytest.importorskip("lm_eval")
    missing = tmp_path / "missing"
    proc = start_script("-m gpt.evaluation.lm_eval_model", "run", "--model", "gpt-attention", "--model_args",
                        f"ckpt={missing}", "--device", "cpu", "--tasks", "hellaswag", cwd=tmp_path)
    out, _ = proc.communicate(timeout=180)
    refused(subprocess.CompletedProcess("lm_eval", proc.returncode, "", out), f"checkpoint {missing} does not exist")
    assert list(tmp_path.iterdir()) == []


# --- class 3: LoRA adapters on resume ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def lora_run(tmp_path_factory) -> tuple[Path, list[str]]:
    """A LoRA chat run of 2 steps (chat.lora_rank=4) and the command-line arguments that resume it."""
    from test_chat_data import CONVERSATIONS, save_base, sft, write_jsonl

    tmp = tmp_path_factory.mktemp("lora")
    save_base(tmp / "base.pt")
    run = sft(tmp, "run", "train.max_iters=2", "chat.lora_rank=4", "train.eval_interval=2")
    data = write_jsonl(tmp / "chat.jsonl", [{"messages": CONVERSATIONS[i % 2]} for i in range(20)])
    args = ["device=cpu", f"chat.data={data}", "train.batch_size=2", f"init_from={tmp / 'base.pt'}",
            "train.eval_iters=1", "train.sample_tokens=0", "train.warmup_iters=0", "train.learning_rate=1e-2",
            "train.schedule=constant", "train.eval_interval=2", f"out_dir={run}", "train.max_iters=4", "resume=true"]
    return run, args


def tampered_adapter(change):
    def tamper(payload):
        key = "transformer.h.0.attn.c_attn.lora_A.default.weight"
        assert key in payload["adapter"], sorted(payload["adapter"])
        change(payload["adapter"], key)
    return tamper


ADAPTER_CASES = {
    "another rank": (None, ["chat.lora_rank=8"], "has shape [4, 32], this run's adapters (chat.lora_rank=8) need"),
    "another shape": (tampered_adapter(lambda a, k: a.__setitem__(k, a[k][:, :5].clone())), ["chat.lora_rank=4"],
                      "has shape [4, 5]"),
    "not a tensor": (tampered_adapter(lambda a, k: a.__setitem__(k, [1.0, 2.0])), ["chat.lora_rank=4"],
                     "is a list, not a floating-point tensor"),
    "integer tensor": (tampered_adapter(lambda a, k: a.__setitem__(k, a[k].long())), ["chat.lora_rank=4"],
                       "is a torch.int64 tensor"),
    "an unknown entry": (tampered_adapter(lambda a, k: a.__setitem__("x.lora_Z", a.pop(k))), ["chat.lora_rank=4"],
                         "holds 'x.lora_Z'"),
    "not a mapping": (lambda payload: payload.__setitem__("adapter", "adapters"), ["chat.lora_rank=4"],
                      "its adapter entry is a str"),
    "a sparse tensor": (tampered_adapter(lambda a, k: a.__setitem__(k, a[k].to_sparse())), ["chat.lora_rank=4"],
                        "is a torch.sparse_coo tensor, not a dense one"),
    "NaN values": (tampered_adapter(lambda a, k: a[k].fill_(float("nan"))), ["chat.lora_rank=4"],
                   "holds NaN or infinite values"),
    "another alpha": (None, ["chat.lora_rank=4", "chat.lora_alpha=77"], "its adapters were trained with "
                      "chat.lora_alpha=16.0"),
    "no adapters asked": (None, ["chat.lora_rank=0"], "trained with LoRA adapters, this run has none"),
    "an optimizer moment of another shape": (
        lambda payload: payload["optimizer"]["state"][0].__setitem__("exp_avg", payload["optimizer"]["state"][0][
            "exp_avg"][:1].clone()), ["chat.lora_rank=4"], "its optimizer's exp_avg of "),
}


@pytest.mark.parametrize("case", list(ADAPTER_CASES))
def test_a_resumed_lora_run_checks_its_adapters_before_loading_them(lora_run, case):
    import torch

    run, args = lora_run
    tamper, extra, named = ADAPTER_CASES[case]
    original = (run / "ckpt.pt").read_bytes()
    try:
        if tamper is not None:
            payload = torch.load(run / "ckpt.pt", weights_only=True)
            tamper(payload)
            torch.save(payload, run / "ckpt.pt")
        before = snapshot(run)
        line = refused(run_inline("train", *args, *extra), named)
        assert str(run / "ckpt.pt") in line and ("adapter" in line or "optimizer" in line)
        assert snapshot(run) == before
        no_temporary_files(run)
    finally:
        (run / "ckpt.pt").write_bytes(original)


@pytest.mark.slow
def test_resuming_a_lora_run_with_another_rank_is_one_error_line_in_a_real_process(lora_run):
    from conftest import run_script

    run, args = lora_run
    before = snapshot(run)
    refused(run_script("train", *args, "chat.lora_rank=8"), f"{run / 'ckpt.pt'}: adapter entry ")
    lock = str(run / ".lock")  # the folder's lock holds the pid of the last process that took it, this one's now
    assert {k: v for k, v in snapshot(run).items() if k != lock} == {k: v for k, v in before.items() if k != lock}
    no_temporary_files(run)


def test_a_lora_runs_adapter_file_given_as_a_model_says_where_the_model_is(lora_run):
    run, _ = lora_run
    before = snapshot(run)
    for script, args in (("generate", ["device=cpu", "max_new_tokens=2"]),
                         ("export", [f"out={run.parent / 'exported'}"])):
        refused(run_inline(script, f"ckpt={run / 'adapter.pt'}", *args),
                f"{run / 'adapter.pt'} holds a LoRA run's adapters alone, not a model")
    assert snapshot(run) == before and not (run.parent / "exported").exists()


# --- class 5 and 6: time to loss -----------------------------------------------------------------------------------

def ttl_record(seed: int = 1) -> dict:
    summary = {"tokens": 30 * 256, "step": 30, "final_val_loss": 2.1, "tokens_per_sec": 5000.0, "wall_s": 9.0,
               "peak_memory_bytes": 2**27}
    return {"recipe": "gpt2", "seed": seed, "launched": 1000.0, "summary": summary,
            "curve": [[10 * i, 1001.0 + i, 3.0 - 0.3 * i] for i in range(4)]}


TTL_TAMPERED = {
    "another run's record": (lambda r: r.update(seed=2), "not this folder's gpt2 seed 1"),
    "a renamed recipe": (lambda r: r.update(recipe="../modern"), "not this folder's gpt2 seed 1"),
    "a string figure": (lambda r: r["summary"].update(step="30"), "summary.step is missing or not a number"),
    "a huge integer": (lambda r: r["summary"].update(tokens="HUGE"), "summary.tokens is missing or not a number, got "
                                                                     "an integer of 5,000 digits"),
    "a ragged curve": (lambda r: r["curve"].append([50, 1005.0]), "curve[4] must be [step, seconds, loss]"),
    "a curve of text": (lambda r: r.update(curve="no"), "curve must be a list"),
    "deep nesting": (lambda r: r.update(curve="DEEP"), "nested"),
    "an unknown field": (lambda r: r.update(extra=1), "'extra' is not a field"),
    "a negative count": (lambda r: r["summary"].update(tokens=-7680), "summary.tokens must be an integer >= 0"),
    "a fractional step": (lambda r: r["summary"].update(step=30.5), "summary.step must be an integer >= 0"),
    "a negative step in the curve": (lambda r: r["curve"].__setitem__(0, [-10, 1001.0, 3.0]),
                                     "curve[0] must be [step, seconds, loss] (a whole step and a loss >= 0)"),
    "a curve longer than its run": (lambda r: r.update(curve=[[0, 1001.0, 3.0]] * 40),
                                    "curve holds 40 evaluations, more than the 31 steps of its run"),
}


@pytest.fixture(scope="module")
def ttl_out(tmp_path_factory) -> Path:
    """A time-to-loss folder (out_dir=ttl, relative) whose one run finished: its record read back and reported."""
    root = tmp_path_factory.mktemp("ttl")
    folder = root / "ttl" / "gpt2-seed1"
    folder.mkdir(parents=True)
    (folder / "time_to_loss.json").write_text(json.dumps(ttl_record()))
    cwd = Path.cwd()
    os.chdir(root)  # out_dir relative to the folder the command runs in
    try:
        assert run_inline("time_to_loss", "recipes=[gpt2]", "seeds=[1]", "out_dir=ttl").returncode == 0
    finally:
        os.chdir(cwd)
    assert "| gpt2 |" in (root / "ttl" / "time_to_loss.md").read_text()
    return root


@pytest.mark.parametrize("case", list(TTL_TAMPERED))
def test_a_tampered_time_to_loss_record_is_refused(ttl_out, monkeypatch, case):
    monkeypatch.chdir(ttl_out)
    path = ttl_out / "ttl" / "gpt2-seed1" / "time_to_loss.json"
    original = path.read_bytes()
    change, named = TTL_TAMPERED[case]
    record = ttl_record()
    change(record)
    text = json.dumps(record).replace('"HUGE"', "9" * 5000).replace('"DEEP"', "[" * 5000 + "]" * 5000)
    path.write_text(text)
    before = snapshot(ttl_out / "ttl")
    try:
        refused(run_inline("time_to_loss", "recipes=[gpt2]", "seeds=[1]", "out_dir=ttl"), named)
        assert snapshot(ttl_out / "ttl") == before
        no_temporary_files(ttl_out / "ttl")
    finally:
        path.write_bytes(original)


@pytest.mark.slow
def test_ctrl_c_during_a_time_to_loss_run_lets_it_save_then_exits_130(tmp_path, data_args):
    """Ctrl-C reaches the benchmark and its training process: the benchmark used to kill that process a quarter of a
    second later (mid-save for a larger model) and, when only the trainer was stopped, recorded its partial run as
    finished. Now it waits for the checkpoint, records nothing, and says so in one line."""
    overrides = ["model=tiny", "device=cpu", "train.max_iters=100000", "train.batch_size=4", "train.eval_iters=1",
                 "train.sample_tokens=0", *data_args]
    out = tmp_path / "ttl"
    listed = "overrides=[" + ",".join(f"'{o}'" for o in overrides) + "]"
    proc = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "time_to_loss.py"), "recipes=[gpt2]", "seeds=[1]",
                             "eval_interval=10", f"out_dir={out}", listed],
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)  # a group of its own, as a terminal's Ctrl-C reaches
    log, deadline = out / "gpt2-seed1" / "train.log", time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline and "step 10:" not in (
            log.read_text() if log.exists() else ""):
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    os.killpg(proc.pid, signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 130 and "Traceback" not in stderr and len(errors) == 1, stderr[-3000:]
    assert "interrupted (Ctrl-C): gpt2-seed1 stopped unfinished" in errors[0] and "same command" in errors[0]
    assert "stopped by SIGINT after step" in log.read_text() and (out / "gpt2-seed1" / "ckpt.pt").is_file()
    assert not (out / "gpt2-seed1" / "time_to_loss.json").exists()  # not a finished run's record
    no_temporary_files(out)


@pytest.mark.slow
def test_time_to_loss_with_a_relative_out_dir_runs_from_another_folder(tmp_path, data_args):
    from conftest import run_script

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    overrides = ["model=tiny", "device=cpu", "train.max_iters=10", "train.batch_size=4", "train.warmup_iters=2",
                 "train.eval_iters=1", "train.sample_tokens=0", *data_args]
    result = run_script("time_to_loss", "recipes=[gpt2]", "seeds=[1]", "eval_interval=5", "out_dir=ttl",
                        "overrides=[" + ",".join(f"'{o}'" for o in overrides) + "]", cwd=elsewhere, timeout=300)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert (elsewhere / "ttl" / "gpt2-seed1" / "time_to_loss.json").is_file()
    assert (elsewhere / "ttl" / "time_to_loss.md").is_file() and not (ROOT / "ttl").exists()


# --- left from rounds 2 and 3: records and names in a corpus ----------------------------------------------------

@pytest.mark.parametrize("value, named", [("9" * 5000, "the 'text' field is a 5,000-digit integer, not text"),
                                          ("[1, 2]", "the 'text' field is list, not text"),
                                          ('{"a": "b"}', "the 'text' field is dict, not text"),
                                          ("true", "the 'text' field is bool, not text")],
                         ids=["huge integer", "list", "object", "bool"])
def test_a_jsonl_record_whose_text_is_not_text_is_refused_naming_file_and_line(tmp_path, value, named):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    lines = [json.dumps({"text": f"document {i} " * 20}) for i in range(30)]
    lines[6] = '{"text": ' + value + "}"
    (corpus / "part.jsonl").write_text("\n".join(lines) + "\n")
    result = run_inline("prepare", "data=files", "data.tokenizer=char", f"data.path={corpus}",
                        f"data.root={tmp_path / 'data'}")
    refused(result, f"{corpus / 'part.jsonl'}:7: {named}")
    assert not any((tmp_path / "data").rglob("*.bin"))


def test_a_conversation_whose_content_is_a_huge_integer_is_a_bad_record(tmp_path):
    from gpt.data.conversations import read_conversations
    from gpt.errors import UserError

    good = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(good).replace('"hello"', "9" * 5000) + "\n")
    with pytest.raises(UserError, match=r"chat.jsonl:2: message 1's content is not text"):
        read_conversations(str(path))
    conversations, skipped = read_conversations(str(path), skip_bad=True)
    assert len(conversations) == 1 and skipped.count == 1


@pytest.mark.slow
def test_a_corpus_with_file_names_that_are_not_utf8_prepares_and_trains_a_tokenizer(tmp_path):
    from conftest import run_script, write_corpus

    corpus = write_corpus(tmp_path / "corpus")
    os.mkdir(os.fsencode(corpus) + b"/sub\xe9")
    with open(os.fsencode(corpus) + b"/sub\xe9/lat\xe9.py", "wb") as f:
        f.write(b"def x():\n    return '\xe9'\n" * 50)  # a latin-1 file under a latin-1 name
    with open(os.fsencode(corpus) + b"/bin\xff.dat", "wb") as f:
        f.write(bytes(range(256)) * 10)  # a binary file, skipped, under a name that is no UTF-8
    result = run_script("prepare", "data=text", f"data.path={corpus}", f"data.root={tmp_path / 'data'}")
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "13 files" in result.stdout or "14 files" in result.stdout, result.stdout
    tokenizer = run_script("train_tokenizer", "data=text", f"data.path={corpus}", f"data.root={tmp_path / 'd2'}",
                           "tokenizer.vocab_size=300", f"out={tmp_path / 'tok'}", "evaluate=false")
    assert tokenizer.returncode == 0 and "Traceback" not in tokenizer.stderr, tokenizer.stderr[-3000:]
    only_binary = tmp_path / "binary"
    only_binary.mkdir()
    with open(os.fsencode(only_binary) + b"/bin\xff.dat", "wb") as f:
        f.write(bytes(range(256)) * 10)
    refused(run_script("prepare", "data=text", f"data.path={only_binary}", f"data.root={tmp_path / 'd3'}"),
            "holds no text: 1 binary file(s) were skipped")


def interrupted_case() -> dict:
    raise KeyboardInterrupt


def test_ctrl_c_inside_an_isolated_case_is_its_result_not_a_traceback(capfd):
    from gpt.bench.isolate import run_isolated

    result = run_isolated(interrupted_case, {}, timeout_s=60)
    assert result == {"error": "interrupted (Ctrl-C)", "stop": True}
    assert "Traceback" not in capfd.readouterr().err


def case_of_minutes() -> dict:
    time.sleep(120)
    return {"slept": 120}


def ctrl_c_then_case_of_minutes() -> dict:
    os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C reaching the case's process (a terminal's reaches the group)
    return case_of_minutes()


@pytest.mark.parametrize("where", ["own process", "this process"])
@pytest.mark.parametrize("when", ["noted before the case started", "inside the case"])
def test_ctrl_c_stops_an_arena_case_under_the_arenas_signal_guard(capfd, when, where):
    """The arena runs each cell under its SignalGuard, which only notes a signal (forked from it on a CPU, in its
    process on one GPU): a cell under that handler ran on for its whole length (hours for a real cell) after a
    Ctrl-C that came before the trainer's own guard or while it was scored."""
    from gpt.bench.isolate import run_here_stoppable, run_isolated
    from gpt.train.signals import SignalGuard

    started = time.monotonic()
    with SignalGuard(verbose=False) as guard:
        if when == "noted before the case started":
            os.kill(os.getpid(), signal.SIGINT)
            assert guard.received == "SIGINT"
        case = case_of_minutes if guard.received else ctrl_c_then_case_of_minutes
        result = run_isolated(case, {}, timeout_s=60) if where == "own process" else run_here_stoppable(case, {})
        assert signal.getsignal(signal.SIGINT) == guard._handle  # the guard's handler is back
    assert result == {"error": "interrupted (Ctrl-C)", "stop": True}
    assert time.monotonic() - started < 30 and "Traceback" not in capfd.readouterr().err


# --- left from rounds 2 and 3: exports ------------------------------------------------------------------------------

def test_a_remote_code_export_declares_its_context_and_generates_past_it(tmp_path):
    transformers = pytest.importorskip("transformers")
    import torch

    from gpt import GPT, GPTConfig
    from gpt.interop import targets as hf_targets
    from gpt.tokenizers.tokenizer import CharTokenizer

    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=12, designs=["qk_norm"])).eval()
    assert hf_targets.choose(model.config) == "remote" and "wpe" in model.transformer  # learned positions
    out = formats.export(model.state_dict(), model.config, CharTokenizer(list("abcdefghijkl")).to_meta(),
                            tmp_path / "exp")
    config = json.loads((out / "config.json").read_text())
    assert config["max_position_embeddings"] == config["n_positions"] == 8
    theirs = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()
    assert theirs.config.max_position_embeddings == 8
    prompt = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        tokens = theirs.generate(prompt, max_new_tokens=20, do_sample=False, pad_token_id=0)
        assert tokens.shape == (1, 23)  # past the context of 8: the window slid, no IndexError
        last = model(tokens[:, -9:-1])[0][0, -1].argmax()  # the native model on the last 8 tokens agrees
        assert tokens[0, -1] == last
        with pytest.raises(ValueError, match="sequence length 9 exceeds the model's context of 8 tokens"):
            theirs(torch.zeros(1, 9, dtype=torch.long))


def test_format_gguf_with_an_out_ending_in_gguf_writes_that_file(tmp_path):
    gguf = pytest.importorskip("gguf")

    save_char_model(tmp_path / "ckpt.pt", "abcdefgh", n_layer=1, n_head=2, n_embd=16, block_size=8)
    out = tmp_path / "models" / "tiny.gguf"
    result = run_inline("export", f"ckpt={tmp_path / 'ckpt.pt'}", "format=gguf", f"out={out}")
    assert result.returncode == 0, result.stderr
    assert out.is_file() and f"wrote {out}" in result.stdout
    assert ".tmp" not in result.stdout + result.stderr  # gguf's writer named its temporary file as if it were out
    assert gguf.GGUFReader(out).fields["general.architecture"].contents() == "gpt2"
    before = out.read_bytes()
    refused(run_inline("export", f"ckpt={tmp_path / 'ckpt.pt'}", "format=gguf", f"out={out}"), "already exists")
    assert out.read_bytes() == before and sorted(p.name for p in out.parent.iterdir()) == ["tiny.gguf"]
    folder = tmp_path / "folder"
    assert run_inline("export", f"ckpt={tmp_path / 'ckpt.pt'}", "format=gguf", f"out={folder}").returncode == 0
    assert (folder / "model-f16.gguf").is_file()  # a folder: model-<gguf_type>.gguf inside, as before


def test_scripts_given_an_export_whose_python_files_are_hostile_never_run_them(tmp_path):
    """An export's modeling and design files, and a file its config.json's auto_map names, would leave a marker if
    imported: generate and export read the folder (its config, weights and tokenizer) and never import them."""
    import torch

    from gpt import GPT, GPTConfig
    from gpt.tokenizers.tokenizer import CharTokenizer

    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=8, designs=["qk_norm"]))
    out = formats.export(model.state_dict(), model.config, CharTokenizer(list("abcdefg\n")).to_meta(),
                         tmp_path / "exp")
    marker = tmp_path / "ran"
    hostile = f"open({str(marker)!r}, 'w').write('ran')\n"
    python_files = sorted(p.name for p in out.glob("*.py"))
    assert "modeling_gpt_attention.py" in python_files and "design_qk_norm.py" in python_files
    for name in [*python_files, "evil.py"]:
        (out / name).write_text(hostile)
    edit = json.loads((out / "config.json").read_text())
    edit["auto_map"] = {"AutoConfig": "evil.Config", "AutoModelForCausalLM": "evil.Model"}
    (out / "config.json").write_text(json.dumps(edit))
    before = snapshot(out)
    generated = run_inline("generate", f"ckpt={out}", "device=cpu", "prompt=abc", "max_new_tokens=4",
                           "num_samples=1", "seed=1")
    assert generated.returncode == 0 and "Traceback" not in generated.stderr, generated.stderr[-3000:]
    exported = run_inline("export", f"ckpt={out}", "format=hf", f"out={tmp_path / 'again'}")
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert not marker.exists() and snapshot(out) == before


class _LeavesMarker:
    """Pickled, it calls os.system: what a hostile checkpoint would run if it were unpickled without weights_only."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_hostile_adapter_or_a_checkpoint_naming_a_design_file_never_runs_code(lora_run, tmp_path):
    import torch

    run, args = lora_run
    marker = tmp_path / "ran"
    original = (run / "ckpt.pt").read_bytes()
    try:
        payload = torch.load(run / "ckpt.pt", weights_only=True)
        payload["adapter"]["transformer.h.0.attn.c_attn.lora_A.default.weight"] = _LeavesMarker(marker)
        torch.save(payload, run / "ckpt.pt")
        refused(run_inline("train", *args, "chat.lora_rank=4"), "holds objects other than tensors")
        assert not marker.exists()
    finally:
        (run / "ckpt.pt").write_bytes(original)
    evil = tmp_path / "evil_design.py"
    evil.write_text(f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n")
    for named in (str(evil), "os", "evil_design"):  # a file, a module, a name: never imported
        payload = torch.load(run / "best.pt", weights_only=True) if (run / "best.pt").exists() else \
            torch.load(run / "ckpt.pt", weights_only=True)
        payload["model_config"]["designs"] = [named]
        torch.save(payload, tmp_path / "named.pt")
        line = refused(run_inline("generate", f"ckpt={tmp_path / 'named.pt'}", "device=cpu", "max_new_tokens=2"),
                       "design")
        assert not marker.exists(), line

"""The battery of damaged, hostile and odd inputs (issue 22, classes 2 to 8), through the real scripts.

Most cases call a script's own main() in this process (scripts/<name>.py, the very code a command runs, minus
the interpreter's start-up): exit code 2, exactly one `error:` line naming the problem, no traceback, every file
already written byte for byte as it was, no temporary file left. The cases that need a process of their own
(signals, a command line as the shell passes it) start one and are marked slow.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import ROOT, run_script, save_char_model
from gpt import GPT, GPTConfig
from gpt.data.config import DataConfig
from gpt.data.prepare import prepare
from gpt.errors import UserError
from gpt.interop import formats, hf
from gpt.tokenizers.tokenizer import CharTokenizer
from gpt.weights import checkpoint
from gpt.weights import load as pretrained

CHARS = "\n abcdefgh"
SIZES = dict(n_layer=1, n_head=2, n_embd=16, block_size=16)
QUIET = dict(log=lambda *_: None)


def script(name: str):
    """scripts/<name>.py's main(argv), loaded as the interpreter would run it (memory: python -m gpt.memory)."""
    if name == "memory":
        from gpt.memory.__main__ import main

        return main
    spec = importlib.util.spec_from_file_location(f"script_{name}", ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def snapshot(folder: Path) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


def one_error(stderr: str, named: str) -> None:
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert "Traceback" not in stderr and len(errors) == 1 and named in errors[0], stderr


def refused_in_process(capsys, name: str, args: list[str], named: str) -> None:
    """scripts/<name>.py with ``args`` exits 2 with one error line naming ``named``."""
    with pytest.raises(SystemExit) as exit_info:
        script(name)(args)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2, err
    one_error(err, named)


def edit_json(path: Path, change) -> Path:
    value = json.loads(path.read_text())
    change(value)
    path.write_text(json.dumps(value))
    return path


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """A model (a run folder's ckpt.pt), its exports in both layouts, data prepared with its vocabulary, and the
    odd files the cases point at. No case may change any of it."""
    root = tmp_path_factory.mktemp("hostile")
    (root / "run").mkdir()
    save_char_model(root / "run" / "ckpt.pt", CHARS, **SIZES)
    config, state, tokenizer = pretrained.load_weights(root / "run")
    for fmt in ("hf", "native"):
        formats.export(state, config, tokenizer, root / fmt, format=fmt)
    rng = random.Random(0)
    (root / "corpus").mkdir()
    for i in range(12):
        (root / "corpus" / f"{i}.txt").write_text("".join(rng.choice(CHARS) for _ in range(600)))
    prepare(DataConfig(name="text", source="path", path=str(root / "corpus"), root=str(root / "data")), **QUIET)
    (root / "afile").write_text("a file, not a folder")
    (root / "binaries").mkdir()
    for i in range(3):
        (root / "binaries" / f"{i}.bin").write_bytes(bytes(range(256)) * 4)
    (root / "folder_run" / checkpoint.LATEST).mkdir(parents=True)
    return root


@pytest.fixture
def untouched(root):
    """Every file of the shared folder byte for byte as it was after the case, and no temporary file anywhere."""
    before = snapshot(root)
    yield
    after = snapshot(root)
    assert after == before
    assert not [p for p in root.rglob("*.tmp")]


def copied(root: Path, name: str, tmp: Path) -> Path:
    return Path(shutil.copytree(root / name, tmp / name))


def sharded_export(root: Path, tmp: Path, shard: str) -> Path:
    """The Hugging Face export as a sharded folder whose index map names ``shard``."""
    folder = copied(root, "hf", tmp)
    names = list(hf.safetensors_torch().load_file(str(folder / hf.WEIGHTS)))
    (folder / hf.WEIGHTS).unlink()
    (folder / hf.INDEX).write_text(json.dumps({"weight_map": {name: shard for name in names}}))
    return folder


def checkpoint_with(root: Path, tmp: Path, change) -> Path:
    payload = torch.load(root / "run" / "ckpt.pt", weights_only=True)
    change(payload)
    torch.save(payload, tmp / "ckpt.pt")
    return tmp / "ckpt.pt"


def hellaswag_line(tmp: Path, **fields) -> Path:
    doc = {"activity_label": "Baking", "ctx_a": "A cook mixes flour.", "ctx_b": "she",
           "endings": ["adds eggs.", "sings.", "sleeps.", "leaves."], "label": 0, **fields}
    (tmp / "hs.jsonl").write_text(json.dumps(doc) + "\n")
    return tmp / "hs.jsonl"


def saved_dataset_reading_elsewhere(tmp: Path) -> Path:
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"text": ["abc"] * 4}).save_to_disk(str(tmp / "other"))
    datasets.Dataset.from_dict({"text": ["abc"] * 4}).save_to_disk(str(tmp / "ds"))
    arrow = next((tmp / "other").glob("*.arrow")).name
    edit_json(tmp / "ds" / "state.json", lambda s: s.update(_data_files=[{"filename": f"../other/{arrow}"}]))
    return tmp / "ds"


def damaged_parquet(tmp: Path) -> Path:
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    path = tmp / "docs.parquet"
    pq.write_table(pa.table({"text": [f"document {i} " * 50 for i in range(4000)]}), path, row_group_size=500)
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 4000] = os.urandom(4000)  # a page in the middle: the footer still reads
    path.write_bytes(bytes(data))
    return path


def truncated_shard(root: Path, tmp: Path, missing: bool = False) -> Path:
    """A sharded step folder of the model whose one .distcp file lost its second half (or, ``missing``, is gone)."""
    import torch.distributed.checkpoint as dcp

    from gpt.weights import sharded

    payload = torch.load(root / "run" / "ckpt.pt", weights_only=True)
    folder = sharded.step_folder(tmp / "run", 2)
    folder.mkdir(parents=True)
    dcp.save({sharded.MODEL_PREFIX + k: v for k, v in payload["model"].items()}, checkpoint_id=str(folder),
             no_dist=True)
    checkpoint.save({k: v for k, v in payload.items() if k != "model"}, folder / sharded.META)
    shard = next(folder.glob("*.distcp"))
    shard.unlink() if missing else os.truncate(shard, shard.stat().st_size // 2)
    return folder


def binary_pointer(tmp: Path) -> Path:
    """A run folder whose sharded checkpoint's ``latest`` pointer holds bytes that are not text."""
    from gpt.weights import sharded

    (tmp / "run" / sharded.ROOT).mkdir(parents=True)
    (tmp / "run" / sharded.ROOT / sharded.POINTER).write_bytes(b"\xff\xfe\x00\x89PNG")
    return tmp / "run"


def jsonl(tmp: Path, *records: dict) -> Path:
    (tmp / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return tmp / "a.jsonl"


def data_args(root: Path, **extra: str) -> list[str]:
    return ["data=text", f"data.path={root / 'corpus'}", f"data.root={root / 'data'}",
            *(f"{k}={v}" for k, v in extra.items())]


TINY_RUN = ["model=tiny", "train.max_iters=2", "train.eval_interval=2", "train.eval_iters=1", "train.batch_size=2",
            "train.sample_tokens=0", "device=cpu"]

def spoiled(root: Path, tmp: Path, name: str, file: str, content: str | bytes) -> Path:
    """A copy of root/<name> whose <file> holds ``content``."""
    folder = copied(root, name, tmp)
    (folder / file).write_bytes(content.encode() if isinstance(content, str) else content)
    return folder


def edited(root: Path, tmp: Path, name: str, file: str, change) -> Path:
    """A copy of root/<name> whose JSON <file> went through ``change``."""
    folder = copied(root, name, tmp)
    edit_json(folder / file, change)
    return folder


def model_config(change):
    return lambda config: change(config["model_config"])


GENERATE = "generate"
HUGE_INTEGER = '{"n_layer": ' + "9" * 5000 + "}"
NOT_UTF8 = b'{"format": "\xff"}'
# case -> (script, args from (root, tmp), what the one error line names)
CASES = {
    # class 2: file contents are data to validate
    "HF config.json naming a billion layers": (
        GENERATE, lambda r, t: [f"ckpt={edited(r, t, 'hf', 'config.json', lambda c: c.update(n_layer=10**9))}"],
        "n_layer must be an integer in [1, 4096], got 1000000000"),
    "native config.json naming a billion layers": (
        GENERATE, lambda r, t: [
            f"ckpt={edited(r, t, 'native', 'config.json', model_config(lambda c: c.update(n_layer=10**9)))}"],
        "n_layer is 1,000,000,000, the weights hold 1 layer"),
    "native config.json with a null width": (
        "export", lambda r, t: [
            f"ckpt={edited(r, t, 'native', 'config.json', model_config(lambda c: c.update(n_embd=None)))}",
            f"out={t / 'out'}"],
        "model_config.n_embd must be an integer, got None"),
    "config.json nested 10,000 deep": (
        GENERATE, lambda r, t: [f"ckpt={spoiled(r, t, 'native', 'config.json', '[' * 10000)}"],
        "config.json: arrays or objects nested too deeply"),
    "config.json with an integer of 5000 digits": (
        GENERATE, lambda r, t: [f"ckpt={spoiled(r, t, 'hf', 'config.json', HUGE_INTEGER)}"],
        "an integer of 5000 digits"),
    "config.json that is not UTF-8": (
        GENERATE, lambda r, t: [f"ckpt={spoiled(r, t, 'native', 'config.json', NOT_UTF8)}"],
        "config.json: not UTF-8 text"),
    "an index map naming a shard outside the folder": (
        GENERATE, lambda r, t: [f"ckpt={sharded_export(r, t, '../elsewhere.safetensors')}"],
        "must name a shard file in the folder, got '../elsewhere.safetensors'"),
    "a checkpoint whose n_layer is 1.7": (
        GENERATE, lambda r, t: [f"ckpt={checkpoint_with(r, t, lambda p: p['model_config'].update(n_layer=1.7))}"],
        "model_config.n_layer must be an integer, got 1.7"),
    "a checkpoint whose bias is a string": (
        "export", lambda r, t: [f"ckpt={checkpoint_with(r, t, lambda p: p['model_config'].update(bias='yes'))}",
                                f"out={t / 'o'}"],
        "model_config.bias must be true or false, got 'yes'"),
    "meta.json with a count of 1.7": (
        "prepare", lambda r, t: [*data_args(r), f"data.root={edited(r, t, 'data', 'text/meta.json', lambda m: m['splits']['train'].update(bytes=1.7))}"],  # noqa: E501
        "splits.train.bytes must be a non-negative integer, got 1.7"),
    "a HellaSwag label of 1.7": (
        "eval", lambda r, t: [f"ckpt={r / 'run'}", "task=hellaswag", f"hellaswag.path={hellaswag_line(t, label=1.7)}"],
        "label 1.7 does not index its 4 endings"),
    "HellaSwag endings given as a string": (
        "eval", lambda r, t: [f"ckpt={r / 'run'}", "task=hellaswag",
                              f"hellaswag.path={hellaswag_line(t, endings='abcd')}"],
        "endings must be a non-empty list, got 'abcd'"),
    "a JSONL text field holding a list": (
        "prepare", lambda r, t: ["data=files", f"data.path={jsonl(t, {'text': ['ab']})}", f"data.root={t}",
                                 "data.tokenizer=char"],
        "the 'text' field is list, not text"),
    "a save_to_disk folder reading another folder's data": (
        "prepare", lambda r, t: ["data=hf", f"data.dataset={saved_dataset_reading_elsewhere(t)}", f"data.root={t}",
                                 "data.tokenizer=char", "data.name=ds"],
        "_data_files[0].filename must name a file or folder inside"),
    # class 3: encodings and damaged binaries
    "a parquet file with a damaged page": (
        "prepare", lambda r, t: ["data=files", f"data.path={damaged_parquet(t)}", f"data.root={t}",
                                 "data.tokenizer=char"],
        "docs.parquet"),
    "a truncated shard of a sharded checkpoint": (
        GENERATE, lambda r, t: [f"ckpt={truncated_shard(r, t)}"], "(truncated)"),
    "a sharded checkpoint missing its shard": (
        GENERATE, lambda r, t: [f"ckpt={truncated_shard(r, t, missing=True)}"], "is missing"),
    "a latest pointer that is not text": (
        GENERATE, lambda r, t: [f"ckpt={binary_pointer(t)}"], "does not name a step folder"),
    "prepared data whose meta.json is not UTF-8": (
        "prepare", lambda r, t: [*data_args(r), f"data.root={spoiled(r, t, 'data', 'text/meta.json', NOT_UTF8)}"],
        "meta.json: not UTF-8 text"),
    # class 4: numeric edges of settings
    "a seed beyond 64 bits": (GENERATE, lambda r, t: [f"ckpt={r / 'run'}", f"seed={2**70}"],
                              "seed=1180591620717411303424 is beyond the range of a 64-bit integer"),
    "max_iters beyond int64": ("train", lambda r, t: [*TINY_RUN, f"train.max_iters={2**64}", f"out_dir={t / 'run'}"],
                               "train.max_iters=18446744073709551616 is beyond the range"),
    "a gpu_memory no float holds": ("memory", lambda r, t: ["gpu_memory=1e400GB"], "is beyond any amount of memory"),
    "a subnormal val_fraction": ("prepare", lambda r, t: [*data_args(r), "data.val_fraction=1e-310"],
                                 "data.val_fraction must be in [1e-06, 1)"),
    # class 5: config errors, the same in every entry point
    "the planner: an unknown group option": ("memory", lambda r, t: ["model=gpt5"], "unknown model=gpt5; valid: gpt2"),
    "the planner: a misspelt key": ("memory", lambda r, t: ["model.n_layers=2"], "unknown config key model.n_layers"),
    "the planner: a value of the wrong type": ("memory", lambda r, t: ["train.batch_size=lots"], "train.batch_size"),
    "the arena: a misspelt key": ("arena", lambda r, t: ["arena.variant=[gpt2]"], "unknown config key arena.variant"),
    "the arena: a variant value that is not YAML": (
        "arena", lambda r, t: ["arena.variants=['model.n_layer=[1']"], "'[1' is not a valid value"),
    "the arena: a variant value of the wrong type": (
        "arena", lambda r, t: ["arena.variants=['model.tie_head=maybe']"], "model.tie_head must be true or false"),
    "the arena: a design's old flat field": (
        "arena", lambda r, t: ["arena.variants=['model.qk_norm=true']"], "model.qk_norm is no longer a setting"),
    "generate: an override Hydra cannot parse": (GENERATE, lambda r, t: [f"ckpt={r / 'run'}", "top_k=[1"],
                                                 "cannot read the override 'top_k=[1'"),
    "eval: an unknown data option": ("eval", lambda r, t: [f"ckpt={r / 'run'}", "data=nope"], "unknown data=nope"),
    # class 7: paths and empty values
    "a picture into a folder": ("visualize_attention", lambda r, t: [f"ckpt={r / 'run'}", f"out={t}"], "is a folder"),
    "a picture with an empty name": ("visualize_attention", lambda r, t: [f"ckpt={r / 'run'}", "out="], "out is empty"),
    "a picture named .png": ("visualize_attention", lambda r, t: [f"ckpt={r / 'run'}", f"out={t / '.png'}"],
                             "out must name a .png file"),
    "a picture without .png": ("visualize_attention", lambda r, t: [f"ckpt={r / 'run'}", f"out={t / 'attention'}"],
                               "out must name a .png file"),
    "a name too long for the file system": (
        "visualize_attention", lambda r, t: [f"ckpt={r / 'run'}", f"out={t / ('a' * 300)}.png"], "more than the 255"),
    "an export below a file": ("export", lambda r, t: [f"ckpt={r / 'run'}", f"out={r / 'afile' / 'x'}"],
                               "which is a file, not a folder"),
    "an export into a file": ("export", lambda r, t: [f"ckpt={r / 'run'}", f"out={r / 'afile'}"],
                              "is a file, not a folder"),
    "an export into the run's own folder": ("export", lambda r, t: [f"ckpt={r / 'run'}", f"out={r / 'run'}"],
                                            "is a training run's folder (it holds ckpt.pt)"),
    "evaluation results into a folder": ("eval", lambda r, t: [f"ckpt={r / 'run'}", f"out={t}/"], "is a folder"),
    "an empty out_dir": ("train", lambda r, t: [*TINY_RUN, "out_dir="], "out_dir is empty"),
    "an empty init_from": ("train", lambda r, t: [*TINY_RUN, "init_from=", f"out_dir={t / 'run'}"],
                           "init_from is empty"),
    "an empty ckpt": (GENERATE, lambda r, t: ["ckpt="], "ckpt is empty"),
    # class 8: left from the last round
    "a ckpt.pt that is a folder": ("train", lambda r, t: [*TINY_RUN, *data_args(r), f"out_dir={r / 'folder_run'}"],
                                   "folder_run/ckpt.pt is a folder, where the run writes its ckpt.pt file"),
    "a data folder of binary files": ("prepare", lambda r, t: ["data=text", f"data.path={r / 'binaries'}",
                                                               f"data.root={t}", "data.name=b"],
                                      "3 binary file(s) were skipped"),
}


@pytest.mark.parametrize("case", CASES)
def test_hostile_and_odd_inputs_get_one_error_line(root, untouched, tmp_path, capsys, case):
    name, make, named = CASES[case]
    refused_in_process(capsys, name, make(root, tmp_path), named)
    assert not [p for p in tmp_path.rglob("*.tmp")]


def test_odd_but_valid_inputs_are_accepted(root, untouched, tmp_path, capsys):
    """A subnormal temperature or top_p samples (the greedy limit, not NaN); lone surrogates in JSONL, a file name
    that is not UTF-8 and a huge integer in a field nobody reads are data, not errors."""
    for setting in ("temperature=1e-310", "top_p=1e-310"):
        script("generate")([f"ckpt={root / 'run'}", setting, "max_new_tokens=8", "device=cpu", "prompt=abc"])
        assert capsys.readouterr().out.startswith("abc")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.jsonl").write_text("".join(json.dumps({"text": f"line {i} \ud800 end", "n": 10**40}) + "\n"
                                            for i in range(40)))
    (corpus / os.fsdecode(b"\xff\xfe.txt")).write_text("text under a name that is not UTF-8\n" * 20)
    with pytest.warns(UserWarning, match="lone surrogates"):
        script("prepare")(["data=files", f"data.path={corpus}", f"data.root={tmp_path}", "data.tokenizer=char"])
    meta = json.loads(next(tmp_path.glob("*/meta.json")).read_text())
    assert "\ufffd" in meta["tokenizer"]["chars"]


def test_rebuilding_over_a_file_that_cannot_be_replaced_keeps_the_old_data(root, tmp_path, monkeypatch):
    """A move that fails half-way through the replacement (a file the system will not rename) puts every file
    back: the old data still opens, byte for byte."""
    from gpt.data import prepare as preparing
    from gpt.data.loader import TokenData

    data = copied(root, "data", tmp_path) / "text"
    before = snapshot(data)
    real_replace = os.replace

    def immutable(source, target):  # as chattr +i makes a file: it cannot be renamed away or replaced
        if Path(source) == data / "val_000000.bin":
            raise PermissionError(1, "Operation not permitted", str(source))
        return real_replace(source, target)

    monkeypatch.setattr(preparing.os, "replace", immutable)
    cfg = DataConfig(name="text", source="path", path=str(root / "corpus"), root=str(tmp_path / "data"),
                     rebuild=True, shard_tokens=1000)
    with pytest.raises(UserError, match="the data that was there is unchanged"):
        prepare(cfg, **QUIET)
    assert snapshot(data) == before
    assert len(TokenData(data).splits["train"]) > 0


def test_a_full_disk_in_tensorboards_thread_is_one_error_without_a_traceback(tmp_path, capsys, monkeypatch):
    """TensorBoard writes from a thread of its own: its full disk is reported once, by the main thread."""
    import errno

    from tensorboard.summary.writer import record_writer

    from gpt.train.records import RunRecords

    records = RunRecords(tmp_path, log=lambda message: None, enabled=True)
    records.open({"seed": 1}, [], resumed=False, step=0, max_iters=10)

    def full(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(record_writer.RecordWriter, "write", full)
    with pytest.raises(UserError, match="could not write TensorBoard events in .*: No space left on device"):
        for step in range(200):  # the thread meets the error; a later call raises it here
            records.scalars(step, {"loss": 1.0})
            time.sleep(0.01)
    records.close()
    assert "Traceback" not in capsys.readouterr().err


@pytest.fixture
def tmpfs(tmp_path):
    """A 512 KiB tmpfs (full after 512 KiB) and a read-only one, where this machine allows mounting (root)."""
    full, read_only = tmp_path / "full", tmp_path / "ro"
    full.mkdir()
    read_only.mkdir()
    mounted = []
    try:
        for folder, options in ((full, "size=512k"), (read_only, "size=64k,ro")):
            result = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)],
                                    capture_output=True, text=True)
            if result.returncode != 0:
                pytest.skip(f"cannot mount a tmpfs here ({result.stderr.strip() or 'not permitted'})")
            mounted.append(folder)
        yield full, read_only
    finally:
        for folder in mounted:
            subprocess.run(["umount", str(folder)], capture_output=True)


def test_full_and_read_only_disks_are_one_error_and_leave_nothing(tmpfs, tmp_path, capsys):
    full, read_only = tmpfs
    save_char_model(tmp_path / "big.pt", CHARS, n_layer=2, n_head=2, n_embd=128, block_size=16)  # ~1.6 MB
    refused_in_process(capsys, "export", [f"ckpt={tmp_path / 'big.pt'}", f"out={full / 'export'}"],
                       "No space left on device")
    assert list(full.iterdir()) == []  # no temporary file, and not the folder the export created
    refused_in_process(capsys, "export", [f"ckpt={tmp_path / 'big.pt'}", f"out={read_only / 'export'}"],
                       "Read-only file system")
    refused_in_process(capsys, "visualize_attention", [f"ckpt={tmp_path / 'big.pt'}", f"out={read_only / 'a.png'}",
                                                       "prompt=abc", "device=cpu"], "Read-only file system")
    started = time.monotonic()  # before any variant trains, not after each one failed
    refused_in_process(capsys, "arena", [f"out_dir={read_only / 'arena'}", "arena.quick=true"],
                       "could not create out_dir")
    assert time.monotonic() - started < 10


# --- in processes of their own: signals, and the command line as a shell passes it --------------------------------

def start(name: str, *args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get(
        "PYTHONPATH", "")])}
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.Popen([sys.executable, str(ROOT / "scripts" / f"{name}.py"), *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def writing_when_stopped(proc: subprocess.Popen, out: Path) -> bool:
    """Stop ``proc`` (SIGSTOP) as soon as an export's temporary files appear in ``out``; True if it stopped while
    still writing them: config.json is written last, so no temporary config.json means no rename has begun."""
    deadline = time.monotonic() + 120
    while not list(out.glob(".*.tmp")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.002)
    proc.send_signal(signal.SIGSTOP)
    time.sleep(0.05)  # the stop takes effect
    return proc.poll() is None and bool(list(out.glob(".*.tmp"))) and not list(out.glob(".config.json.*.tmp"))


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_export_cut_short_leaves_the_previous_export_and_no_temporary_file(tmp_path, sig):
    torch.manual_seed(0)
    config = GPTConfig(**{**SIZES, "n_layer": 6, "n_embd": 384, "vocab_size": len(CHARS)})  # ~42 MB of weights
    tokenizer = CharTokenizer(list(CHARS)).to_meta()
    first, second = ({"model": GPT(config).state_dict(), "model_config": config.to_dict(), "tokenizer": tokenizer}
                     for _ in range(2))
    checkpoint.save(second, tmp_path / "second.pt")
    out = formats.export(first["model"], config, tokenizer, tmp_path / "export")
    before = snapshot(out)
    for _ in range(5):  # until the signal lands while the files are written (a loaded machine can miss the moment)
        proc = start("export", f"ckpt={tmp_path / 'second.pt'}", f"out={out}", "overwrite=true")
        if writing_when_stopped(proc, out):
            break
        proc.send_signal(signal.SIGCONT)
        assert proc.wait(timeout=120) == 0 and proc.communicate() and not list(out.glob(".*"))
        formats.export(first["model"], config, tokenizer, out)  # the first export again, for the next try
    else:
        pytest.fail("the export was never caught writing its files in five tries")
    proc.send_signal(sig)  # held until SIGCONT: it lands while the weights or the first text files are written
    proc.send_signal(signal.SIGCONT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    one_error(stderr, f"interrupted ({'Ctrl-C' if sig == signal.SIGINT else 'SIGTERM'})")
    assert snapshot(out) == before and not list(out.glob(".*"))


@pytest.mark.slow
def test_sigterm_stops_a_long_evaluation_within_seconds(root, tmp_path):
    save_char_model(tmp_path / "big.pt", CHARS, n_layer=8, n_head=8, n_embd=512, block_size=16)
    proc = start("eval", f"ckpt={tmp_path / 'big.pt'}", f"data_dir={root / 'data' / 'text'}", "split=train",
                 "batch_size=1", "device=cpu")
    time.sleep(8)  # loading, then the pass over every window: minutes
    assert proc.poll() is None, proc.communicate()
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=60)
    assert time.monotonic() - sent < 10
    assert proc.returncode in (130, -signal.SIGTERM), stderr  # -15: it was still starting, before any handler
    assert "Traceback" not in stderr


@pytest.mark.slow
def test_config_errors_are_one_line_from_a_shell_too(tmp_path):
    """The command lines as a shell passes them: Hydra's own reports (several lines, exit 1) are one line, exit 2."""
    result = run_script("train", "model=nope", f"out_dir={tmp_path / 'run'}")
    assert result.returncode == 2
    one_error(result.stderr, "unknown model=nope; valid: gpt2, gpt2-large, gpt2-medium, gpt2-xl, small, tiny")
    memory = subprocess.run([sys.executable, "-m", "gpt.memory", "model.n_layers=3"], cwd=ROOT, capture_output=True,
                            text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert memory.returncode == 2
    one_error(memory.stderr, "unknown config key model.n_layers; valid keys of model: n_layer")
    assert not (tmp_path / "run").exists()

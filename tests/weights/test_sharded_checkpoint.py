"""Reading sharded checkpoints (gpt.weights.sharded) in one process: whole tensors back, the commit pointer,
the latest of two kinds, consolidation, and refusals of damaged or foreign folders. Written here without a
process group (DCP's single-process mode); tests/train/test_fsdp.py writes them with FSDP under torchrun."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from conftest import ROOT, dotted_global_pickle, failure_output, run_forked
from gpt import GPT, GPTConfig
from gpt.errors import UserError
from gpt.tokenizers.tokenizer import CharTokenizer
from gpt.weights import checkpoint, sharded
from gpt.weights.consolidate import consolidate
from gpt.weights.load import load_model

CONFIG = GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=12)
TOKENIZER = CharTokenizer(list("abcdefghijkl")).to_meta()


def write_step(run_dir: Path, step: int, model: GPT, optimizer: torch.optim.Optimizer) -> Path:
    """A step folder as a training run writes it (tensors through DCP, meta.pt beside them), not yet committed."""
    folder = sharded.step_folder(run_dir, step)
    folder.mkdir(parents=True)
    tensors = {sharded.MODEL_PREFIX + k: v for k, v in model.state_dict().items()}
    names = {id(p): n for n, p in model.named_parameters()}
    for p, state in optimizer.state.items():
        tensors.update({f"{sharded.OPTIM_PREFIX}{names[id(p)]}.{k}": v for k, v in state.items()})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.save(tensors, checkpoint_id=str(folder), no_dist=True)
    groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": [names[id(p)] for p in g["params"]]}
              for g in optimizer.param_groups]
    checkpoint.save({"model_config": CONFIG.to_dict(), "tokenizer": TOKENIZER, "step": step,
                     "optimizer": {"state": {}, "param_groups": groups}}, folder / sharded.META)
    return folder


@pytest.fixture
def trained(tmp_path: Path) -> tuple[Path, GPT, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = GPT(CONFIG)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randint(0, 12, (2, 8))
    model(x, x)[1].backward()
    optimizer.step()
    return tmp_path / "run", model, optimizer


def test_a_committed_step_reads_back_whole_and_only_the_committed_one_counts(trained):
    run_dir, model, optimizer = trained
    assert sharded.committed(run_dir) is None and checkpoint.latest(run_dir) is None
    first = write_step(run_dir, 3, model, optimizer)
    assert sharded.committed(run_dir) is None  # written but not committed: not a checkpoint yet
    sharded.commit(run_dir, first)
    abandoned = write_step(run_dir, 6, model, optimizer)  # a later save cut short before its commit
    assert checkpoint.latest(run_dir) == first and checkpoint.resolve(run_dir) == first
    payload = checkpoint.load(checkpoint.resolve(run_dir / sharded.ROOT))
    for name, tensor in model.state_dict().items():
        assert torch.equal(payload["model"][name], tensor), name
    full = sharded.load_full(first, optimizer=True)
    names = {id(p): n for n, p in model.named_parameters()}
    for p, state in optimizer.state.items():
        for key, tensor in state.items():
            assert torch.equal(full["optimizer"]["state"][names[id(p)]][key], tensor)
    sharded.remove_uncommitted(run_dir)
    assert not abandoned.exists() and first.exists()
    loaded, _ = load_model(run_dir)
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in model.state_dict().items())


def test_the_latest_of_a_single_file_and_a_sharded_folder_is_the_one_written_last(trained):
    run_dir, model, optimizer = trained
    sharded.commit(run_dir, write_step(run_dir, 3, model, optimizer))
    out = consolidate(run_dir)
    assert out == run_dir / checkpoint.LATEST and checkpoint.latest(run_dir) == out
    single = torch.load(out, weights_only=True)
    assert single["step"] == 3 and single["optimizer"]["param_groups"][0]["params"][0] == "transformer.wte.weight"
    pointer = run_dir / sharded.ROOT / sharded.POINTER
    os.utime(pointer, (out.stat().st_mtime + 5,) * 2)  # the sharded one written after (an FSDP run resumed it)
    assert checkpoint.latest(run_dir) == sharded.committed(run_dir)


def test_metadata_that_names_foreign_code_is_refused_before_dcp_unpickles_it(trained):
    run_dir, model, optimizer = trained
    folder = write_step(run_dir, 3, model, optimizer)
    (folder / ".metadata").write_bytes(pickle.dumps(os.system))  # what a crafted folder could hold
    with pytest.raises(UserError, match="holds objects other than DCP's metadata .*posix.system"):
        sharded.load_full(folder)
    (folder / ".metadata").write_bytes(b"\x80\x04garbage")
    with pytest.raises(UserError, match="is not readable DCP metadata"):
        sharded.load_full(folder)


def test_a_pointer_to_a_missing_step_and_a_run_without_shards_get_their_messages(trained):
    run_dir, model, optimizer = trained
    with pytest.raises(UserError, match="holds no committed sharded checkpoint"):
        consolidate(run_dir)
    folder = write_step(run_dir, 3, model, optimizer)
    sharded.commit(run_dir, folder)
    (folder / sharded.META).unlink()
    with pytest.raises(UserError, match="names step-00000003, which is incomplete or missing"):
        checkpoint.resolve(run_dir)


# Hostile folders through every door that reads one: nothing in a file may run, and each gets one clear line.

@pytest.fixture
def hostile(trained) -> tuple[Path, Path, Path]:
    """A committed step folder whose .metadata would create ``marker`` if unpickled plainly."""
    run_dir, model, optimizer = trained
    folder = write_step(run_dir, 3, model, optimizer)
    sharded.commit(run_dir, folder)
    marker = run_dir.parent / "pwned"
    (folder / ".metadata").write_bytes(
        dotted_global_pickle("torch.distributed.checkpoint.metadata", "os.mkdir", str(marker)))
    return run_dir, folder, marker


def test_the_hostile_pickle_would_run_code_if_unpickled_plainly(hostile):
    _, folder, marker = hostile
    pickle.loads((folder / ".metadata").read_bytes())  # what DCP's own reader does: the attack is real
    assert marker.is_dir()


def test_a_dotted_name_inside_an_allowed_module_is_refused_in_process(hostile):
    run_dir, folder, marker = hostile
    for door in (lambda: sharded.load_full(folder), lambda: consolidate(run_dir),
                 lambda: checkpoint.load(checkpoint.resolve(run_dir / sharded.ROOT)), lambda: load_model(run_dir)):
        with pytest.raises(UserError, match=r"holds objects other than DCP's metadata .*os\.mkdir"):
            door()
    assert not marker.exists()


def test_the_fsdp_resume_reads_metadata_through_the_same_check(hostile):
    from gpt.train import parallelize

    run_dir, folder, marker = hostile
    model = GPT(CONFIG)
    optimizer = torch.optim.AdamW(model.parameters())
    with pytest.raises(UserError, match="holds objects other than DCP's metadata"):
        parallelize.load_sharded(model, optimizer, str(folder), optimizer.state_dict()["param_groups"])
    assert not marker.exists()


class Payload:
    """Unpickling this calls os.mkdir(marker)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def test_a_non_tensor_entry_is_refused_before_dcp_would_unpickle_it(trained):
    """DCP stores non-tensors as pickled bytes and loads them with weights_only=False: such an entry in place of a
    weight would run code on an FSDP resume, so metadata with any non-tensor entry is refused."""
    from gpt.train import parallelize

    run_dir, model, optimizer = trained
    folder = write_step(run_dir, 3, model, optimizer)  # then its tensors written again, one replaced
    marker = run_dir.parent / "pwned"
    tensors = {sharded.MODEL_PREFIX + k: v for k, v in model.state_dict().items()}
    tensors[sharded.MODEL_PREFIX + "lm_head.weight"] = Payload(str(marker))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.save(tensors, checkpoint_id=str(folder), no_dist=True)
    for door in (lambda: sharded.load_full(folder),
                 lambda: parallelize.load_sharded(GPT(CONFIG), optimizer, str(folder), [])):
        with pytest.raises(UserError, match=r"holds objects other than DCP.s metadata .*BytesStorageMetadata"):
            door()
    assert not marker.exists()


def test_shard_paths_outside_the_step_folder_and_odd_pointers_are_refused(trained):
    run_dir, model, optimizer = trained
    folder = write_step(run_dir, 3, model, optimizer)
    metadata = sharded.read_metadata(folder)
    for info in metadata.storage_data.values():
        info.relative_path = "../../elsewhere.distcp"
    (folder / ".metadata").write_bytes(pickle.dumps(metadata))
    with pytest.raises(UserError, match="shard path '../../elsewhere.distcp' is not a .distcp file inside"):
        sharded.load_full(folder)
    pointer = run_dir / sharded.ROOT / sharded.POINTER
    for content in (b"../../elsewhere", b"\xff\xfe\x00binary", b""):
        pointer.write_bytes(content)
        with pytest.raises(UserError, match="does not name a step folder"):
            checkpoint.resolve(run_dir)


@pytest.mark.slow
@pytest.mark.parametrize("door", ["consolidate", "generate", "resume"])
def test_every_script_refuses_a_hostile_sharded_checkpoint_in_one_line(hostile, door, data_args):
    run_dir, _, marker = hostile
    if door == "consolidate":
        result = subprocess.run([sys.executable, "-m", "gpt.consolidate", str(run_dir)], cwd=ROOT,
                                capture_output=True, text=True, timeout=120)
    elif door == "generate":  # the scripts' doors in forks: apart from this process, without a start-up
        result = run_forked("generate", f"ckpt={run_dir / sharded.ROOT}", "device=cpu")
    else:
        result = run_forked("train", "model=tiny", f"out_dir={run_dir}", "resume=true", "device=cpu",
                            "train.max_iters=4", *data_args)
    assert result.returncode == 2, failure_output(result)
    assert "holds objects other than DCP's metadata" in result.stderr and "Traceback" not in result.stderr
    assert not marker.exists()

"""Reading sharded checkpoints (gpt.sharded_checkpoint) in one process: whole tensors back, the commit pointer,
the latest of two kinds, consolidation, and refusals of damaged or foreign folders. Written here without a
process group (DCP's single-process mode); tests/test_fsdp.py writes them with FSDP under torchrun."""

from __future__ import annotations

import os
import pickle
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from gpt import GPT, GPTConfig, checkpoint
from gpt import sharded_checkpoint as sharded
from gpt.consolidate import consolidate
from gpt.errors import UserError
from gpt.pretrained import load_model
from gpt.tokenizer import CharTokenizer

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

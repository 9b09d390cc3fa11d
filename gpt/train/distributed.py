"""Data parallelism through torchrun: process-group setup, rank helpers, and agreement between ranks.

torchrun sets RANK, LOCAL_RANK and WORLD_SIZE for every process it starts (and MASTER_ADDR/PORT or its
rendezvous for the process group). Without them this is a single process and every helper is a no-op.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from gpt.errors import UserError


class AbortRun(UserError):
    """A stop that every rank has agreed on: rank 0 reports it as a user error, the others exit quietly."""


@dataclass(frozen=True)
class Ranks:
    """Where this process stands among the processes (ranks) of a run."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the only process that logs and writes files."""
        return self.rank == 0


def env_rank() -> int:
    """This process's global rank as torchrun announced it (0 when not launched by torchrun)."""
    return int(os.environ.get("RANK", "0"))


def env_world_size() -> int:
    """How many processes torchrun started (1 when not launched by torchrun): the one reader of WORLD_SIZE."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def env_local_world_size() -> int:
    """How many of them run on this node (torchrun's LOCAL_WORLD_SIZE; the whole world when it is not set)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", env_world_size()))


def hydra_overrides_for_rank() -> list[str]:
    """Extra Hydra overrides for ranks > 0, so that they create no run directory, config copy or log file.

    Every rank composes the same config, but ``${now:...}`` in out_dir may differ between them by a second;
    rank 0's run directory is the one all ranks use (gpt.train.trainer broadcasts it).
    """
    if env_rank() == 0:
        return []
    return ["hydra.output_subdir=null", "hydra.run.dir=.", "hydra/job_logging=disabled", "hydra/hydra_logging=disabled"]


def setup(device: torch.device) -> tuple[Ranks, torch.device]:
    """Join the process group when launched by torchrun: NCCL on CUDA (one GPU per local rank), gloo on CPU."""
    world_size = env_world_size()
    if world_size == 1:
        return Ranks(), device
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if device.type == "cuda":
        if local_rank >= torch.cuda.device_count():
            raise UserError(
                f"local rank {local_rank} has no GPU ({torch.cuda.device_count()} visible)",
                hint="start at most one process per GPU: torchrun --nproc_per_node=<number of GPUs>",
            )
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    elif device.type == "cpu":
        backend = "gloo"
    else:
        raise UserError(f"distributed training runs on CUDA (nccl) or CPU (gloo), not {device.type}",
                        hint="use device=cuda or device=cpu with torchrun")
    if not dist.is_initialized():  # joined once per process: it lives until the process ends (see run_worker)
        dist.init_process_group(backend=backend)
    return Ranks(rank=rank, local_rank=local_rank, world_size=world_size), device


def run_worker(entry: Callable[[], Any]) -> NoReturn:
    """Run a torchrun worker's entry point, then end the process with its exit status and no teardown.

    torch 2.13's gloo backend can deadlock when its process group is destroyed: the destructor, holding the
    GIL, waits for a gloo thread that needs the GIL to free the tensors of the last collective (seen here in
    2 of 28 two-process CPU runs, which then never exited). So a worker never destroys the group: once
    its output is flushed it leaves the group, its sockets and its threads to the operating system. Nothing
    is lost: every file this project writes is complete and synced before it is renamed into place.
    """
    code: int = 0
    try:
        entry()
    except SystemExit as err:
        if isinstance(err.code, str):
            print(err.code, file=sys.stderr)
        code = err.code if isinstance(err.code, int) else int(err.code is not None)
    except BaseException:  # a bug: its traceback, as the interpreter would print it
        import traceback

        traceback.print_exc()
        code = 1
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def on_main(fn: Callable[[], Any], ranks: Ranks) -> Any:
    """Rank 0's result of ``fn`` (run there alone), on every rank; a UserError there stops every rank alike (an
    AbortRun raised on each). The broadcast is also a barrier."""
    result = None
    if ranks.is_main:
        try:
            result = fn()
        except UserError as err:
            result = AbortRun(str(err), err.hint)
    result = broadcast(result, ranks)
    if isinstance(result, AbortRun):
        raise result
    return result


def barrier(ranks: Ranks) -> None:
    if ranks.enabled:
        dist.barrier()


def all_reduce_sum(tensor: torch.Tensor, ranks: Ranks) -> torch.Tensor:
    """Sum a tensor over ranks, in place (unchanged in a single process)."""
    if ranks.enabled:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def broadcast(obj: Any, ranks: Ranks) -> Any:
    """Rank 0's object, on every rank (pickled in memory: only between our own processes)."""
    if not ranks.enabled:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather(obj: Any, ranks: Ranks) -> list[Any]:
    """Every rank's object, in rank order, on every rank."""
    if not ranks.enabled:
        return [obj]
    out: list[Any] = [None] * ranks.world_size
    dist.all_gather_object(out, obj)
    return out

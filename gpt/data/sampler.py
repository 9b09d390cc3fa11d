"""Which training windows each rank reads, step after step: a component whose state a checkpoint saves and restores.

Every rank runs the same sampler; at each micro-step the world draws world_size batches in a fixed order
and rank r keeps the r-th, so ranks read disjoint windows and a resumed run continues the exact order.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import torch

from gpt.data.loader import TokenData
from gpt.errors import UserError


class Sampler(Protocol):
    kind: str

    def next(self) -> list[int]: ...  # this rank's window starts for one micro-batch

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class RandomSampler:
    """data.sampling=random: windows at uniformly random offsets, drawn with replacement from one seeded generator."""

    kind = "random"

    def __init__(self, data: TokenData, batch_size: int, block_size: int, seed: int, rank: int = 0,
                 world_size: int = 1, split: str = "train") -> None:
        self.data, self.split, self.batch_size, self.block_size = data, split, batch_size, block_size
        self.rank, self.world_size = rank, world_size
        self.generator = torch.Generator().manual_seed(seed)

    def next(self) -> list[int]:
        mine: list[int] = []
        for slot in range(self.world_size):  # every rank draws every slot, so the generator stays in step
            starts = self.data.random_starts(self.split, self.batch_size, self.block_size, self.generator)
            if slot == self.rank:
                mine = starts
        return mine

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "train_generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_kind(state.get("kind", "random"), self.kind)  # checkpoints before samplers hold only the generator
        self.generator.set_state(state["train_generator"])


class EpochSampler:
    """data.sampling=epoch: the split cut into consecutive windows, each read once per epoch, in an order
    shuffled afresh every epoch from (seed, epoch). Window i starts at i * block_size."""

    kind = "epoch"

    def __init__(self, data: TokenData, batch_size: int, block_size: int, seed: int, rank: int = 0,
                 world_size: int = 1, split: str = "train") -> None:
        self.batch_size, self.block_size, self.seed = batch_size, block_size, seed
        self.rank, self.world_size = rank, world_size
        self.windows = (len(data.splits[split]) - 1) // block_size  # windows of block_size + 1 tokens
        self.position = 0  # windows handed out so far, by all ranks together, over all epochs
        self._order: tuple[int, np.ndarray] | None = None

    @property
    def epoch(self) -> int:
        return self.position // self.windows

    def order(self, epoch: int) -> np.ndarray:
        """The shuffled window indices of ``epoch`` (cached: one epoch's permutation at a time)."""
        if self._order is None or self._order[0] != epoch:
            seed = int(np.random.SeedSequence([self.seed, epoch]).generate_state(1, np.uint64)[0])
            self._order = (epoch, torch.randperm(self.windows, generator=torch.Generator().manual_seed(seed)).numpy())
        return self._order[1]

    def next(self) -> list[int]:
        first = self.position + self.rank * self.batch_size
        mine = [int(self.order(i // self.windows)[i % self.windows]) * self.block_size
                for i in range(first, first + self.batch_size)]
        self.position += self.world_size * self.batch_size
        return mine

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "seed": self.seed, "position": self.position, "windows": self.windows}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_kind(state.get("kind", "random"), self.kind)
        if state["windows"] != self.windows:
            raise UserError(f"the checkpoint's epochs have {state['windows']} windows, this data and block size "
                            f"give {self.windows}", hint="resume with the data and model.block_size of the run")
        self.seed, self.position, self._order = int(state["seed"]), int(state["position"]), None


class Lookahead:
    """A sampler that can draw one micro-batch ahead (``ahead``), so the training loop reads the next windows while
    the device still computes; the next ``next()`` hands that draw out. Its state is the wrapped sampler's before a
    draw not yet handed out, so a checkpoint taken with one pending resumes exactly where the run stood."""

    def __init__(self, sampler: Sampler) -> None:
        self.sampler = sampler
        self.pending: tuple[dict[str, Any], list[int]] | None = None  # (state before the draw, its starts)

    @property
    def kind(self) -> str:
        return self.sampler.kind

    def next(self) -> list[int]:
        if self.pending is None:
            return self.sampler.next()
        starts, self.pending = self.pending[1], None
        return starts

    def ahead(self) -> list[int]:
        """Draw the next micro-batch's starts now (the following next() returns them); at most one ahead."""
        if self.pending is None:
            self.pending = (self.sampler.state_dict(), self.sampler.next())
        return self.pending[1]

    def state_dict(self) -> dict[str, Any]:
        return self.pending[0] if self.pending is not None else self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pending = None
        self.sampler.load_state_dict(state)


SAMPLERS = {"random": RandomSampler, "epoch": EpochSampler}


def check_kind(saved: str, mine: str) -> None:
    if saved != mine:
        raise UserError(f"the checkpoint was written with data.sampling={saved}, this run has data.sampling={mine}",
                        hint=f"resume with data.sampling={saved}")


def make_sampler(kind: str, data: TokenData, batch_size: int, block_size: int, seed: int, rank: int = 0,
                 world_size: int = 1) -> Lookahead:
    """The training sampler for data.sampling=``kind``, seeded like the run, able to draw one batch ahead."""
    return Lookahead(SAMPLERS[kind](data, batch_size, block_size, seed, rank, world_size))

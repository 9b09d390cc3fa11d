"""A synthetic instruction set, built at run time from a seed: reverse, sort or count the letters of a short word,
or add two numbers, each asked in several phrasings. Each item has one exact answer, so a model's skill is exact
match on held-out items (words and sums never seen in training)."""

from __future__ import annotations

import random
from dataclasses import dataclass

LETTERS = "abcdefghijklmnopqrstuvwxyz"
PHRASINGS = {
    "reverse": ("Reverse {w}.", "Write {w} backwards.", "What is {w} reversed?", "Spell {w} from the end."),
    "sort": ("Sort the letters of {w}.", "Put the letters of {w} in alphabetical order.", "Sort {w}."),
    "count": ("How many letters are in {w}?", "Count the letters of {w}.", "What is the length of {w}?"),
    "add": ("What is {a}+{b}?", "Add {a} and {b}.", "Compute {a} plus {b}.", "{a}+{b}=?"),
}


@dataclass(frozen=True)
class Item:
    task: str
    key: str  # the word, or the two numbers: what held-out items never share with training ones
    prompt: str
    answer: str

    def messages(self) -> list[dict[str, str]]:
        return [{"role": "user", "content": self.prompt}, {"role": "assistant", "content": self.answer}]


def item(task: str, rng: random.Random) -> Item:
    phrasing = rng.choice(PHRASINGS[task])
    if task == "add":
        a, b = rng.randrange(50), rng.randrange(50)
        return Item(task, f"{a}+{b}", phrasing.format(a=a, b=b), str(a + b))
    word = "".join(rng.choice(LETTERS) for _ in range(rng.randint(3, 5)))
    answer = {"reverse": word[::-1], "sort": "".join(sorted(word)), "count": str(len(word))}[task]
    return Item(task, word, phrasing.format(w=word), answer)


def split(n_train: int, n_heldout: int, seed: int) -> tuple[list[Item], list[Item]]:
    """Training items and held-out ones, the tasks in turn; no held-out key (word or sum) occurs in training."""
    rng = random.Random(seed)
    heldout: list[Item] = []
    keys: set[tuple[str, str]] = set()
    while len(heldout) < n_heldout:
        new = item(tuple(PHRASINGS)[len(heldout) % len(PHRASINGS)], rng)
        if (new.task, new.key) not in keys:
            keys.add((new.task, new.key))
            heldout.append(new)
    train: list[Item] = []
    while len(train) < n_train:
        new = item(tuple(PHRASINGS)[len(train) % len(PHRASINGS)], rng)
        if (new.task, new.key) not in keys:
            train.append(new)
    return train, heldout

"""The probe tasks by name: MQAR (one task per number of pairs), MAD's six, induction, passkey and the corpus."""

from __future__ import annotations

from gpt.errors import ConfigError
from gpt.probes import mad
from gpt.probes.corpus import Corpus
from gpt.probes.tasks import MQAR, Induction, Passkey, Task, TaskSettings


def task_names() -> list[str]:
    return ["mqar", *mad.TASKS, "induction", "passkey", "corpus"]


def build(names: list[str], s: TaskSettings, data=None) -> list[Task]:
    """The tasks of ``names`` (mqar: one per probes.mqar_pairs), each checked; an unknown name lists the known.
    ``data``: the corpus task's prepared data (gpt.probes.corpus.open_corpus; None: its vocabulary a placeholder)."""
    known = task_names()
    tasks: list[Task] = []
    for name in names:
        if name not in known:
            raise ConfigError(f"probes.tasks: unknown task {name!r}", hint=f"the tasks: {', '.join(known)}")
        if name == "mqar":
            if not s.mqar_pairs:
                raise ConfigError("probes.mqar_pairs is empty", hint="e.g. probes.mqar_pairs=[4,8,16]")
            tasks += [MQAR(s, p) for p in s.mqar_pairs]
        elif name == "corpus":
            tasks.append(Corpus(s, data))
        else:
            tasks.append({"induction": Induction, "passkey": Passkey, **mad.TASKS}[name](s))
    return tasks

"""``python -m gpt.attention`` (this folder's __main__: the kernel and design tables), and the package's earlier name
for the kernels: ``from gpt import attention; @attention.register(...)`` and its modules (``.masks``, ``.registry``,
...) still work, as gpt.kernels and its modules."""

import sys

from gpt import kernels
from gpt.kernels import *  # noqa: F403
from gpt.kernels import (
    __all__,  # noqa: F401
    backends,
    flex,
    masks,
    module,
    recording,
    registry,
    scores,
    support,
)

for _module in (backends, flex, kernels.kernels, masks, module, recording, registry, scores, support):
    sys.modules[f"{__name__}.{_module.__name__.rpartition('.')[2]}"] = _module

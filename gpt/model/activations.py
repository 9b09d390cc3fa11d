"""The MLP's activation functions by name (``model.activation``): GPT-2's tanh-approximated GELU, the exact GELU
(nanoGPT's), and ReLU squared (modded-nanogpt's and the modern recipe's)."""

from __future__ import annotations

from functools import partial

import torch.nn.functional as F
from torch import Tensor


def relu_squared(h: Tensor) -> Tensor:
    return F.relu(h) ** 2


ACTIVATIONS = {"gelu_tanh": partial(F.gelu, approximate="tanh"), "gelu": F.gelu, "relu2": relu_squared}

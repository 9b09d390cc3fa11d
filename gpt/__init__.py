"""gpt: a GPT training framework built around the attention block.

Importing the package registers the built-in attention designs (gpt.designs, one plain import each), so every
GPTConfig read anywhere knows them: gpt.model holds the registry, the designs build on the model and register there.
"""

from gpt import designs  # noqa: F401  (registers the built-in designs)
from gpt.model import GPT, GPTConfig

__all__ = ["GPT", "GPTConfig"]

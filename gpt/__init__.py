"""gpt: a GPT training framework built around the attention block."""

from gpt.model import GPT
from gpt.model.config import GPTConfig

__all__ = ["GPT", "GPTConfig"]

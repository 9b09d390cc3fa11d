"""gpt: a GPT training framework built around the attention block."""

from gpt.config import GPTConfig
from gpt.model import GPT

__all__ = ["GPT", "GPTConfig"]

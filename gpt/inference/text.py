"""Text at the edges of generation: tokens written out as whole characters with stop strings cut (TextStream),
and the escapes a command line types for a newline or a tab (unescape). Used by scripts/generate.py's body, the
pictures and the lm-eval model."""

from __future__ import annotations

import codecs
from typing import TextIO

from gpt.tokenizers import tokenizer as tok


class TextStream:
    """Turns tokens into text as they arrive: whole UTF-8 characters only, stop strings held back and cut."""

    def __init__(self, tokenizer: tok.Tokenizer, out: TextIO, stop: list[str]) -> None:
        self.tokenizer = tokenizer
        self.out = out
        self.stop = [s for s in stop if s]
        self.holdback = max((len(s) for s in self.stop), default=1) - 1
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.text = ""  # generated text not yet written
        self.stopped = False

    def add(self, token: int) -> bool:
        """Take one token; returns False once a stop string has appeared (the text before it is written)."""
        if self.stopped:
            return False
        self.text += self.decoder.decode(self.tokenizer.token_bytes(token))
        hits = [i for i in (self.text.find(s) for s in self.stop) if i >= 0]
        if hits:
            self._write(self.text[: min(hits)])
            self.text, self.stopped = "", True
            return False
        cut = len(self.text) - self.holdback
        if cut > 0:
            self._write(self.text[:cut])
            self.text = self.text[cut:]
        return True

    def close(self) -> None:
        if not self.stopped:
            self._write(self.text + self.decoder.decode(b"", final=True))
        self.text = ""

    def _write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()


def unescape(text: str) -> str:
    """\\n and \\t typed on the command line become a newline and a tab (Hydra cannot pass real ones)."""
    return text.replace("\\n", "\n").replace("\\t", "\t")

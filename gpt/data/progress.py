"""Progress of a preparation: a tqdm bar on a terminal, otherwise a plain line every so often."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from tqdm import tqdm

PLAIN_EVERY_S = 10.0


class Progress:
    """Documents done (of ``total`` where known) and tokens per second."""

    def __init__(self, total: int | None, log: Callable[[str], None], done: int = 0) -> None:
        self.total, self.log, self.documents, self.tokens = total, log, done, 0
        self.start = self.last = time.time()
        self.bar = tqdm(total=total, initial=done, unit="doc", dynamic_ncols=True) if sys.stderr.isatty() else None

    def update(self, documents: int, tokens: int) -> None:
        self.documents += documents
        self.tokens += tokens
        rate = self.tokens / max(time.time() - self.start, 1e-9)
        if self.bar is not None:
            self.bar.update(documents)
            self.bar.set_postfix(tok_s=f"{rate:,.0f}", refresh=False)
        elif time.time() - self.last >= PLAIN_EVERY_S:
            self.last = time.time()
            of = f"/{self.total:,}" if self.total else ""
            eta = ""
            if self.total and self.documents:
                done_rate = (self.documents) / max(self.last - self.start, 1e-9)
                eta = f", eta {max(self.total - self.documents, 0) / max(done_rate, 1e-9):.0f}s"
            self.log(f"  {self.documents:,}{of} documents, {self.tokens:,} tokens, {rate:,.0f} tokens/s{eta}")

    def close(self) -> float:
        """Close the bar; the seconds since the start."""
        if self.bar is not None:
            self.bar.close()
        return time.time() - self.start

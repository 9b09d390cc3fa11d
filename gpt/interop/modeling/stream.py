"""Sink tokens' part of a remote-code export (gpt/designs/stream.py): with a window, every query also sees the first
model.sink_tokens tokens."""


class Part:
    def mask(self, allowed, index, mc):
        """allowed (T, T): add the first sink_tokens keys (causally) to each query's window."""
        causal = index[None, :] <= index[:, None]
        return allowed | (causal & (index < mc["sink_tokens"])[None, :])

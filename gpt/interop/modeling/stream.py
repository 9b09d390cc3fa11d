"""Sink tokens' part of a remote-code export (gpt/designs/stream.py): with a window, every query also sees the first
model.design_options.stream.sinks tokens."""


class Part:
    def mask(self, allowed, index, mc):
        """allowed (T, T): add the first ``sinks`` keys (causally) to each query's window."""
        causal = index[None, :] <= index[:, None]
        return allowed | (causal & (index < mc["design_options"]["stream"]["sinks"])[None, :])

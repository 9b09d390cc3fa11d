"""What the hook points cost with nothing attached (docs/interpret.md). In one process, alternating one run at a time
so the machine's load falls on both alike: the model's forward passes as they are (hook points in place, none
attached) and without them (today's three forward methods with every hook point call taken out, swapped in at the
class level):
a training step (forward and backward, 8 x 128 tokens), a forward pass of 128 tokens and one of a single token
(the fixed costs' worst case) of the default 96-wide, 4-layer
model, one thread. Also the cost of one idle hook point call. Times are this thread's CPU time, not the wall clock's:
on a shared machine the time spent waiting for a core is not counted (contention still costs caches).
python benchmarks/hook_overhead.py [rounds]"""

from __future__ import annotations

import statistics
import sys
import time

import torch
import torch.nn.functional as F

from gpt.model import GPT, Block, CausalSelfAttention, GPTConfig
from gpt.model.hooks import HookPoint


def attention_before(self, x, ctx):  # CausalSelfAttention.forward without its hook points
    B, T, C = x.shape
    q, k, v = self.qkv(x, ctx)
    y = self.attend(q, k, v, ctx)
    y = y.transpose(1, 2).contiguous().view(B, T, C)
    for part in self.parts:
        y = part.output(self, y, x, ctx)
    return self.resid_dropout(self.c_proj(y))


def block_before(self, x, ctx):  # Block.forward without them
    x = x + self.attn(self.ln_1(x), ctx)
    return x + self.mlp(self.ln_2(x)) if self.has_mlp else x


def gpt_before(self, idx, targets=None, *, positions=None, key_mask=None, cache=None):  # GPT.forward without them
    contexts = self.contexts(idx, positions, key_mask, cache)
    x = self.transformer.wte(idx)
    if "wpe" in self.transformer:
        x = x + self.transformer.wpe(next(iter(contexts.values())).positions)
    x = self.transformer.drop(x)
    for block in self.transformer.h:
        x = block(x, contexts[block.kind])
    logits = self.lm_head(self.transformer.ln_f(x))
    if targets is None:
        return logits, None
    return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)


NOW = (CausalSelfAttention.forward, Block.forward, GPT.forward)
BEFORE = (attention_before, block_before, gpt_before)


def use(methods) -> None:
    CausalSelfAttention.forward, Block.forward, GPT.forward = methods


def main(rounds: int) -> None:
    torch.set_num_threads(1)
    config = GPTConfig(n_layer=4, n_head=4, n_embd=96, block_size=128, vocab_size=128, dropout=0.0)
    torch.manual_seed(0)
    model = GPT(config)
    x = torch.randint(0, 128, (8, 128))

    def train_step() -> None:
        model(x, x)[1].backward()

    def forward(tokens: int):
        def run() -> None:
            with torch.no_grad():
                model(x[:1, :tokens])
        return run

    for name, fn, reps, scale in (("train step (8 x 128, forward and backward)", train_step, 3, 1),
                                  ("forward of 1 x 128 tokens", forward(128), 10, 2),
                                  ("forward of 1 token", forward(1), 20, 8)):
        times = {"without": [], "now": []}
        for i in range(rounds * scale):
            pair = (("without", BEFORE), ("now", NOW))
            for label, methods in pair if i % 2 else pair[::-1]:  # each goes first in half the rounds
                use(methods)
                start = time.thread_time()
                for _ in range(reps):
                    fn()
                times[label].append((time.thread_time() - start) / reps * 1e3)
        use(NOW)
        for stat in (statistics.median, min):
            before, now = stat(times["without"]), stat(times["now"])
            print(f"{name}: without hook points {before:.4f} ms, with them {now:.4f} ms "
                  f"({(now / before - 1) * 100:+.2f}%), "
                  f"{stat.__name__} of {rounds * scale} alternating rounds of {reps}")
    point, t = HookPoint(), torch.zeros(1)
    start = time.thread_time()
    for _ in range(100_000):
        point(t)
    calls = sum(isinstance(m, HookPoint) for m in model.children())  # the blocks' and layers' sit behind their flag
    print(f"an idle hook point: {(time.thread_time() - start) / 100_000 * 1e6:.3f} us a call, {calls} called a pass "
          f"(the model's own; each block and layer tests its hooked flag once instead of calling its points)")


if __name__ == "__main__":
    from gpt.cli import bring_designs

    bring_designs()  # GPT_DESIGNS' files, as every script loads them: one failing is one error line
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 30)

"""This project's models inside lm-evaluation-harness (the optional extra [eval]), registered as ``gpt-attention``.

    python -m gpt.evaluation.lm_eval_model run --model gpt-attention --model_args ckpt=<run dir> --tasks hellaswag

(the lm_eval command line, with this module imported so the name is known), or from Python:
``lm_eval.simple_evaluate(model=GPTAttentionLM(ckpt=...), tasks=[...])``. Log-likelihoods are split and scored as
lm-eval's Hugging Face model scores them (gpt.evaluation.loglik); rolling log-likelihoods use lm-eval's own windows
(every token scored once, the last window with a full context); generation is greedy or sampled with the KV cache.
"""

from __future__ import annotations

import io
import sys
from typing import Any

import torch

try:
    from lm_eval.api.model import LM
    from lm_eval.api.registry import register_model
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
except ImportError as err:  # the optional extra is missing
    raise ImportError("lm-evaluation-harness is not installed: pip install -e '.[eval]'") from err
from tqdm import tqdm

from gpt.device import autocast, resolve_device, resolve_precision
from gpt.evaluation.loglik import Pair, encode_pair, loglikelihoods
from gpt.inference.decoding import stream
from gpt.inference.text import TextStream
from gpt.weights.load import load


@register_model("gpt-attention")
class GPTAttentionLM(LM):
    """lm-eval's LM interface over gpt.weights.load.load (a run folder, checkpoint, export, or gpt2*)."""

    def __init__(self, ckpt: str, init_path: str | None = None, device: str | None = "auto", batch_size: Any = 8,
                 precision: str = "auto", seed: int = 1234, **_: Any) -> None:
        super().__init__()
        self._device = resolve_device(device or "auto")
        self.ctx = autocast(self._device, resolve_precision(precision, self._device))
        self.model, self.tokenizer, _ = load(ckpt, self._device, init_path=init_path)
        self.batch_size = int(batch_size) if str(batch_size).isdigit() else 8  # "auto" is not supported: 8
        self.block_size = self.model.config.block_size
        self.generator = torch.Generator(device=self._device).manual_seed(int(seed))

    def _score(self, pairs: list[Pair], what: str) -> list[tuple[float, bool]]:
        bar = tqdm(total=len(pairs), desc=what, disable=None, file=sys.stderr, leave=False)

        def progress(done: int, total: int) -> None:
            bar.update(done - bar.n)

        try:
            return loglikelihoods(self.model, pairs, vocab_limit=self.tokenizer.vocab_size, batch_size=self.batch_size,
                                  device=self._device, autocast=self.ctx, progress=progress)
        finally:
            bar.close()

    def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """(summed log-probability of the continuation, whether greedy decoding would produce it) per request."""
        pairs = [encode_pair(self.tokenizer, *request.args) for request in requests]
        return self._score(pairs, "loglikelihood")

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        """The log-probability of each whole text, in lm-eval's windows of block_size tokens, batched across texts."""
        pairs, owners = [], []
        for i, request in enumerate(requests):
            ids = self.tokenizer.encode(request.args[0])
            prefix = self.tokenizer.eot_token
            if prefix is None:  # a character model has no end-of-text: its first character is the context
                prefix, ids = (ids[0], ids[1:]) if ids else (0, [])
            for window in get_rolling_token_windows(ids, prefix, self.block_size, context_len=1):
                pairs.append(make_disjoint_window(window))
                owners.append(i)
        totals = [0.0] * len(requests)
        for owner, (ll, _) in zip(owners, self._score(pairs, "loglikelihood_rolling")):
            totals[owner] += ll
        return totals

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        """Greedy (or sampled, with do_sample) continuations, cut before the first of each request's ``until``."""
        results: list[str] = []
        for start in tqdm(range(0, len(requests), self.batch_size), desc="generate_until", disable=None,
                          file=sys.stderr, leave=False):
            results += self._generate([r.args for r in requests[start : start + self.batch_size]])
        return results

    def _generate(self, batch: list[tuple[str, dict[str, Any]]]) -> list[str]:
        """One batch of prompts, each with its own stop strings; stops once every row has stopped."""
        kwargs = [dict(gen_kwargs) for _, gen_kwargs in batch]
        until = [[u] if isinstance(u, str) else list(u or []) for u in (k.pop("until", None) for k in kwargs)]
        max_new = max(int(k.get("max_gen_toks", 256)) for k in kwargs)
        sample = kwargs[0].get("do_sample", False)
        temperature = float(kwargs[0].get("temperature", 1.0)) if sample else 0.0  # 0: greedy
        prompts = [self.tokenizer.encode(context)[-self.block_size :] or [self.tokenizer.eot_token or 0]
                   for context, _ in batch]
        texts = [TextStream(self.tokenizer, io.StringIO(), stops) for stops in until]  # whole characters, cut at stops
        limits = [int(k.get("max_gen_toks", 256)) for k in kwargs]
        live, eot = [True] * len(batch), self.tokenizer.eot_token
        with self.ctx:
            steps = stream(self.model, prompts, max_new, temperature=temperature, top_k=kwargs[0].get("top_k"),
                           top_p=kwargs[0].get("top_p"), generator=self.generator,
                           stop_token=eot, vocab_limit=self.tokenizer.vocab_size)
            for step, tokens in enumerate(steps):  # tokens (B, 1)
                for row, token in enumerate(tokens.flatten().tolist()):
                    live[row] = live[row] and step < limits[row] and token != eot and texts[row].add(token)
                if not any(live):
                    break
        for text in texts:
            text.close()
        return [text.out.getvalue() for text in texts]


if __name__ == "__main__":  # lm_eval's command line, with gpt-attention registered, errors as every command's
    from lm_eval.__main__ import cli_evaluate

    from gpt.designs.loading import bring_designs
    from gpt.errors import report_user_errors

    bring_designs()
    report_user_errors(cli_evaluate)

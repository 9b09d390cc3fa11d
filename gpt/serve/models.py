"""The checkpoints a server serves: each loaded once (any source gpt.weights.load reads), with its engine, its chat
template if it has a usable one, and its limits; and what a request asks of it, as prompts and sampling settings."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, fields

from gpt.errors import UserError
from gpt.inference.chat_template import ChatTemplate, ChatTemplateError, Renderer, RendererClosed, RenderersBusy
from gpt.inference.decoding import check_sampling, prompt_ids
from gpt.inference.weight_layout import gemv_layout, onednn_linears
from gpt.model import GPT
from gpt.model import design as designs
from gpt.model.config import GPTConfig
from gpt.serve.engine import Engine, Sampling
from gpt.serve.protocol import SEED_RANGE, APIError, ChatRequest, CompletionRequest, shutting_down
from gpt.tokenizers import tokenizer as tok
from gpt.weights import load as loader


@dataclass
class Served:
    """One served checkpoint."""

    name: str  # the model id requests name
    model: GPT
    tokenizer: tok.Tokenizer
    engine: Engine
    chat: ChatTemplate | None
    chat_problem: str  # why chat requests are refused when chat is None
    max_prompt_tokens: int
    max_tokens: int  # the most tokens one request may ask for
    created: int
    longest_token: int = 1  # bytes of the tokenizer's longest token: a longer text cannot fit the context
    head_roles: dict | None = None  # the page's head-role scores, computed at the first picture (gpt.serve.attention)

    def __post_init__(self) -> None:
        self.longest_token = max(len(self.tokenizer.token_bytes(t)) for t in range(self.tokenizer.vocab_size))

    def check_text(self, text: str, param: str) -> None:
        """Refuse a text that cannot fit the context whatever its tokens, before encoding it: encoding costs time
        (a tokenizer's split pattern may backtrack over a long run: gpt.tokenizers.split_pattern)."""
        if len(text) > self.max_prompt_tokens * self.longest_token:  # characters <= UTF-8 bytes
            raise APIError(400, f"this model's maximum context length is {self.max_prompt_tokens} tokens; the "
                           f"prompt has {len(text):,} characters, more than that many tokens can hold", param,
                           "context_length_exceeded")

    def describe(self) -> dict:
        """What the page shows of the model: its size, the options where it differs from GPT-2 and the attention
        designs they turn on (the design registry's names)."""
        config = self.model.config
        defaults = GPTConfig()
        options = {f.name: getattr(config, f.name) for f in fields(GPTConfig)
                   if f.name not in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size", "dropout",
                                     "attention_backend", "designs", "design_options")
                   and getattr(config, f.name) != getattr(defaults, f.name)
                   and not (f.name == "n_kv_head" and config.n_kv_head == config.n_head)}
        options.update({f"{name}.{key}": value for name, settings in config.design_options.items()  # not defaults
                        for key, value in settings.items() if value != designs.get(name).options.get(key)})
        return {"id": self.name, "n_layer": config.n_layer, "n_head": config.n_head, "n_embd": config.n_embd,
                "block_size": config.block_size, "vocab_size": self.tokenizer.vocab_size,
                "parameters": self.model.num_params(), "options": options,
                "designs": [d.name for d in designs.active_anywhere(config)], "chat": self.chat is not None}


def model_name(ckpt: str) -> str:
    """The id a checkpoint is served under: the path as given, without a trailing slash."""
    return ckpt.rstrip("/") or ckpt


def load(ckpt: str, name: str, device, kernel: str | None, backend: str | None, init_path: str | None,
         limits: dict[str, int], renderer: Renderer, autocast) -> Served:
    """Load a checkpoint for serving (gpt.weights.load.load: the model, its tokenizer and its description, where the
    chat template lives); start its engine. A template that does not compile is reported, and chat refused."""
    model, tokenizer, meta = loader.load(ckpt, device, kernel, backend, init_path)
    if limits.get("onednn"):  # a batched step's large products through oneDNN's packed weights (a CPU's float32)
        gemv_layout(model)  # one row at one thread keeps MKL's product: along each matrix's longer side
        onednn_linears(model, limits["max_batch"])
    config = model.config
    chat, problem = None, "this model has no chat template (its tokenizer description has no chat_template)"
    if "chat_template" in meta:
        try:
            chat = ChatTemplate(meta["chat_template"], tokenizer, meta, renderer)
        except ChatTemplateError as err:
            problem = f"this model's chat template is unusable: {err}"
    max_prompt = limits.get("max_prompt_tokens") or config.block_size
    if max_prompt > config.block_size:
        raise UserError(f"max_prompt_tokens={max_prompt} is more than {name}'s context (block_size "
                        f"{config.block_size})", hint="leave max_prompt_tokens at null: each model's block_size")
    engine = Engine(model, tokenizer, limits["max_batch"], limits["max_queue"], autocast, name,
                    limits.get("prefix_cache_blocks", 0), limits.get("prefill_chunk", 0),
                    limits.get("speculate", 0)).start()
    return Served(name, model, tokenizer, engine, chat, problem, max_prompt, limits["max_tokens"], int(time.time()))


def completion_prompts(served: Served, request: CompletionRequest) -> list[list[int]]:
    """The token ids of each prompt of a completion request (an empty prompt starts as generate.py's does)."""
    prompt = request.prompt
    if isinstance(prompt, str):
        prompts = [prompt]
    elif prompt and all(isinstance(p, int) for p in prompt):
        prompts = [prompt]
    else:
        prompts = list(prompt) or [""]
    ids = [prompt_ids_of(served, p) for p in prompts]
    for row in ids:
        check_prompt(served, row, "prompt")
    return ids


def prompt_ids_of(served: Served, prompt: str | list[int]) -> list[int]:
    if isinstance(prompt, str):
        served.check_text(prompt, "prompt")
        try:
            return prompt_ids(served.tokenizer, prompt)
        except UserError as err:  # a character the vocabulary lacks
            raise APIError(400, str(err), "prompt") from None
    bad = [t for t in prompt if not 0 <= t < served.tokenizer.vocab_size]
    if bad:
        last = served.tokenizer.vocab_size - 1
        raise APIError(400, f"token id {bad[0]} is outside this model's vocabulary (0..{last})", "prompt")
    return list(prompt) or prompt_ids(served.tokenizer, "")


def check_prompt(served: Served, ids: list[int], param: str) -> None:
    if len(ids) > served.max_prompt_tokens:
        raise APIError(400, f"this model's maximum context length is {served.max_prompt_tokens} tokens; the prompt "
                       f"has {len(ids)}", param, "context_length_exceeded")


def chat_prompt(served: Served, request: ChatRequest) -> list[int]:
    """The token ids of a conversation through the model's chat template."""
    if served.chat is None:
        raise APIError(400, f"{served.name}: {served.chat_problem}; use /v1/completions with a plain prompt",
                       "messages", "no_chat_template")
    if not request.messages:
        raise APIError(400, "messages must hold at least one message", "messages")
    try:
        text = served.chat.render([m.as_template_input() for m in request.messages])
        served.check_text(text, "messages")
        ids = served.chat.encode(text)
    except RenderersBusy as err:
        raise APIError(503, f"the server is busy: {err}", code="server_busy", kind="server_error") from None
    except RendererClosed:
        raise shutting_down() from None
    except (ChatTemplateError, UserError) as err:
        raise APIError(400, str(err), "messages") from None
    if not ids:
        raise APIError(400, "the chat template wrote an empty prompt for these messages", "messages")
    check_prompt(served, ids, "messages")
    return ids


def samplings(served: Served, request: CompletionRequest | ChatRequest, sequences: int, default_max: int,
              stop_tokens: frozenset[int] = frozenset(), stop: tuple[str, ...] = ()) -> list[Sampling]:
    """Each sequence's settings: OpenAI's defaults (temperature 1, no top-p) where the request gives none.

    Sequence i samples with seed + i (a random seed when none is given), so the first matches generate.py's seed."""
    given = [(name, getattr(request, name, None)) for name in ("max_completion_tokens", "max_tokens")]
    name, max_tokens = next(((n, v) for n, v in given if v is not None), ("max_tokens", default_max))
    if not 1 <= max_tokens <= served.max_tokens:
        raise APIError(400, f"{name} is {str(max_tokens)[:24]}; this server allows 1 to {served.max_tokens} "
                       "(its max_tokens setting)", name)
    if not 1 <= request.n <= 16:
        raise APIError(400, f"n must be between 1 and 16, got {request.n}", "n")
    if sequences > served.engine.max_batch:
        raise APIError(400, f"the request asks for {sequences} sequences (prompts x n); this server decodes at most "
                       f"{served.engine.max_batch} together (max_batch)", "n")
    temperature = 1.0 if request.temperature is None else request.temperature
    try:
        check_sampling(temperature, request.top_k, request.top_p)
    except UserError as err:
        raise APIError(400, str(err), str(err).split()[0]) from None
    seed = secrets.randbits(63) if request.seed is None else request.seed
    if not SEED_RANGE[0] <= seed <= SEED_RANGE[1] - (sequences - 1):
        raise APIError(400, f"seed must be an integer from {SEED_RANGE[0]} to {SEED_RANGE[1]}", "seed")
    eot = served.tokenizer.eot_token
    ends = stop_tokens | ({eot} if eot is not None else set())
    strings = (*request.stops(), *stop)
    return [Sampling(max_tokens, temperature, request.top_k, request.top_p, seed + i, strings, frozenset(ends))
            for i in range(sequences)]

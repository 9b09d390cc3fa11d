"""The OpenAI API's request and response bodies: requests read and checked (every refusal an APIError with the
OpenAI error body's message, param and code), responses and stream chunks written as the openai client expects.

Extensions beyond OpenAI's parameters, as other servers spell them: top_k (generate.py's), and for completions
return_token_ids (the ids of the prompt and of every token, which the attention page needs).
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

SEED_RANGE = (-(2**63), 2**64 - 1)  # what torch.Generator.manual_seed takes
MAX_STOP = 4  # stop strings per request, as OpenAI allows
MAX_STOP_CHARS = 256
UNION_TYPES = {  # how to say what a union-typed parameter takes
    "prompt": "a string, a list of strings, a list of token ids or a list of such lists",
    "stop": "a string or a list of strings",
    "content": "a string or a list of text parts",
}


class APIError(Exception):
    """A request the server refuses: the HTTP status and OpenAI's error body."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error", headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind
        self.headers = headers  # e.g. Retry-After on a 503

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def shutting_down() -> APIError:
    """What a request still being read, rendered or decoded when the server is told to stop gets."""
    return APIError(503, "the server is shutting down", code="server_shutting_down", kind="server_error")


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    def unsupported(self) -> list[str]:
        """Parameters given a value this server cannot honour."""
        return []


class StreamOptions(_Body):
    include_usage: bool = False


class _Sampling(_Body):
    """What both endpoints take. OpenAI's penalties, logit_bias and logprobs are accepted only at their defaults."""

    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None

    def unsupported(self) -> list[str]:
        """Parameters given a value this server cannot honour."""
        if self.stream_options is not None and not self.stream:  # as OpenAI answers it
            raise APIError(400, "stream_options is only allowed when stream is true", "stream_options")
        wanted = {"presence_penalty": self.presence_penalty, "frequency_penalty": self.frequency_penalty,
                  "logit_bias": self.logit_bias}
        return [name for name, value in wanted.items() if value]

    def stops(self) -> list[str]:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stop) > MAX_STOP or any(len(s) > MAX_STOP_CHARS for s in stop):
            raise APIError(400, f"stop takes at most {MAX_STOP} strings of at most {MAX_STOP_CHARS} characters",
                           "stop")
        if "" in stop:  # it would match before every token: a completion of nothing, whatever was asked
            raise APIError(400, "stop strings must not be empty (leave stop out to stop only at max_tokens)", "stop")
        return stop


class AttentionField(_Body):
    """The completions extension ``attention``: the weights each new token was chosen with, in these layers and
    heads (all of either when not given)."""

    layers: list[int] | None = None
    heads: list[int] | None = None


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]] = ""
    attention: AttentionField | None = None  # extension: the attention of each new token (docs/serving.md)
    echo: bool = False
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None
    return_token_ids: bool = False  # extension: prompt_token_ids and each chunk's token_ids

    def unsupported(self) -> list[str]:
        if self.best_of is not None and self.best_of < 1:
            raise APIError(400, f"best_of must be at least 1, got {self.best_of}", "best_of")
        if self.logprobs is not None and self.logprobs < 0:
            raise APIError(400, f"logprobs must be at least 0, got {self.logprobs}", "logprobs")
        return [*super().unsupported(), *(["logprobs"] if self.logprobs else []),
                *(["suffix"] if self.suffix else []), *(["best_of"] if (self.best_of or 1) > 1 else [])]


class TextPart(_Body):
    type: Literal["text"]
    text: str


class Message(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def as_template_input(self) -> dict[str, str]:
        """The message as chat templates read it: role and content as strings."""
        content = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content or [])
        return {"role": self.role, "content": content, **({"name": self.name} if self.name else {})}


class ChatRequest(_Sampling):
    messages: list[Message]
    max_completion_tokens: int | None = None
    logprobs: bool | None = None

    def unsupported(self) -> list[str]:
        for i, message in enumerate(self.messages):  # only an assistant's turn may be empty (OpenAI: tool calls)
            if message.content is None and message.role != "assistant":
                raise APIError(400, f"messages.{i}.content is required for a {message.role} message",
                               f"messages.{i}.content")
        return [*super().unsupported(), *(["logprobs"] if self.logprobs else [])]


class AttentionRequest(_Body):
    """The page's POST /api/attention: the weights of the token at ``position`` of ``ids`` (the first
    ``prompt_tokens`` of them the prompt); with ``lens``, each layer's top next token at every position of its
    context too."""

    model: str
    ids: list[int]
    prompt_tokens: int
    position: int
    lens: bool = False  # also the logit lens of the same context (docs/serving.md)


def parse(model: type[_Body], data: Any) -> Any:
    """The request body as ``model``, or an APIError naming the first parameter at fault."""
    if not isinstance(data, dict):
        raise APIError(400, "the request body must be a JSON object")
    try:
        request = model.model_validate(data)
    except ValidationError as err:
        raise _validation_error(err) from None
    for name in request.unsupported():
        raise APIError(400, f"{name} is not supported by this server (leave it out, or at its default)", name,
                       "unsupported_parameter")
    return request


def _validation_error(err: ValidationError) -> APIError:
    first = err.errors()[0]
    loc = [str(part) for part in first["loc"]]
    top = loc[0] if loc else None
    if first["type"] == "extra_forbidden":
        return APIError(400, f"unrecognized request argument supplied: {'.'.join(loc)}", top)
    if first["type"] == "missing":
        return APIError(400, f"missing required parameter: {'.'.join(loc)}", top)
    field = next((part for part in reversed(loc) if part in UNION_TYPES), None)
    if field is not None and len(err.errors()) > 1:
        return APIError(400, f"{'.'.join(loc[: loc.index(field) + 1])} must be {UNION_TYPES[field]}", top)
    where = ".".join(p for p in loc if p not in ("str", "list[str]", "list[int]", "list[list[int]]"))
    return APIError(400, f"{where}: {first['msg'].lower()}, got {first['input']!r:.80}", top)


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def envelope(kind: str, rid: str, model: str, choices: list[dict[str, Any]], **more: Any) -> dict[str, Any]:
    """A response or chunk: text_completion, chat.completion or chat.completion.chunk."""
    return {"id": rid, "object": kind, "created": int(time.time()), "model": model, "choices": choices, **more}


def model_card(name: str, created: int) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": created, "owned_by": "gpt-attention"}

"""The FastAPI application: OpenAI's /v1/models, /v1/completions and /v1/chat/completions (streamed as server-sent
events), /health, the page's /api/ calls, and the page itself (static files, no build step).

Every refusal is OpenAI's error body with a clear message (400 for a bad request, 401 for a missing or wrong key,
404 for an unknown model, 413 for an oversized body, 503 with Retry-After when the queue is full); an unexpected
failure is a 500 whose traceback goes to the server's log, never to the client. A client that goes away gives its
cache slots back before the next step. /metrics answers in Prometheus' text format (gpt.serve.metrics).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import time
from collections import deque
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, StreamingResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from gpt.inference.chat_template import Renderer
from gpt.serve import attention, metrics, protocol
from gpt.serve.engine import SHUTTING_DOWN, Output, QueueFull, Sequence
from gpt.serve.models import Served, chat_prompt, completion_prompts, samplings
from gpt.serve.protocol import APIError, shutting_down

log = logging.getLogger("gpt.serve")
STATIC = Path(__file__).with_name("static")
THREADS = 64  # the request threads (asyncio.to_thread), beyond the default min(32, CPUs + 4)


class Shutdown:
    """The server being told to stop (Ctrl-C, SIGTERM): :meth:`begin` ends every sequence being decoded (open streams
    end with an error chunk), stops the chat template renderings in progress and refuses request bodies still
    arriving, each a 503, so every request is answered at once instead of cancelled after the grace period."""

    def __init__(self, models: dict[str, Served], renderer: Renderer | None) -> None:
        self.models, self.renderer = models, renderer
        self.started = False
        self._loop: asyncio.AbstractEventLoop | None = None  # the server's, known once a request waits
        self._event = asyncio.Event()

    def begin(self) -> None:
        """Safe in a signal handler and from any thread."""
        self.started = True
        for served in self.models.values():
            served.engine.halt()
        if self.renderer is not None:
            self.renderer.close()
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._event.set)

    async def wait(self) -> None:
        """Returns once :meth:`begin` has run."""
        self._loop = asyncio.get_running_loop()
        if not self.started:
            await self._event.wait()


class Outbox:
    """Outputs handed from the engine's thread to a request's coroutine, which takes them at once for a sequence's
    first output and its last, and otherwise at most once per ``interval`` seconds. Each wake-up of the event loop
    from the engine's thread (a write to its self-pipe, then the two threads taking the interpreter's lock in turn)
    cost a stream of the default model a third of its tokens per second here when every token woke it
    (docs/serving.md); what piles up meanwhile goes out as one chunk. No output waits longer than ``interval``."""

    def __init__(self, loop: asyncio.AbstractEventLoop, interval: float) -> None:
        self.loop, self.interval, self.items, self.ready = loop, interval, deque(), asyncio.Event()
        self.woken = False  # a wake-up is on its way, or the coroutine is awake and will look at items again
        self.urgent = False  # an output that may not wait is among items
        self.last = 0.0  # when the coroutine last took outputs (time.monotonic)

    def put(self, item, urgent: bool) -> None:
        """From the engine's thread; ``urgent``: take it now, whenever outputs were last taken."""
        self.items.append(item)
        self.urgent = self.urgent or urgent
        if self.woken or not (urgent or time.monotonic() - self.last >= self.interval):
            return
        self.woken = True
        try:
            self.loop.call_soon_threadsafe(self.ready.set)
        except RuntimeError:  # the event loop closed (the server is stopping)
            pass

    async def take(self) -> list:
        """Every output put so far, once one is there and is urgent or the interval since the last take is over."""
        while True:
            wait = self.last + self.interval - time.monotonic()
            if self.items and (self.urgent or wait <= 0):
                break
            self.woken = False
            if self.items and (self.urgent or wait <= 0):  # put between the look and the flag: it may not wake us
                break
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.ready.wait(), wait if self.items else None)
            self.ready.clear()
        self.woken, self.urgent, self.last = True, False, time.monotonic()
        return [self.items.popleft() for _ in range(len(self.items))]


@dataclass
class Piece:
    """A sequence's outputs that arrived together, as one: their text, the tokens sampled (stop tokens not among
    them), and how it ended if it did (finish_reason; error's message)."""

    text: str
    tokens: list[int]
    finish_reason: str | None
    error: str | None


def pieces(batch: list[tuple[int, Output]]) -> list[tuple[int, Piece]]:
    """Outputs taken together, one Piece per sequence (in the order each first appears)."""
    merged: dict[int, Piece] = {}
    for i, output in batch:
        piece = merged.setdefault(i, Piece("", [], None, None))
        piece.text += output.text
        piece.tokens += [] if output.token is None else [output.token]
        piece.finish_reason, piece.error = output.finish_reason, output.error
    return list(merged.items())


class Job:
    """One request's sequences in an engine: submitted at once, their outputs read as they come, cancelled together."""

    def __init__(self, served: Served, prompts: list[list[int]], settings: list, per_prompt: int,
                 stream_interval: float = 0.0) -> None:
        self.outbox = Outbox(asyncio.get_running_loop(), stream_interval)

        def deliver(i: int):
            first = [True]

            def put(output: Output) -> None:
                self.outbox.put((i, output), first[0] or output.finish_reason is not None)
                first[0] = False
            return put

        device = served.engine.device
        self.prompts = [prompts[i // per_prompt] for i in range(len(settings))]  # each sequence's prompt
        self.sequences = [Sequence(p, s, served.tokenizer, deliver(i), device)
                          for i, (p, s) in enumerate(zip(self.prompts, settings))]
        self.served = served
        try:
            served.engine.submit(self.sequences)
        except QueueFull as err:
            if str(err) == SHUTTING_DOWN:
                raise shutting_down() from None
            seconds = served.engine.retry_after()
            raise APIError(503, f"the server is busy: {err}; retry in {seconds} s", code="server_busy",
                           kind="server_error", headers={"Retry-After": str(seconds)}) from None

    async def outputs(self) -> AsyncIterator[tuple[int, Piece]]:
        """(sequence index, what it produced since) as the engine produces it, until every sequence has ended."""
        remaining = len(self.sequences)
        try:
            while remaining:
                for i, piece in pieces(await self.outbox.take()):
                    remaining -= piece.finish_reason is not None
                    yield i, piece
        finally:
            self.served.engine.cancel(self.sequences)  # those still running: their client is gone

    def usage(self) -> dict[str, int]:
        return protocol.usage(sum(s.prompt_tokens for s in self.sequences),
                              sum(s.generated for s in self.sequences))

    def texts(self, ids: list[int]) -> list[str]:
        """Each token's own text (the page shows tokens one by one)."""
        return [self.served.tokenizer.token_bytes(t).decode("utf-8", "replace") for t in ids]

    def ids_of(self, i: int, tokens: list[int] | None = None) -> dict[str, list]:
        """return_token_ids's fields: the prompt's ids and texts (tokens None), or new tokens'."""
        if tokens is None:
            return {"prompt_token_ids": self.prompts[i], "prompt_token_texts": self.texts(self.prompts[i]),
                    "token_ids": [], "token_texts": []}
        return {"token_ids": tokens, "token_texts": self.texts(tokens)}


async def read_json(request: Request, limit: int) -> Any:
    """The request's JSON body, refused past ``limit`` bytes (413) or when it is not JSON (400); a body still
    arriving when the server is told to stop is a 503 (one log line), not a request cancelled at the deadline."""
    reading = asyncio.ensure_future(read_body(request, limit))
    stopping = asyncio.ensure_future(request.app.state.shutdown.wait())
    try:
        await asyncio.wait({reading, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
        if not reading.done():
            reading.cancel()
    if not reading.done() or reading.cancelled():
        log.warning("%s %s: the server was told to stop while the request body arrived; answered 503",
                    request.method, request.url.path)
        raise shutting_down()
    return parse_body(reading.result())


async def read_body(request: Request, limit: int) -> bytearray:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and (len(declared) > 18 or int(declared) > limit):
        raise APIError(413, f"the request body has {declared[:24]} bytes; this server takes at most {limit:,} "
                       "(max_body_bytes)", code="request_too_large")
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise APIError(413, f"the request body is over {limit:,} bytes (max_body_bytes)",
                               code="request_too_large")
    except ClientDisconnect:  # nobody is left to answer: one line in the log, not an unexpected error
        log.warning("%s %s: the request body broke off after %d of %s bytes (the client closed the connection); "
                    "nothing was done", request.method, request.url.path, len(body), declared or "?")
        raise APIError(400, "the request body broke off", code="incomplete_body") from None
    return body


def parse_body(body: bytearray) -> Any:
    try:
        return json.loads(body, parse_constant=not_json, parse_float=finite, parse_int=integer)
    except OutOfRange as err:
        raise APIError(400, f"the request body holds {err}") from None
    except ValueError as err:
        raise APIError(400, f"the request body is not valid JSON: {err}") from None
    except RecursionError:
        raise APIError(400, "the request body's JSON is nested too deeply") from None


def not_json(constant: str) -> None:
    """Python's json reads NaN and Infinity; JSON (and OpenAI's API) has no such numbers."""
    raise ValueError(f"{constant} is not a JSON number")


class OutOfRange(ValueError):
    """A JSON number no parameter can take."""


def finite(text: str) -> float:
    """A JSON number as a float, refused when it is out of a float's range (1e999 would be infinity)."""
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise OutOfRange(f"the number {text[:40]}, out of a float's range")
    return value


def integer(text: str) -> int:
    """A JSON integer, refused past 20 digits (no parameter takes more than 64 bits)."""
    if len(text.lstrip("-")) > 20:
        raise OutOfRange(f"an integer of {len(text.lstrip('-')):,} digits (no parameter takes more than 20)")
    return int(text)


async def until_disconnected(request: Request) -> None:
    """Returns when the client closes the connection (the body has been read, so only that can arrive)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def sse(data: Any) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


def create_app(models: dict[str, Served], api_key: str | None = None, max_body_bytes: int = 2**20,
               renderer: Renderer | None = None, stream_interval: float = 0.0) -> FastAPI:
    """The application serving ``models`` (by id); the engines are stopped when it shuts down. A stream's tokens
    are sent as they come, gathered into one chunk per ``stream_interval`` seconds at most (Outbox)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        # the blocking parts of requests (templates, pictures) run on threads: enough that renderings waiting on
        # runaway templates (MAX_RENDERERS at once, each stopped after its time) leave threads for everyone else
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(THREADS, thread_name_prefix="request"))
        yield
        for served in models.values():
            await asyncio.to_thread(served.engine.stop)
        if renderer is not None:
            renderer.close()

    app = FastAPI(title="gpt-attention", docs_url=None, redoc_url=None, lifespan=lifespan)
    app.state.models, app.state.stream_interval = models, stream_interval
    app.state.shutdown = Shutdown(models, renderer)
    add_error_handlers(app)

    def served(name: Any) -> Served:
        if name not in models:
            raise APIError(404, f"the model {name!r:.200} does not exist; this server serves {', '.join(models)}",
                           "model", "model_not_found")
        return models[name]

    add_api_routes(app, models, served, max_body_bytes)
    add_page_routes(app, models, served, max_body_bytes)
    if api_key:
        app.add_middleware(KeyCheck, api_key=api_key)
    app.add_middleware(QuietAtShutdown)
    return app


class KeyCheck:
    """/v1/ and /api/ answer only requests that send the key (401 otherwise). Plain ASGI, not Starlette's
    BaseHTTPMiddleware, which passes every chunk of a streamed response through a stream of its own and a task
    switch: a third of the server's own time per token, streaming to one client (docs/serving.md)."""

    def __init__(self, app, api_key: str) -> None:
        self.app, self.expected = app, f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(("/v1/", "/api/")):
            given = next((value for name, value in scope["headers"] if name == b"authorization"), b"")
            if not hmac.compare_digest(given, self.expected):
                what = "no API key was given" if not given else "the API key is wrong"
                error = APIError(401, f"{what}: send it as 'Authorization: Bearer <key>'", code="invalid_api_key")
                return await JSONResponse(error.body(), status_code=401)(scope, receive, send)
        await self.app(scope, receive, send)


class QuietAtShutdown:
    """The last resort of a stop: a request still running when the server cancels it (past the 5 s grace period)
    is one log line and, if nothing was sent yet, a 503, instead of a CancelledError traceback."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def sending(message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except asyncio.CancelledError:
            if not scope["app"].state.shutdown.started:
                raise
            log.warning("%s %s: cancelled as the server stopped", scope["method"], scope["path"])
            if not started:
                error = shutting_down()
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await asyncio.wait_for(JSONResponse(error.body(), status_code=error.status)(scope, receive, send),
                                           timeout=1)


def add_api_routes(app: FastAPI, models: dict[str, Served], served, max_body_bytes: int) -> None:
    """OpenAI's routes, and /health."""

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "models": {name: s.engine.load() for name, s in models.items()}}

    @app.get("/metrics")
    async def prometheus() -> PlainTextResponse:
        return PlainTextResponse(metrics.render({name: s.engine.metrics() for name, s in models.items()}),
                                 media_type=metrics.CONTENT_TYPE)

    @app.get("/v1/models")
    async def list_models() -> dict:
        return {"object": "list", "data": [protocol.model_card(s.name, s.created) for s in models.values()]}

    @app.get("/v1/models/{name:path}")
    async def get_model(name: str) -> dict:
        s = served(name)
        return protocol.model_card(s.name, s.created)

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = protocol.parse(protocol.CompletionRequest, await read_json(request, max_body_bytes))
        s = served(body.model)
        prompts = await asyncio.to_thread(completion_prompts, s, body)  # encoding a long prompt takes a while
        settings = samplings(s, body, len(prompts) * body.n, default_max=16)
        if body.attention is not None:  # refused before any decoding when it asks too much
            attention.check_request(s, body.attention, prompts * body.n, settings[0].max_tokens, body.stream)
        job = Job(s, prompts, settings, body.n, request.app.state.stream_interval)
        texts = [s.tokenizer.decode(p) if body.echo else "" for p in job.prompts]
        if body.stream:
            return event_stream(completion_chunks(job, body, texts))
        return await unless_disconnected(request, completion_response(job, body, texts))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = protocol.parse(protocol.ChatRequest, await read_json(request, max_body_bytes))
        s = served(body.model)
        prompt = await asyncio.to_thread(chat_prompt, s, body)
        assert s.chat is not None  # chat_prompt refused the request otherwise
        settings = samplings(s, body, body.n, s.max_tokens, s.chat.stop_tokens, s.chat.stop)
        job = Job(s, [prompt], settings, body.n, request.app.state.stream_interval)
        if body.stream:
            return event_stream(chat_chunks(job, body))
        return await unless_disconnected(request, chat_response(job, body))


def add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(request: Request, err: APIError) -> JSONResponse:
        return JSONResponse(err.body(), status_code=err.status, headers=err.headers)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, err: HTTPException) -> JSONResponse:
        message = f"{request.method} {request.url.path}: {err.detail}"
        return JSONResponse(APIError(err.status_code, message, code="not_found").body(), status_code=err.status_code)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, err: Exception) -> JSONResponse:
        log.exception("unexpected error in %s %s", request.method, request.url.path)
        error = APIError(500, f"internal error ({type(err).__name__}); the server's log has the details",
                         kind="server_error")
        return JSONResponse(error.body(), status_code=500)


async def unless_disconnected(request: Request, result) -> Any:
    """Await a response, abandoning it (and its sequences) if the client disconnects first."""
    task, gone = asyncio.ensure_future(result), asyncio.ensure_future(until_disconnected(request))
    await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    if not task.done():
        task.cancel()
        return JSONResponse({}, status_code=499)  # nobody reads it
    gone.cancel()
    return task.result()


def event_stream(chunks: AsyncIterator[dict]) -> StreamingResponse:
    async def body() -> AsyncIterator[str]:
        async for chunk in chunks:
            yield sse(chunk)
        yield "data: [DONE]\n\n"
    return StreamingResponse(body(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def failed(output: Piece) -> APIError:
    if output.error == SHUTTING_DOWN:
        return shutting_down()
    return APIError(500, output.error or "decoding failed", kind="server_error")


async def completion_response(job: Job, body, texts: list[str]) -> dict:
    token_ids: list[list[int]] = [[] for _ in texts]
    finish: list[str | None] = [None] * len(texts)
    async for i, output in job.outputs():
        if output.finish_reason == "error":
            raise failed(output)
        texts[i] += output.text
        token_ids[i] += output.tokens
        finish[i] = output.finish_reason
    choices = []
    for i, text in enumerate(texts):
        choice = {"index": i, "text": text, "logprobs": None, "finish_reason": finish[i]}
        if body.return_token_ids:
            choice.update(job.ids_of(i), token_ids=token_ids[i], token_texts=job.texts(token_ids[i]))
        if body.attention is not None:
            choice["attention"] = await asyncio.to_thread(attention.completion_attention, job.served, body.attention,
                                                          job.prompts[i], token_ids[i])
        choices.append(choice)
    return protocol.envelope("text_completion", protocol.new_id("cmpl"), body.model, choices, usage=job.usage())


async def completion_chunks(job: Job, body, texts: list[str]) -> AsyncIterator[dict]:
    rid = protocol.new_id("cmpl")
    for i, text in enumerate(texts):  # the first chunk of each choice: the prompt (echo) and its ids
        if text or body.return_token_ids:
            choice = {"index": i, "text": text, "logprobs": None, "finish_reason": None}
            if body.return_token_ids:
                choice.update(job.ids_of(i))
            yield protocol.envelope("text_completion", rid, body.model, [choice])
    async for i, output in job.outputs():
        if output.finish_reason == "error":
            yield failed(output).body()
            return
        if not (output.text or output.finish_reason or body.return_token_ids):
            continue
        choice = {"index": i, "text": output.text, "logprobs": None, "finish_reason": output.finish_reason}
        if body.return_token_ids:
            choice.update(job.ids_of(i, output.tokens) if output.tokens else {"token_ids": []})
        yield protocol.envelope("text_completion", rid, body.model, [choice])
    if body.stream_options and body.stream_options.include_usage:
        yield protocol.envelope("text_completion", rid, body.model, [], usage=job.usage())


async def chat_response(job: Job, body) -> dict:
    texts, finish = [""] * len(job.sequences), [None] * len(job.sequences)
    async for i, output in job.outputs():
        if output.finish_reason == "error":
            raise failed(output)
        texts[i] += output.text
        finish[i] = output.finish_reason
    choices = [{"index": i, "message": {"role": "assistant", "content": text}, "logprobs": None,
                "finish_reason": finish[i]} for i, text in enumerate(texts)]
    return protocol.envelope("chat.completion", protocol.new_id("chatcmpl"), body.model, choices, usage=job.usage())


async def chat_chunks(job: Job, body) -> AsyncIterator[dict]:
    rid, kind = protocol.new_id("chatcmpl"), "chat.completion.chunk"
    for i in range(len(job.sequences)):
        first = {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        yield protocol.envelope(kind, rid, body.model, [first])
    async for i, output in job.outputs():
        if output.finish_reason == "error":
            yield failed(output).body()
            return
        if not (output.text or output.finish_reason):
            continue
        delta = {"content": output.text} if output.text else {}
        choice = {"index": i, "delta": delta, "logprobs": None, "finish_reason": output.finish_reason}
        yield protocol.envelope(kind, rid, body.model, [choice])
    if body.stream_options and body.stream_options.include_usage:
        yield protocol.envelope(kind, rid, body.model, [], usage=job.usage())


def add_page_routes(app: FastAPI, models: dict[str, Served], served, max_body_bytes: int) -> None:
    """The attention page: its files, the models it can pick, tokens and attention pictures."""

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/api/models")
    async def page_models() -> dict:
        return {"models": [s.describe() for s in models.values()]}

    @app.post("/api/attention")
    async def page_attention(request: Request) -> dict:
        body = protocol.parse(protocol.AttentionRequest, await read_json(request, max_body_bytes))
        s = served(body.model)
        return await asyncio.to_thread(attention.token_picture, s, body.ids, body.prompt_tokens, body.position,
                                       body.lens)

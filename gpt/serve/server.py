"""scripts/serve.py's body: load the checkpoints, build the application, listen (uvicorn) until Ctrl-C.
``running`` serves an application from a thread instead, for tests and the load benchmark."""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from gpt.device import autocast, resolve_device, resolve_precision
from gpt.errors import UserError
from gpt.inference.chat_template import Renderer
from gpt.serve.app import Shutdown, create_app
from gpt.serve.config import ServeConfig
from gpt.serve.models import Served, load, model_name
from gpt.serve.panic_notes import dropping_panic_notes

API_KEY_VARIABLE = "GPT_SERVE_API_KEY"


def listen(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (port 0: a free one), or a UserError saying why not. Connections made before
    the server runs wait in its backlog."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as err:
        sock.close()
        raise UserError(f"cannot listen on {host}:{port}: {err.strerror or err}",
                        hint="pick another port= (or stop what uses it), or another host=") from None
    return sock


def load_models(cfg: ServeConfig, renderer: Renderer) -> dict[str, Served]:
    """Every checkpoint cfg names, loaded and with its engine started (stopped again if a later one fails)."""
    device = resolve_device(cfg.device.type)
    precision = resolve_precision(cfg.precision, device)
    kernel, backend = (cfg.model.attention, cfg.model.attention_backend) if cfg.model else (None, None)
    limits = {"max_prompt_tokens": cfg.max_prompt_tokens or 0, "max_tokens": cfg.max_tokens,
              "prefix_cache_blocks": cfg.prefix_cache_blocks, "prefill_chunk": cfg.prefill_chunk,
              "speculate": cfg.speculate, "onednn": int(cfg.onednn),
              "max_batch": cfg.max_batch, "max_queue": cfg.max_queue}
    models: dict[str, Served] = {}
    try:
        for ckpt in [cfg.ckpt, *cfg.extra_ckpts]:
            name = model_name(ckpt)
            models[name] = load(ckpt, name, device, kernel, backend, cfg.init_path, limits, renderer,
                                lambda: autocast(device, precision))
    except BaseException:
        for served in models.values():
            served.engine.stop()
        raise
    return models


def run(cfg: ServeConfig) -> None:
    """scripts/serve.py: serve until interrupted."""
    import uvicorn

    sock = listen(cfg.host, cfg.port)  # before loading: a port in use fails at once
    renderer = Renderer()
    models = load_models(cfg, renderer)
    for served in models.values():
        c = served.model.config
        chat = ("a chat template" if served.chat else "no chat template" if "has no chat" in served.chat_problem
                else served.chat_problem.replace("this model's", "its"))
        print(f"model {served.name}: {served.model.num_params() / 1e6:.2f}M parameters, {c.n_layer} layers, "
              f"{c.n_head} heads, context {c.block_size}, attention={c.attention}; {chat}")
    key = cfg.api_key or os.environ.get(API_KEY_VARIABLE) or None
    if not cfg.is_loopback():
        print(f"warning: listening on {cfg.host}: other machines can reach this server"
              + ("" if key else f" and no API key is set (api_key= or {API_KEY_VARIABLE})"), file=sys.stderr)
    host, port = sock.getsockname()[:2]
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}"
    print(f"serving at {url}/ (the attention page) and {url}/v1 (the OpenAI API); Ctrl-C stops", flush=True)
    app = create_app(models, key, cfg.max_body_bytes, renderer, cfg.stream_interval_ms / 1000)
    config = uvicorn.Config(app, log_level="info", access_log=cfg.log_requests, timeout_graceful_shutdown=5)
    try:
        with dropping_panic_notes():  # a prompt the tokenizer gives up on: its 400's log line, not Rust's note too
            stopping_server(config, app.state.shutdown).run(sockets=[sock])
    except KeyboardInterrupt as err:  # uvicorn shut down cleanly, then re-raised the signal it caught: exit 130
        how = "SIGTERM" if str(err) == "SIGTERM" else "Ctrl-C"
        said = f"stopped ({how}); the streams still open ended with an error chunk saying so"
        raise KeyboardInterrupt(said) from None


def stopping_server(config, shutdown: Shutdown):
    """uvicorn's server, which on Ctrl-C or SIGTERM first answers every request in flight (gpt.serve.app.Shutdown):
    open streams end at once with an error chunk ("the server is shutting down"), renderings and bodies still
    arriving get a 503, instead of being cancelled after the grace period."""
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            if self.should_exit:  # a second Ctrl-C: the stop is under way and bounded (a forced one would cancel
                return  # the application's own shutdown, a traceback)
            super().handle_exit(sig, frame)
            shutdown.begin()

    return Server(config)


@contextmanager
def running(app, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Serve ``app`` from a thread of this process while the block runs; yields its base URL."""
    import uvicorn

    sock = listen(host, port)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    if not server.started:
        raise RuntimeError("the server did not start")
    try:
        yield f"http://{host}:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()

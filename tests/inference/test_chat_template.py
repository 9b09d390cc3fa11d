"""The chat template renderers (gpt.inference.chat_template.Renderer) under runaway templates: with every renderer
busy, a waiting rendering stops the oldest one past ``crowded`` s instead of waiting for its time to run out, and
close() stops the renderings in progress, each told why. The server's own test of the same: test_hostile_server."""

from __future__ import annotations

import threading
import time

import pytest

from gpt.inference.chat_template import ChatTemplateError, Renderer, RendererClosed

pytest.importorskip("jinja2")

SPIN = "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}"  # 10^10 steps
HELLO = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
MESSAGES = [{"role": "user", "content": "hello"}]


def render(renderer: Renderer, source: str) -> str:
    return renderer.ask({"source": source, "messages": MESSAGES, "variables": {}})


def in_threads(renderer: Renderer, count: int) -> tuple[list[threading.Thread], list[BaseException]]:
    """``count`` runaway renderings started on threads; what each raised, as they end."""
    raised: list[BaseException] = []

    def spin() -> None:
        try:
            render(renderer, SPIN)
        except ChatTemplateError as err:
            raised.append(err)

    threads = [threading.Thread(target=spin) for _ in range(count)]
    for thread in threads:
        thread.start()
    return threads, raised


def test_runaways_filling_every_renderer_hold_a_normal_rendering_only_until_the_oldest_is_stopped():
    renderer = Renderer(seconds=20, processes=2, wait=15, crowded=0.3)
    try:
        assert render(renderer, HELLO) == "hello"  # both processes started: one used, one spare
        threads, raised = in_threads(renderer, 2)
        time.sleep(0.5)  # both renderers busy with a runaway, each past 0.3 s
        sent = time.monotonic()
        assert render(renderer, HELLO) == "hello"
        waited = time.monotonic() - sent
        assert waited < 5, waited  # a new process's start, not the runaways' 20 s
        renderer.close()
        for thread in threads:
            thread.join(timeout=10)
        said = sorted((type(err).__name__, str(err)) for err in raised)  # the oldest stopped, the other closed
        assert not any(t.is_alive() for t in threads) and [kind for kind, _ in said] == ["ChatTemplateError",
                                                                                          "RendererClosed"], said
        assert "ran longer than 0.3 s while other requests waited for a renderer" in said[0][1], said
    finally:
        renderer.close()


def test_close_stops_the_renderings_in_progress():
    renderer = Renderer(seconds=20, processes=2)
    threads, raised = in_threads(renderer, 1)
    time.sleep(1.0)  # started and spinning
    closed = time.monotonic()
    renderer.close()
    threads[0].join(timeout=10)
    assert time.monotonic() - closed < 2 and [type(err) for err in raised] == [RendererClosed], raised
    with pytest.raises(RendererClosed, match="the server is shutting down"):
        render(renderer, HELLO)

"""Renders chat templates in a process of its own, for gpt.inference.chat_template: python -I template_worker.py
MEMORY_BYTES.

A template comes from a checkpoint file, so it is untrusted. Jinja's immutable sandbox keeps it from reaching
Python's internals or changing its inputs; this process keeps it from the server's memory and time: its address
space is capped (a template that builds a huge string gets a MemoryError here, not in the server), the server kills
it when a rendering runs too long, and what it writes is cut at MAX_OUTPUT characters. It imports only jinja2 and
the standard library. Protocol: one JSON request per line on standard input ({"source", and "messages" plus
"variables" to render}), one JSON answer per line on standard output ({"text"} or {"error"}).
"""

import json
import os
import resource
import signal
import sys

MAX_OUTPUT = 1_000_000  # characters of one rendered prompt


class Refused(Exception):
    """The template called raise_exception, or wrote too much."""


def raise_exception(message):
    raise Refused(f"the chat template refused the conversation: {message}")


def environment():
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)  # as transformers renders templates
    env.globals["raise_exception"] = raise_exception
    return env


def render(template, messages, variables):
    pieces, total = [], 0
    for piece in template.generate(messages=messages, add_generation_prompt=True, **variables):
        total += len(piece)
        if total > MAX_OUTPUT:
            raise Refused(f"the chat template wrote more than {MAX_OUTPUT:,} characters")
        pieces.append(piece)
    return "".join(pieces)


def answer(env, compiled, request):
    """The answer to one request: the compiled template checked, or the prompt it renders."""
    source = request["source"]
    try:
        if source not in compiled:
            compiled.clear()  # keep the last one only: compiling a template takes a millisecond
            compiled[source] = env.from_string(source)
    except MemoryError:
        return {"error": "the chat template needs more memory than its renderer may use to compile"}
    except Exception as err:  # a syntax error, or a constant Jinja folds while compiling (2 ** 100000)
        line = getattr(err, "lineno", None)
        return {"error": f"the chat template does not compile: {err}" + (f" (line {line})" if line else "")}
    if "messages" not in request:
        return {"text": ""}
    try:
        return {"text": render(compiled[source], request["messages"], request["variables"])}
    except Refused as err:
        return {"error": str(err)}
    except MemoryError:
        return {"error": "the chat template needs more memory than its renderer may use"}
    except Exception as err:  # whatever the template's own code raised (SecurityError, a bad filter, 1/0)
        return {"error": f"the chat template failed: {type(err).__name__}: {err}"}


def main():
    limit = int(sys.argv[1])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a SIGINT sent to it anyway: its parent decides
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    os.nice(10)  # a runaway template spins until killed: the server and its decoding come first
    env, compiled = environment(), {}
    print(json.dumps({"ready": True}), flush=True)  # imports done: the server's time limits start now
    for line in sys.stdin:
        print(json.dumps(answer(env, compiled, json.loads(line))), flush=True)


if __name__ == "__main__":
    main()

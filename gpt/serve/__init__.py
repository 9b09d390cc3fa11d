"""Serving a checkpoint: an OpenAI-compatible HTTP API (completions, chat, models, health) and a page that shows the
attention while the model writes. python scripts/serve.py ckpt=... ; docs/serving.md.

engine.py batches the requests of one model (the decoding functions of gpt.inference.decoding), chat.py renders chat
templates in Jinja's sandbox, protocol.py reads and writes the OpenAI request and response bodies, app.py is the FastAPI
application, attention.py the attention pictures the page asks for, static/ the page itself.
"""

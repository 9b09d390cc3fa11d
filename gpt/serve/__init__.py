"""Serving a checkpoint: an OpenAI-compatible HTTP API (completions, chat, models, health) and a page that shows the
attention while the model writes. python scripts/serve.py ckpt=... ; docs/serving.md.

engine.py batches the requests of one model (the decoding functions of gpt.inference.decoding), models.py loads the
served checkpoints (gpt.weights.load) and turns requests into prompts, protocol.py reads and writes the OpenAI request
and response bodies, app.py is the FastAPI application, attention.py the attention pictures the page asks for,
static/ the page itself. Chat templates render in gpt.inference.chat_template's sandbox, as scripts/chat.py's do.
"""

"""From a model to text: prefill and decode steps (decoding), logits to a token (sampling), tokens to whole
characters (text), the generate and chat commands' bodies, chat templates rendered in a sandboxed process
(chat_template, template_worker) and attention pictures (visualize)."""

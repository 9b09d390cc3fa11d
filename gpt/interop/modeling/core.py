"""GPT-2 with this project's attention designs, for transformers: the modeling file of a remote-code export.

scripts/export.py writes it into an export folder as modeling_gpt_attention.py, with each design's part beside it
(design_<name>.py, from what the design registers: ``Design.modeling``), for
``AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)``. Self-contained: torch and transformers
only. Parameter names are the project's own (transformer.h.0.attn.c_attn.weight, ...), so the weights load as they
are. Attention is computed eagerly (explicit scores, no KV cache: each step recomputes the sequence).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

DESIGN_PARTS: dict = {}  # generated: design name -> its Part class (design_<name>.py), in the project's hook order

ACTIVATIONS = {"gelu_tanh": lambda h: F.gelu(h, approximate="tanh"), "gelu": F.gelu,
               "relu2": lambda h: F.relu(h) ** 2}


class GPTAttentionConfig(PretrainedConfig):
    """The project's model config (``model_config``, GPTConfig's fields) and the designs it turns on."""

    model_type = "gpt_attention"

    def __init__(self, model_config: dict | None = None, designs: list | None = None, layer_kinds: list | None = None,
                 kinds: dict | None = None, **kwargs) -> None:
        self.model_config = dict(model_config or {})
        self.designs = list(designs or [])
        self.layer_kinds, self.kinds = layer_kinds, kinds  # a layout: each layer's kind, each kind's config (or None)
        kwargs.setdefault("tie_word_embeddings", self.model_config.get("tie_head", True))
        super().__init__(**kwargs)
        for name in ("n_layer", "n_head", "n_embd", "vocab_size"):
            if name in self.model_config:
                setattr(self, name, self.model_config[name])
        self.num_hidden_layers = self.model_config.get("n_layer", 1)  # what generation utilities look up
        self.hidden_size = self.model_config.get("n_embd", 1)
        self.num_attention_heads = self.model_config.get("n_head", 1)
        if "block_size" in self.model_config:  # the context, under the names tools read it by (lm-eval, vLLM)
            self.max_position_embeddings = self.n_positions = self.model_config["block_size"]


class Context:
    """What every layer of one forward shares: positions, indices, the mask of allowed keys, the parts' values."""

    def __init__(self, positions, index, allowed, key_mask) -> None:
        self.positions, self.index, self.allowed, self.key_mask = positions, index, allowed, key_mask
        self.extras: dict = {}


def attention(layer, q, k, v, ctx):
    """Softmax attention with the parts' score changes: q (B, nh, T, d), k (B, nkv, T, d), v (B, nkv, T, dv)."""
    group = q.size(1) // k.size(1)
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # (B, nh, T, d|dv)
    scale = layer.scale if layer.scale is not None else 1.0 / math.sqrt(q.size(-1))
    scores = (q @ k.transpose(-2, -1)) * scale  # (B, nh, T, T)
    sink = None
    for part in layer.parts:
        scores = part.scores(layer, scores, ctx) if hasattr(part, "scores") else scores
        sink = part.sink(layer) if hasattr(part, "sink") else sink
    scores = scores.masked_fill(~ctx.allowed, float("-inf"))
    if sink is not None:  # (nh,) logits joining every row's softmax, carrying no value
        column = sink.to(scores.dtype).view(-1, 1, 1).expand(*scores.shape[:-1], 1)
        weights = torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)[..., :-1]
    else:
        weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a row with no key allowed (padding): zeros
    return weights.to(v.dtype) @ v  # (B, nh, T, dv)


class Attention(nn.Module):
    """c_attn -> q, k, v (fewer key/value heads allowed), the parts' q/k transforms, attention, c_proj.
    A layer part (one with ``attend`` or ``qkv``, or ``forward``: all of them) replaces those steps as the design's
    own layer does."""

    def __init__(self, mc: dict, layer: int, parts: list, options: dict | None = None) -> None:
        super().__init__()
        self.layer, self.parts, self.options = layer, parts, options or {}  # options: per-layer design settings
        self.n_head, self.n_kv_head = mc["n_head"], mc.get("n_kv_head") or mc["n_head"]
        self.head_dim = mc["n_embd"] // mc["n_head"]
        self.own = next((p for p in parts if hasattr(p, "attend") or hasattr(p, "qkv") or hasattr(p, "forward")),
                        None)  # a layer design
        self.qk_dim = self.own.qk_width(mc) if hasattr(self.own, "qk_width") else self.head_dim
        self.scale = None
        if hasattr(self.own, "add_projections"):
            self.own.add_projections(self, mc)
        else:
            qkv_dim = (self.n_head + 2 * self.n_kv_head) * self.head_dim
            self.c_attn = nn.Linear(mc["n_embd"], qkv_dim, bias=mc["bias"])
        self.c_proj = nn.Linear(mc["n_embd"], mc["n_embd"], bias=mc["bias"])
        for part in parts:
            if hasattr(part, "build"):
                part.build(self, mc)

    def forward(self, x, ctx):
        if hasattr(self.own, "forward"):  # a layer of its own from its input (Gated DeltaNet)
            return self.own.forward(self, x, ctx)
        B, T, C = x.shape
        q, k, v = self.own.qkv(self, x, ctx) if hasattr(self.own, "qkv") else self.qkv(x, ctx)
        y = self.own.attend(self, q, k, v, ctx) if hasattr(self.own, "attend") else self.softmax_attention(q, k, v, ctx)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        for part in self.parts:  # an output gate, given the layer's input
            y = part.output(self, y, x, ctx) if hasattr(part, "output") else y
        return self.c_proj(y)

    def softmax_attention(self, q, k, v, ctx):
        return attention(self, q, k, v, ctx)

    def qkv(self, x, ctx):
        B, T, C = x.shape
        kv_dim = self.n_kv_head * self.head_dim
        q, k, v = self.c_attn(x).split([C, kv_dim, kv_dim], dim=2)
        q = q.view(B, T, self.n_head, self.head_dim).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)  # (B, nkv, T, hs)
        v = v.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
        if hasattr(self.own, "transform"):
            return (*self.own.transform(self, q, k, ctx), v)
        return (*self.transform(q, k, ctx), v)

    def transform(self, q, k, ctx):
        """The parts' q/k transforms in hook order (QK-norm, then RoPE, ...)."""
        for part in self.parts:
            if hasattr(part, "qk"):
                q, k = part.qk(self, q, k, ctx)
        return q, k


def norm_layer(mc: dict) -> nn.Module:
    """model.norm: GPT-2's LayerNorm, or RMSNorm (a weight only, epsilon 1e-6)."""
    if mc.get("norm", "layernorm") == "rmsnorm":
        return nn.RMSNorm(mc["n_embd"], eps=1e-6)
    return nn.LayerNorm(mc["n_embd"], bias=mc["bias"])


class MLP(nn.Module):
    def __init__(self, mc: dict) -> None:
        super().__init__()
        self.c_fc = nn.Linear(mc["n_embd"], 4 * mc["n_embd"], bias=mc["bias"])
        self.act = ACTIVATIONS[mc.get("activation", "gelu_tanh")]
        self.c_proj = nn.Linear(4 * mc["n_embd"], mc["n_embd"], bias=mc["bias"])

    def forward(self, x):
        return self.c_proj(self.act(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, mc: dict, layer: int, parts: list, options: dict | None = None) -> None:
        super().__init__()
        self.ln_1 = norm_layer(mc)
        self.attn = Attention(mc, layer, parts, options)
        self.ln_2 = norm_layer(mc)
        self.mlp = MLP(mc)

    def forward(self, x, ctx):
        x = x + self.attn(self.ln_1(x), ctx)
        return x + self.mlp(self.ln_2(x))


class Kind:
    """One kind of layer: its config (the model's, with its window and designs), its parts, its design settings.
    A uniform model is one kind, named None."""

    def __init__(self, mc: dict, designs: list, options: dict | None = None) -> None:
        self.mc, self.parts, self.options = mc, [DESIGN_PARTS[name]() for name in designs], options or {}


def kinds_of(config) -> tuple[dict, list]:
    """Each kind by name, and each layer's kind name (a layout's, or one kind for a uniform model)."""
    if not config.kinds:
        mc = config.model_config
        return {None: Kind(mc, config.designs, mc.get("design_options"))}, [None] * mc["n_layer"]
    kinds = {name: Kind(k["model_config"], k["designs"], k.get("options")) for name, k in config.kinds.items()}
    return kinds, list(config.layer_kinds)


class GPTAttentionForCausalLM(PreTrainedModel, GenerationMixin):
    """The project's GPT: token (+ learned position) embeddings, pre-LayerNorm blocks, the output head."""

    config_class = GPTAttentionConfig
    base_model_prefix = "transformer"
    _tied_weights_keys = {"lm_head.weight": "transformer.wte.weight"}

    def __init__(self, config: GPTAttentionConfig) -> None:
        super().__init__(config)
        mc = config.model_config
        self.kinds, self.layer_kinds = kinds_of(config)
        positional = any(getattr(p, "positional", False) for kind in self.kinds.values() for p in kind.parts)
        self.transformer = nn.ModuleDict(dict(wte=nn.Embedding(mc["vocab_size"], mc["n_embd"])))
        if not positional:  # no layer brings positions: the learned table, below the first layer (GPT-2's)
            self.transformer.wpe = nn.Embedding(mc["block_size"], mc["n_embd"])
        kinds = [self.kinds[name] for name in self.layer_kinds]
        self.transformer.h = nn.ModuleList([Block(kind.mc, i, kind.parts, kind.options)
                                            for i, kind in enumerate(kinds)])
        self.transformer.ln_f = norm_layer(mc)
        self.lm_head = nn.Linear(mc["n_embd"], mc["vocab_size"], bias=False)
        self.post_init()

    def _init_weights(self, module) -> None:
        """Every weight comes from the export's model.safetensors."""

    def get_input_embeddings(self):
        return self.transformer.wte

    def get_output_embeddings(self):
        return self.lm_head

    def context(self, input_ids, attention_mask, position_ids, kind: Kind) -> Context:
        """One kind's context: the causal (sliding-window) rule, the parts' masks, padding; the parts' per-forward
        values (RoPE's angles at the kind's base, ...)."""
        mc, T, parts = kind.mc, input_ids.size(1), kind.parts
        index = torch.arange(T, device=input_ids.device)
        allowed = index[None, :] <= index[:, None]  # (T, T) query i sees keys j <= i
        if mc.get("window") is not None:
            allowed = allowed & (index[None, :] > index[:, None] - mc["window"])
        for part in parts:
            allowed = part.mask(allowed, index, mc) if hasattr(part, "mask") else allowed
        key_mask = None if attention_mask is None else attention_mask.bool()
        allowed = allowed[None, None] if key_mask is None else allowed[None, None] & key_mask[:, None, None, :]
        ctx = Context(index if position_ids is None else position_ids, index, allowed, key_mask)
        for part in parts:
            if hasattr(part, "context"):
                part.context(ctx, mc)
        return ctx

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, labels=None, past_key_values=None,
                use_cache=None, return_dict=None, **kwargs) -> CausalLMOutputWithPast:
        limit = self.config.model_config["block_size"]
        if input_ids.size(1) > limit:
            raise ValueError(f"sequence length {input_ids.size(1)} exceeds the model's context of {limit} tokens "
                             "(max_position_embeddings): pass at most that many; generate() slides its window")
        ctxs = {name: self.context(input_ids, attention_mask, position_ids, kind) for name, kind in self.kinds.items()}
        x = self.transformer.wte(input_ids)  # (B, T, C)
        if "wpe" in self.transformer:
            x = x + self.transformer.wpe(next(iter(ctxs.values())).positions)
        for block, name in zip(self.transformer.h, self.layer_kinds):
            x = block(x, ctxs[name])
        logits = self.lm_head(self.transformer.ln_f(x))  # (B, T, vocab)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)).float(), labels[:, 1:].reshape(-1),
                                   ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits)

    def prepare_inputs_for_generation(self, input_ids, attention_mask=None, **kwargs) -> dict:
        """No KV cache: every step runs the whole sequence, its last block_size tokens once it is longer (the
        window slides, as the project's own generation does)."""
        limit = self.config.model_config["block_size"]
        if input_ids.size(1) > limit:
            input_ids = input_ids[:, -limit:]
            attention_mask = None if attention_mask is None else attention_mask[:, -limit:]
        return {"input_ids": input_ids, "attention_mask": attention_mask}

"""Reading the residual stream with the unembedding: the logit lens (each layer's stream through the final norm and
the head) and direct logit attribution (each head's output, through the final norm's scale of that position, onto
the next token's unembedding, centred over the vocabulary)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gpt.interpret.cache import check_tokens, run_with_cache
from gpt.interpret.heads import evaluating


def stage_streams(model: nn.Module, tokens: Tensor) -> list[tuple[str, Tensor]]:
    """The residual stream (B, T, C) after the embeddings ("embed") and after each block ("block l"), from one
    forward pass of ``tokens`` (already checked)."""
    with evaluating(model):
        _, cache = run_with_cache(model, tokens, ["blocks.0.hook_resid_pre", "blocks.*.hook_resid_post"])
    stages = [("embed", cache["blocks.0.hook_resid_pre"])]
    return stages + [(f"block {layer}", cache[f"blocks.{layer}.hook_resid_post"])
                     for layer in range(model.config.n_layer)]


def read_stream(model: nn.Module, resid: Tensor) -> Tensor:
    """A stream read as the model reads its last one: through the final norm and the head, float32 logits."""
    with torch.no_grad():
        return model.lm_head(model.transformer.ln_f(resid)).float()


def logit_lens(model: nn.Module, tokens: Tensor) -> list[dict]:
    """Per stage (the embeddings, then after each block): the next-token loss and top-1 accuracy over the tokens when
    the stream stops there, and the last position's top 5 tokens."""
    tokens = check_tokens(model, tokens, targets=True)
    targets, rows = tokens[:, 1:], []
    for stage, resid in stage_streams(model, tokens[:, :-1]):
        logits = read_stream(model, resid)
        loss = F.cross_entropy(logits.transpose(1, 2), targets)
        accuracy = (logits.argmax(-1) == targets).float().mean()
        rows.append({"stage": stage, "loss": round(float(loss), 4), "accuracy": round(float(accuracy), 4),
                     "top5_last": logits[0, -1].topk(5).indices.tolist()})
    return rows


def top_tokens(model: nn.Module, tokens: Tensor) -> list[dict]:
    """Per stage, the logit lens at every position of one sequence: the token each stage's stream would predict next
    there and its probability ({"stage", "ids": [T], "probs": [T]}); one stage's logits in memory at a time."""
    tokens = check_tokens(model, tokens)
    rows = []
    for stage, resid in stage_streams(model, tokens[:1]):
        probs, ids = read_stream(model, resid[0]).softmax(-1).max(-1)  # (T,) each
        rows.append({"stage": stage, "ids": ids.tolist(), "probs": probs.tolist()})
    return rows


def final_scale(model: nn.Module, resid: Tensor) -> Tensor:
    """The final LayerNorm's divisor sqrt(var + eps) of each position of the last stream (B, T, 1)."""
    ln = model.transformer.ln_f
    return torch.sqrt(resid.var(-1, unbiased=False, keepdim=True) + ln.eps)


def head_outputs(model: nn.Module, layer: int, z: Tensor) -> Tensor:
    """What each head writes to the stream: z (B, T, H, D) through its slice of c_proj: (B, T, H, C), no bias."""
    weight = model.transformer.h[layer].attn.c_proj.weight  # (C, H * D)
    H, D = z.size(2), z.size(3)
    return torch.einsum("bthd,chd->bthc", z, weight.view(weight.size(0), H, D))


def direct_attribution(model: nn.Module, tokens: Tensor) -> dict[str, Tensor]:
    """Each head's direct effect on the next token's (centred) logit, averaged over positions: (n_layer, n_head); the
    other components' (embeddings, MLPs, biases) under their names, and ``total``, their sum (= the mean centred
    logit of the next token less the final norm's bias term, which ``ln_bias`` holds)."""
    tokens = check_tokens(model, tokens, targets=True)
    n_layer = model.config.n_layer
    with evaluating(model):
        mlp = getattr(model.config, "mlp", True)  # model.mlp=false: attention only, no hook_mlp_out
        names = ["blocks.0.hook_resid_pre", "blocks.*.attn.hook_z", *(["blocks.*.hook_mlp_out"] if mlp else []),
                 f"blocks.{n_layer - 1}.hook_resid_post"]
        _, cache = run_with_cache(model, tokens[:, :-1], names)
    ln, unembed = model.transformer.ln_f, model.lm_head.weight  # (V, C)
    direction = (unembed - unembed.mean(0))[tokens[:, 1:]]  # (B, T, C): the next token's, centred over the vocab
    scale = final_scale(model, cache[f"blocks.{n_layer - 1}.hook_resid_post"])

    def onto(x: Tensor) -> Tensor:  # (B, T, ..., C) -> mean over (B, T) of the direct logit
        x = (x - x.mean(-1, keepdim=True)) * ln.weight
        extra = x.dim() - 3
        s, d = scale.view(*scale.shape[:2], *([1] * extra), 1), direction.view(*direction.shape[:2], *([1] * extra), -1)
        return ((x / s) * d).sum(-1).mean(dim=(0, 1))

    with torch.no_grad():
        heads = torch.stack([onto(head_outputs(model, layer, cache[f"blocks.{layer}.attn.hook_z"]))
                             for layer in range(n_layer)])
        parts = {"embed": onto(cache["blocks.0.hook_resid_pre"]),
                 "mlp": torch.stack([onto(cache[f"blocks.{layer}.hook_mlp_out"]) if mlp else heads.new_zeros(())
                                     for layer in range(n_layer)]),
                 "attn_bias": torch.stack([onto(_bias(model.transformer.h[layer].attn.c_proj, scale))
                                           for layer in range(n_layer)])}
        ln_bias = (direction * ln.bias).sum(-1).mean() if ln.bias is not None else torch.tensor(0.0)
    total = heads.sum() + parts["embed"] + parts["mlp"].sum() + parts["attn_bias"].sum()
    return {"heads": heads, **parts, "ln_bias": ln_bias, "total": total}


def _bias(linear: nn.Linear, like: Tensor) -> Tensor:
    """The layer's bias at every position of ``like`` (B, T, ...): (B, T, C) (zeros without one)."""
    B, T = like.shape[:2]
    bias = linear.bias if linear.bias is not None else linear.weight.new_zeros(linear.weight.size(0))
    return bias.expand(B, T, -1)

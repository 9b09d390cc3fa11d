"""The analyses scripts/interpret.py runs, each (model, tokenizer, config) -> (a JSON-able result, a figure)."""

from __future__ import annotations

import torch
from torch import Tensor

from gpt.errors import UserError
from gpt.interpret import heads as roles
from gpt.interpret.heads import parse_heads, token_pool
from gpt.interpret.lens import direct_attribution, logit_lens
from gpt.interpret.patching import patch


def prompt_tokens(tokenizer, text: str, what: str = "prompt") -> Tensor:
    from gpt.inference.text import unescape

    ids = tokenizer.encode(unescape(text))
    if len(ids) < 2:
        raise UserError(f"{what} has {len(ids)} token(s); the analysis needs at least 2")
    return torch.tensor([ids])


def grids(panels: list[tuple[str, Tensor]], xlabel: str = "head", ylabel: str = "layer", title: str = "",
          scale: tuple[float, float] | None = None):
    """A row of heat maps, one per (title, 2-D tensor), values written in the cells when they fit; ``scale``: a
    fixed colour range (scores in [0, 1]), else each map's own."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), squeeze=False)
    for ax, (name, values) in zip(axes[0], panels):
        values = values.float()
        low, high = scale if scale is not None else (None, None)
        image = ax.imshow(values.numpy(), cmap="viridis", aspect="auto", vmin=low, vmax=high)
        ax.set_xticks(range(values.size(1)) if values.size(1) <= 32 else [])
        ax.set_yticks(range(values.size(0)))
        fig.colorbar(image, ax=ax, fraction=0.046)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        if values.numel() <= 64:
            for (r, c), v in zip(torch.cartesian_prod(torch.arange(values.size(0)), torch.arange(values.size(1))),
                                 values.flatten()):
                ax.text(int(c), int(r), f"{float(v):.2f}", ha="center", va="center", fontsize=7, color="w")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def heads(model, tokenizer, cfg):
    """Head roles on repeated random tokens, the best head of each, and the induction ablation experiment."""
    pool = token_pool(tokenizer, model.config.vocab_size)
    length = roles.repeat_length(model, cfg.repeat, pool)
    scores = roles.detect(model, length, cfg.batch, cfg.seed, pool)
    best = {role: divmod(int(s.argmax()), s.size(1)) for role, s in scores.items()}
    tokens = roles.repeated_tokens(pool, length, cfg.batch, cfg.seed + 1)
    result = {"repeat": length, "batch": cfg.batch, "pool": len(pool), "scores": scores,
              "best": {role: {"head": f"L{layer}H{head}", "score": float(scores[role][layer, head])}
                       for role, (layer, head) in best.items()},
              "ablation": roles.induction_ablation(model, scores["induction"], tokens, length,
                                                   previous=scores["previous_token"])}
    return result, grids([(f"{role.replace('_', ' ')} score", s) for role, s in scores.items()],
                         title=f"head roles on {cfg.batch} x 2 x {length} repeated random tokens", scale=(0.0, 1.0))


def lens(model, tokenizer, cfg):
    rows = logit_lens(model, prompt_tokens(tokenizer, cfg.prompt))
    for row in rows:
        row["top5_last"] = [tokenizer.decode([i]) for i in row["top5_last"]]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.4))
    ax.plot([r["stage"] for r in rows], [r["loss"] for r in rows], marker="o")
    ax.set_ylabel("next-token loss (nats)")
    ax.set_title("logit lens: the stream read by the final norm and head", fontsize=9)
    fig.tight_layout()
    return {"stages": rows}, fig


def attribution(model, tokenizer, cfg):
    result = direct_attribution(model, prompt_tokens(tokenizer, cfg.prompt))
    return result, grids([("direct logit attribution (next token, centred)", result["heads"])])


def patching(model, tokenizer, cfg):
    if cfg.corrupted is None:
        raise UserError("analysis=patching needs a corrupted prompt", hint="add corrupted=\"...\" (as many tokens)")
    result = patch(model, prompt_tokens(tokenizer, cfg.prompt), prompt_tokens(tokenizer, cfg.corrupted, "corrupted"))
    for key in ("clean_answer", "corrupted_answer"):
        result[key] = tokenizer.decode([result[key]])
    return result, grids([("resid_pre patched (layer x position)", result["resid_pre_by_layer_position"]),
                          ("z patched (layer x head)", result["z_by_head"])], xlabel="position / head")


def ablation(model, tokenizer, cfg):
    """With ablate=[...]: those heads ablated together; without: each head alone (zeroed, or with ablate_with=mean
    their mean output). Loss on repeated random tokens' second repeat and on the prompt."""
    pool = token_pool(tokenizer, model.config.vocab_size)
    length = roles.repeat_length(model, cfg.repeat, pool)
    tokens = roles.repeated_tokens(pool, length, cfg.batch, cfg.seed)
    chosen, how = parse_heads(cfg.ablate), cfg.ablate_with
    roles.check_heads(model, chosen)
    prompt = prompt_tokens(tokenizer, cfg.prompt)
    if chosen:
        base = roles.second_repeat_loss(model, tokens, length)
        result = {"heads": cfg.ablate, "loss_second_repeat": base,
                  "loss_second_repeat_ablated": roles.second_repeat_loss(model, tokens, length, chosen, how),
                  "loss_prompt": float(roles.token_losses(model, prompt).mean()),
                  "loss_prompt_ablated": float(roles.token_losses(model, prompt, chosen, how).mean()),
                  "ablate_with": how}
        values = torch.zeros(model.config.n_layer, model.config.n_head)
        for layer, head in chosen:
            values[layer, head] = 1.0
        return result, grids([("heads ablated together", values)])
    second = roles.ablation_effects(model, tokens, length, how)
    on_prompt = roles.ablation_effects(model, prompt, how=how)
    return ({"second_repeat_loss_increase": second, "prompt_loss_increase": on_prompt, "ablate_with": how},
            grids([("loss increase, second repeat", second), ("loss increase, prompt", on_prompt)]))


def curve(model, tokenizer, cfg):
    """The head scores a run logged while it trained (train.heads=true), by step: when the induction heads formed."""
    from gpt.interpret import curve as formed

    result = formed.formation(formed.read_scalars(cfg.ckpt))
    return result, formed.figure(result)


ANALYSES = {"curve": curve, "heads": heads, "lens": lens, "attribution": attribution, "patching": patching,
            "ablation": ablation}

"""LoRA adapters through peft on the attention and MLP projections of any design, merged back for use and export.

The projections are found by what the modules are, not by a design's name: every ``nn.Linear`` inside each block's
attention layer (``CausalSelfAttention`` or a design's own subclass, a user-brought one included) and its MLP. Only
the adapters train (and, when chat tokens were added to a base model, those tokens' embedding rows, which a frozen
embedding could never learn); an adapter file holds just those tensors, a few MB for GPT-2.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from gpt.errors import UserError
from gpt.model import GPT, MLP, Block, CausalSelfAttention

ADAPTER = "default"  # peft's adapter name
ROWS = ("transformer.wte.weight", "lm_head.weight")  # the tensors whose new-token rows a LoRA run trains


def target_modules(model: nn.Module) -> list[str]:
    """The full names of the linear projections of every block's attention layer and MLP."""
    names = []
    for block_name, block in model.named_modules():
        if not isinstance(block, Block):
            continue
        for part_name, part in (("attn", block.attn), ("mlp", getattr(block, "mlp", None))):  # none: attention-only
            if not isinstance(part, (CausalSelfAttention, MLP)):
                continue
            names += [f"{block_name}.{part_name}.{name}" for name, module in part.named_modules()
                      if isinstance(module, nn.Linear)]
    if not names:
        raise UserError("this model has no linear projection in its blocks' attention or MLP for LoRA",
                        hint="train every weight (chat.lora_rank=0)")
    return names


def add_adapters(model: GPT, rank: int, alpha: float, dropout: float, new_rows: list[int] = ()) -> GPT:
    """Freeze ``model``, put LoRA adapters of ``rank`` on its projections (in place, B = 0: the model computes what
    it did), and let the embedding (and untied head) rows ``new_rows`` train, masking every other row's gradient."""
    try:
        from peft import LoraConfig, inject_adapter_in_model
    except ImportError:
        raise UserError("LoRA (chat.lora_rank) needs the peft package", hint='pip install -e ".[chat]"') from None
    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=target_modules(model),
                        bias="none")
    for param in model.parameters():
        param.requires_grad_(False)
    inject_adapter_in_model(config, model, adapter_name=ADAPTER)
    for name, param in model.named_parameters():
        param.requires_grad_("lora_" in name)
    if new_rows:
        rows = torch.zeros(model.config.vocab_size, 1)
        rows[list(new_rows)] = 1.0
        for weight in {id(p): p for p in (model.transformer.wte.weight, model.lm_head.weight)}.values():
            weight.requires_grad_(True)
            weight.no_decay = True  # AdamW's decay would move the rows a zero gradient leaves alone
            weight.register_hook(lambda grad, rows=rows: grad * rows.to(grad.device, grad.dtype))
    model.lora_rows = sorted(new_rows)
    return model


def has_adapters(model: nn.Module) -> bool:
    return hasattr(model, "lora_rows")


def lora_layers(model: nn.Module) -> dict[str, nn.Module]:
    from peft.tuners.lora import LoraLayer

    return {name: module for name, module in model.named_modules() if isinstance(module, LoraLayer)}


def adapter_state(model: nn.Module) -> dict[str, Tensor]:
    """What a LoRA run trained: every adapter tensor, and the trained embedding rows (by row)."""
    state = {name: p.detach().clone() for name, p in model.named_parameters() if "lora_" in name}
    weights = dict(model.named_parameters(remove_duplicate=False))
    for key in ROWS:
        if model.lora_rows and key in weights:
            state[f"{key}.rows"] = weights[key].detach()[model.lora_rows].clone()
    return state


def load_adapter_state(model: nn.Module, state: Any, source: str = "the checkpoint") -> None:
    """Put what ``adapter_state`` took back into a model with the same adapters (a resumed LoRA run), each entry
    checked first against the model and this run's settings (names, tensors, shapes), a UserError naming ``source``
    and the entry otherwise: nothing is loaded unless all match."""
    params = dict(model.named_parameters(remove_duplicate=False))
    check_adapter_state(model, state, params, source)
    with torch.no_grad():
        for name, tensor in state.items():
            if name.endswith(".rows"):
                params[name.removesuffix(".rows")][model.lora_rows] = tensor.to(params[name[:-5]].dtype)
            else:
                params[name].copy_(tensor)


def check_adapter_state(model: nn.Module, state: Any, params: dict[str, Tensor], source: str) -> None:
    """Refuse adapter entries this model cannot take: not a mapping, another set of names, an entry that is not a
    dense floating-point tensor, one of another shape (another chat.lora_rank, another model) or one holding NaN or
    infinite values, naming the entry."""
    hint = "resume with the chat.lora_* settings the run was trained with (its config.yaml), or start a new run"
    if not isinstance(state, dict):
        raise UserError(f"{source}: its adapter entry is a {type(state).__name__}, not a mapping of tensors",
                        hint="the file is damaged or was not written by this framework")
    expected = {n: tuple(p.shape) for n, p in params.items() if "lora_" in n}
    expected |= {f"{k}.rows": (len(model.lora_rows), model.config.n_embd) for k in ROWS
                 if model.lora_rows and k in params}
    extra, missing = sorted(set(state) - set(expected), key=str), sorted(set(expected) - set(state))
    if extra or missing:
        what = f"holds {str(extra[0])[:80]!r}, which" if extra else f"lacks {missing[0]!r}, which"
        raise UserError(f"{source}: the adapters are not this run's: it {what} this run's "
                        f"{'does not have' if extra else 'needs'} ({len(state)} entries against {len(expected)})",
                        hint=hint)
    ranks = {p.shape[0] for n, p in params.items() if "lora_A" in n}
    for name, shape in expected.items():
        tensor = state[name]
        if not isinstance(tensor, Tensor) or not tensor.is_floating_point():
            kind = f"a {tensor.dtype} tensor" if isinstance(tensor, Tensor) else f"a {type(tensor).__name__}"
            raise UserError(f"{source}: adapter entry {name} is {kind}, not a floating-point tensor",
                            hint="the file is damaged or was not written by this framework")
        if tensor.layout != torch.strided or tensor.is_meta:  # a sparse or data-less tensor copies into nothing
            raise UserError(f"{source}: adapter entry {name} is a {'meta' if tensor.is_meta else tensor.layout} "
                            "tensor, not a dense one", hint="the file is damaged or was not written by this framework")
        if tuple(tensor.shape) != shape:
            raise UserError(f"{source}: adapter entry {name} has shape {list(tensor.shape)}, this run's adapters "
                            f"(chat.lora_rank={'/'.join(map(str, sorted(ranks)))}) need {list(shape)}", hint=hint)
        if not torch.isfinite(tensor).all():  # training would stop at its first step, blaming the loss
            raise UserError(f"{source}: adapter entry {name} holds NaN or infinite values",
                            hint="resume from a good copy of the checkpoint, or start a new run")


def merged_state(model: nn.Module) -> dict[str, Tensor]:
    """The model's weights with every adapter folded into its projection (W + scale * B @ A), under the plain
    model's names: the state dict of a GPT that computes what the adapted model computes."""
    layers = lora_layers(model)
    state = {}
    for name, tensor in model.state_dict().items():
        if "lora_" in name:
            continue
        module = name.rsplit(".", 2)[0] if ".base_layer." in name else None
        if module in layers and name.endswith("base_layer.weight"):
            tensor = tensor + layers[module].get_delta_weight(ADAPTER).to(tensor.dtype)
        state[name.replace(".base_layer.", ".")] = tensor.detach().clone()
    return state


def merge(model: nn.Module) -> GPT:
    """A plain GPT holding the merged weights (for export, serving and chat: no peft needed to run it)."""
    merged = GPT(model.config)
    merged.load_state_dict(merged_state(model))
    return merged.to(next(model.parameters()).device)


def count(model: nn.Module) -> tuple[int, int]:
    """(parameters that train: adapters and new-token rows, all parameters)."""
    params = {id(p): p for p in model.parameters()}.values()
    adapters = sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)
    row_tensors = len({id(model.transformer.wte.weight), id(model.lm_head.weight)})
    return adapters + len(model.lora_rows) * model.config.n_embd * row_tensors, sum(p.numel() for p in params)


def describe(model: nn.Module) -> str:
    trained, total = count(model)
    return (f"LoRA: {len(lora_layers(model))} projections adapted, {trained:,} of {total:,} parameters train "
            f"({trained / total:.2%})")

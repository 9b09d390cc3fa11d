"""What each kernel can do on a device: the start-up check for training, and the table behind
``python -m gpt.attention``. The table is measured (each option is tried on tiny tensors), not declared."""

from __future__ import annotations

import torch

from gpt.attention.registry import available, backends, get
from gpt.errors import UserError

OPTIONS = ("forward", "backward", "gqa", "window", "mask", "dropout")


def check_trainable(name: str, device: torch.device | str, dropout: float = 0.0) -> None:
    """Refuse, before any work is done, to train with a kernel that cannot train on this device."""
    device = torch.device(device)
    if name == "flex" and device.type == "cpu":
        raise UserError(
            "attention=flex cannot train on CPU: torch's FlexAttention has no backward pass there",
            hint="train with attention=sdpa (flex can then sample from the checkpoint on CPU), or train on a CUDA GPU",
        )
    if name == "flex" and dropout > 0.0:
        raise UserError(
            f"attention=flex has no dropout on the attention weights, but model.dropout={dropout}",
            hint="set model.dropout=0 or pick another kernel",
        )


def probe(name: str, device: torch.device | str, option: str, backend: str | None = None) -> str | None:
    """Try one option of a kernel on tiny tensors: None if it works, else the first line of the error."""
    device = torch.device(device)
    g = torch.Generator().manual_seed(0)
    n_kv = 1 if option == "gqa" else 2
    q = torch.randn(1, 2, 4, 8, generator=g).to(device)
    k = torch.randn(1, n_kv, 4, 8, generator=g).to(device)
    v = torch.randn(1, n_kv, 4, 8, generator=g).to(device)
    kwargs = {
        "window": {"window": 2},
        "mask": {"mask": torch.tensor([True, True, False, True], device=device)},
        "dropout": {"dropout_p": 0.5},
    }.get(option, {})
    kernel = get(name, backend)
    try:
        if option == "backward":
            for t in (q, k, v):
                t.requires_grad_(True)
            kernel(q, k, v, causal=True).sum().backward()
        else:
            with torch.no_grad():
                kernel(q, k, v, causal=True, **kwargs)
    except Exception as err:  # noqa: BLE001  (any failure means "not supported here")
        return (str(err).strip().splitlines() or [type(err).__name__])[0]
    return None


def support_table(device: torch.device | str) -> list[dict]:
    """One row per kernel: each option "yes" or "no" (with the reason in row["why"]), the backends that
    run here, and a one-line description."""
    rows = []
    for name in available():
        row = {"kernel": name, "why": {}}
        for option in OPTIONS:
            failure = probe(name, device, option)
            row[option] = "yes" if failure is None else "no"
            if failure is not None:
                row["why"][option] = failure
        runs = [b for b in backends(name) if probe(name, device, "forward", backend=b) is None]
        row["backends"] = " ".join(runs) if backends(name) else "-"
        row["about"] = ((get(name).__doc__ or "").strip().splitlines() or [""])[0]
        rows.append(row)
    return rows

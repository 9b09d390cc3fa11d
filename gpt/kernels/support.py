"""What each kernel can do: the start-up refusals (read from each kernel's declared KernelSpec), and the table
behind ``python -m gpt.attention``, measured by trying each option on tiny tensors, to check those declarations."""

from __future__ import annotations

import torch

from gpt.errors import ConfigError, UserError
from gpt.kernels.registry import DEVICE_WORDS, OPTIONS, available, get, lacks, spec

COLUMNS = ("forward", "backward", *OPTIONS)  # what the measured table tries, in its column order


def check_trainable(name: str, device: torch.device | str, dropout: float = 0.0) -> None:
    """Refuse, before any work is done, training that the kernel's declaration rules out on this device."""
    device, declared = torch.device(device), spec(name)
    if not declared.trains(device.type):
        where = DEVICE_WORDS.get(device.type, device.type)
        others = [k for k in _preferred_first() if spec(k).trains(device.type)]
        fixes = [f"train with attention={k} ({name} can then sample from the checkpoint on {where})"
                 for k in others[:1]]
        if declared.trains_on:
            fixes.append("train on " + " or ".join(DEVICE_WORDS[t] for t in declared.trains_on))
        raise UserError(
            f"attention={name} cannot train on {where}: it has no backward pass there"
            + (f" ({declared.why})" if declared.why else ""),
            hint=", or ".join(fixes) or None,
        )
    if dropout > 0.0:
        check_options(name, {"dropout": (f"model.dropout={dropout}", "model.dropout=0")})


def check_options(name: str, wanted: dict[str, tuple[str, str]]) -> None:
    """Refuse options the kernel declares it lacks. ``wanted``: option -> (the setting asking for it, the fix)."""
    for option, (setting, fix) in wanted.items():
        if not spec(name).supports(option):
            others = [k for k in _preferred_first() if spec(k).supports(option)]
            raise ConfigError(
                f"{lacks(name, option)}, but {setting}",
                hint=f"set {fix}, or pick a kernel that has it: attention=" + " | ".join(others),
            )


def _preferred_first() -> list[str]:
    """Kernel names, the default (sdpa) first: the one a hint should suggest."""
    return sorted(available(), key=lambda k: k != "sdpa")


def try_option(name: str, device: torch.device | str, option: str, backend: str | None = None) -> str | None:
    """Try one of COLUMNS with a kernel on tiny tensors: None if it works, else the first line of the error."""
    device = torch.device(device)
    g = torch.Generator().manual_seed(0)
    n_kv = 1 if option == "gqa" else 2
    q = torch.randn(1, 2, 4, 8, generator=g).to(device)  # (B, H, T, D)
    k = torch.randn(1, n_kv, 4, 8, generator=g).to(device)  # (B, Hkv, T, D)
    v = torch.randn(1, n_kv, 4, 8, generator=g).to(device)
    kwargs = {
        "window": {"window": 2},
        "mask": {"mask": torch.tensor([True, True, False, True], device=device)},  # (Tk,): broadcasts
        "dropout": {"dropout_p": 0.5},
        "softcap": {"softcap": 5.0},
        "bias": {"bias": torch.randn(2, 4, 4, generator=g).to(device)},  # (H, Tq, Tk), e.g. ALiBi's
        "sink": {"sink": torch.zeros(2, device=device)},  # (H,)
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
    """One measured row per kernel (see measure_row), in name order."""
    return [measure_row(name, device) for name in available()]


def measure_row(name: str, device: torch.device | str) -> dict:
    """Each of COLUMNS "yes" or "no" (with the reason in row["why"]), the backends that run here, a one-line
    description, and where the kernel's declaration disagrees with what was measured (row["disagrees"])."""
    device = torch.device(device)
    row = {"kernel": name, "why": {}}
    for option in COLUMNS:
        failure = try_option(name, device, option)
        row[option] = "yes" if failure is None else "no"
        if failure is not None:
            row["why"][option] = failure
    runs = [b for b in spec(name).backends if try_option(name, device, "forward", backend=b) is None]
    row["backends"] = " ".join(runs) if spec(name).backends else "-"
    row["about"] = ((get(name).__doc__ or "").strip().splitlines() or [""])[0]
    row["disagrees"] = disagreements(row, device.type)
    return row


def disagreements(row: dict, device_type: str) -> list[str]:
    """Where a measured table row contradicts the kernel's KernelSpec (forward always; backward vs trains_on)."""
    declared = spec(row["kernel"])
    claims = {"forward": True, "backward": declared.trains(device_type)}
    claims.update({option: declared.supports(option) for option in OPTIONS})
    return [
        f"declares {option} {'supported' if claimed else 'unsupported'} but measured {row[option]!r}"
        for option, claimed in claims.items()
        if claimed != (row[option] == "yes")
    ]

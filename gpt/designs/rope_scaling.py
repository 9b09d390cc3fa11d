"""RoPE scaling (``model.design_options.rope.scaling``): run a RoPE model past the context it was trained at by
changing its frequencies, in transformers' form (its ``rope_parameters`` names and formulas, so an export carries it
as is).

linear: every frequency divided by ``factor`` (position interpolation, Chen et al. 2023). dynamic: NTK-aware, the
base raised as the sequence grows past the original length (a forward's length is its largest position + 1).
yarn (Peng et al. 2023): high frequencies kept, low ones interpolated, a ramp between (beta_fast, beta_slow
rotations over the original length), and cos/sin multiplied by an attention factor (default 0.1 ln(factor) + 1).
llama3: wavelengths longer than original / low_freq_factor interpolated, shorter than original / high_freq_factor
kept, a smooth mix between. The float64 formulas (inv_freq64) are the references; the model reads the same ones.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from gpt.errors import ConfigError

REQUIRED = ("rope_type", "factor", "original_max_position_embeddings")
PARAMS: dict[str, dict[str, Any]] = {  # each type's own parameters and their defaults (transformers')
    "linear": {}, "dynamic": {},
    "yarn": {"beta_fast": 32.0, "beta_slow": 1.0, "attention_factor": None},
    "llama3": {"low_freq_factor": 1.0, "high_freq_factor": 4.0},
}
MAX_FACTOR = 1024.0  # past this the low frequencies are below float32's resolution at any practical length
EXAMPLE = "model.design_options.rope.scaling={rope_type: yarn, factor: 4, original_max_position_embeddings: 128}"


def _number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def check(value: Any, block_size: int, where: str = "model.design_options.rope.scaling") -> dict[str, Any] | None:
    """The scaling as the model reads it (defaults filled in; None for none), or a ConfigError naming the key."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or "rope_type" not in value:
        raise ConfigError(f"{where} must be a mapping with rope_type (none, {', '.join(PARAMS)}), got {value!r}",
                          hint=f"e.g. {EXAMPLE}")
    kind = value["rope_type"]
    if kind is None or kind == "none":
        return None
    if not isinstance(kind, str) or kind not in PARAMS:
        raise ConfigError(f"{where}.rope_type must be one of none, {', '.join(PARAMS)}, got {kind!r}",
                          hint=f"e.g. {EXAMPLE}")
    known = (*REQUIRED, *PARAMS[kind])
    extra = sorted(set(value) - set(known))
    if extra:
        raise ConfigError(f"{where}.{extra[0]} is not a setting of rope_type {kind}", hint="its settings: "
                          + ", ".join(known))
    missing = [k for k in REQUIRED if k not in value]
    if missing:
        raise ConfigError(f"{where} with rope_type {kind} needs {missing[0]}", hint=f"e.g. {EXAMPLE}")
    factor, original = value["factor"], value["original_max_position_embeddings"]
    if not _number(factor) or not 1 < factor <= MAX_FACTOR:
        raise ConfigError(f"{where}.factor must be a number above 1 and at most {MAX_FACTOR:g}, got {factor!r}",
                          hint="the new context over the original one, e.g. 4 for 128 -> 512")
    if isinstance(original, bool) or not isinstance(original, int) or not 0 < original <= block_size:
        raise ConfigError(f"{where}.original_max_position_embeddings must be a positive integer at most "
                          f"model.block_size ({block_size}), got {original!r}",
                          hint="the context length the model was trained at; raise model.block_size to extend it")
    scaling = {"rope_type": kind, "factor": float(factor), "original_max_position_embeddings": original,
               **PARAMS[kind], **{k: value[k] for k in PARAMS[kind] if k in value}}
    _check_params(scaling, where)
    return scaling


def _check_params(s: dict[str, Any], where: str) -> None:
    """YaRN's and Llama 3's own parameters: numbers in their ranges."""
    if s["rope_type"] == "yarn":
        fast, slow, attention = s["beta_fast"], s["beta_slow"], s["attention_factor"]
        if not (_number(fast) and _number(slow) and 0 < slow < fast):
            raise ConfigError(f"{where}: beta_fast and beta_slow must be numbers with 0 < beta_slow < beta_fast, "
                              f"got beta_fast={fast!r}, beta_slow={slow!r}",
                              hint="YaRN's are beta_fast=32, beta_slow=1")
        if attention is not None and not (_number(attention) and 0 < attention <= 10):
            raise ConfigError(f"{where}.attention_factor must be a number in (0, 10] or null (0.1 ln(factor) + 1), "
                              f"got {attention!r}")
    if s["rope_type"] == "llama3":
        low, high = s["low_freq_factor"], s["high_freq_factor"]
        if not (_number(low) and _number(high) and 0 < low < high):
            raise ConfigError(f"{where}: low_freq_factor and high_freq_factor must be numbers with 0 < low_freq_factor"
                              f" < high_freq_factor, got {low!r} and {high!r}", hint="Llama 3.1's are 1 and 4")


def attention_factor(scaling: dict[str, Any] | None) -> float:
    """What cos and sin are multiplied by (so every score by its square): YaRN's temperature, else 1."""
    if scaling is None or scaling["rope_type"] != "yarn":
        return 1.0
    given = scaling["attention_factor"]
    return float(given) if given is not None else 0.1 * math.log(scaling["factor"]) + 1.0


def inv_freq64(scaling: dict[str, Any] | None, dim: int, base: float, length: int | None = None) -> Tensor:
    """The float64 inverse frequencies (dim/2,) of feature pairs; ``length`` is the sequence's (dynamic only)."""
    i = torch.arange(0, dim, 2, dtype=torch.float64)
    kind = scaling and scaling["rope_type"]
    if kind == "dynamic":
        original, factor = scaling["original_max_position_embeddings"], scaling["factor"]
        seq = max(length or original, original)
        base = base * (factor * seq / original - (factor - 1)) ** (dim / (dim - 2))
    inv = float(base) ** (-i / dim)
    if kind == "linear":
        return inv / scaling["factor"]
    if kind == "yarn":
        return _yarn(scaling, inv, dim, base)
    if kind == "llama3":
        return _llama3(scaling, inv)
    return inv


def _yarn(s: dict[str, Any], inv: Tensor, dim: int, base: float) -> Tensor:
    """Keep the pairs turning more than beta_fast times over the original length, interpolate those turning
    fewer than beta_slow times, and ramp linearly in between (bounds floored/ceiled, as transformers does)."""
    original = s["original_max_position_embeddings"]

    def pair(turns: float) -> float:  # the (fractional) pair index turning ``turns`` times over the original length
        return dim * math.log(original / (turns * 2 * math.pi)) / (2 * math.log(base))

    low, high = max(math.floor(pair(s["beta_fast"])), 0), min(math.ceil(pair(s["beta_slow"])), dim - 1)
    high = high + 0.001 if low == high else high
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)  # 1: interpolate
    return inv / s["factor"] * ramp + inv * (1 - ramp)


def _llama3(s: dict[str, Any], inv: Tensor) -> Tensor:
    """Llama 3.1's: long wavelengths divided by factor, short ones kept, a smooth mix between."""
    original, factor = s["original_max_position_embeddings"], s["factor"]
    low, high = s["low_freq_factor"], s["high_freq_factor"]
    wavelength = 2 * math.pi / inv
    smooth = (original / wavelength - low) / (high - low)
    mixed = (1 - smooth) * inv / factor + smooth * inv
    out = torch.where(wavelength > original / low, inv / factor, inv)
    return torch.where((wavelength >= original / high) & (wavelength <= original / low), mixed, out)


def angles(positions: Tensor, dim: int, base: float, scaling: dict[str, Any]) -> tuple[Tensor, Tensor]:
    """cos and sin (..., T, dim/2) of a scaled RoPE, the attention factor folded in, for positions (..., T).
    Dynamic's length is the largest position + 1 (read from the device: one sync per forward)."""
    length = int(positions.max()) + 1 if scaling["rope_type"] == "dynamic" else None
    inv = inv_freq64(scaling, dim, base, length).to(device=positions.device, dtype=torch.float32)
    a = positions.to(torch.float32).unsqueeze(-1) * inv
    m = attention_factor(scaling)
    return a.cos() * m, a.sin() * m

"""scripts/serve.py's settings (configs/serve.yaml), checked as they are built."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Optional

from gpt.device import PRECISIONS, DeviceConfig
from gpt.errors import ConfigError, check_positive
from gpt.model.config import MISSING, AttentionConfig, ScriptConfig


@dataclass
class ServeConfig(ScriptConfig):
    """What to serve, where, and the limits every request is held to (``designs=[...]``: designs a user brought,
    for checkpoints that use them)."""

    ckpt: str = MISSING  # a run directory, .pt file, exported folder, or gpt2* (with init_path): as generate.py takes
    extra_ckpts: list[str] = field(default_factory=list)  # more checkpoints, served side by side (ids as given)
    init_path: Optional[str] = None  # with ckpt=gpt2*: a local Hugging Face GPT-2 folder or .safetensors file
    host: str = "127.0.0.1"  # loopback only; 0.0.0.0 listens on every interface
    port: int = 8000
    api_key: Optional[str] = None  # require 'Authorization: Bearer <key>' (or set GPT_SERVE_API_KEY)
    max_tokens: int = 1024  # the most tokens one request may generate (and a chat request's default)
    max_prompt_tokens: Optional[int] = None  # None: each model's block_size
    max_body_bytes: int = 1048576  # a larger request body gets 413
    max_batch: int = 32  # sequences decoded together per model
    max_queue: int = 256  # sequences waiting for a place in the batch, per model; more get 503
    prefix_cache_blocks: int = 1024  # blocks of 16 prompt tokens whose keys and values are kept for reuse; 0: none
    prefill_chunk: int = 256  # prompt tokens prefilled between two decode steps (a longer prompt takes several); 0: all
    speculate: int = 0  # prompt-lookup guesses per step for a greedy sequence decoded alone; 0: no speculation
    stream_interval_ms: float = 5.0  # a stream's tokens that come faster than this go out together; 0: no wait
    onednn: bool = True  # a CPU's batched steps multiply the large float32 Linears through oneDNN's packed weights
    log_requests: bool = True  # one access-log line per request
    device: DeviceConfig = field(default_factory=DeviceConfig)
    model: Optional[AttentionConfig] = None  # attention=<kernel>: serve the weights with it (None: as trained)
    precision: str = "auto"  # auto | fp32 | bf16 | fp16

    def __post_init__(self) -> None:
        check_positive(self, "max_tokens", "max_body_bytes", "max_batch", "max_queue")
        check_positive(self, "max_prompt_tokens", optional=True)
        if isinstance(self.speculate, bool) or self.speculate < 0:
            raise ConfigError(f"speculate must be 0 (none) or more guesses per step, got {self.speculate}")
        if isinstance(self.prefill_chunk, bool) or self.prefill_chunk < 0:
            raise ConfigError(f"prefill_chunk must be 0 (whole prompts) or more, got {self.prefill_chunk}")
        if isinstance(self.prefix_cache_blocks, bool) or self.prefix_cache_blocks < 0:
            raise ConfigError(f"prefix_cache_blocks must be 0 (none) or more, got {self.prefix_cache_blocks}")
        if isinstance(self.stream_interval_ms, bool) or not 0 <= self.stream_interval_ms <= 1000:
            raise ConfigError(f"stream_interval_ms must be between 0 (no wait) and 1000 milliseconds, got "
                              f"{self.stream_interval_ms}")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be between 0 and 65535, got {self.port}")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"unknown precision {self.precision!r}; valid: {', '.join(PRECISIONS)}")
        if self.api_key is not None and not self.api_key.strip():
            raise ConfigError("api_key is empty", hint="give a key, or leave api_key out for no key")
        names = [self.ckpt, *self.extra_ckpts]
        if len(set(names)) != len(names):
            raise ConfigError(f"a checkpoint is named twice in ckpt and extra_ckpts: {names}")

    def is_loopback(self) -> bool:
        """Whether host is reachable from this machine only."""
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False

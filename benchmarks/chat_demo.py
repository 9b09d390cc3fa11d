"""From a base model to an assistant, measured: the body of scripts/chat_demo.py.

A synthetic instruction set is built (gpt.data.instructions), the base model's exact match on held-out prompts is
measured (with ChatML's tokens added, as fine-tuning starts), then the model is fine-tuned twice through the
training loop, all weights and LoRA adapters, and measured again. The report gives exact match per task, the
training time and throughput, and what each way trains and keeps in AdamW's state.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from gpt.data.chat import add_token_rows, encode_conversation, with_chat_tokens
from gpt.data.instructions import Item, split
from gpt.device import DeviceConfig, resolve_device
from gpt.errors import ConfigError, check_positive
from gpt.files import atomic_write
from gpt.inference.decoding import generate_batch
from gpt.model import GPT
from gpt.model.config import MISSING, ModelConfig, ScriptConfig
from gpt.tokenizers import tokenizer as tok
from gpt.train.config import ChatConfig, RunConfig, TrainConfig
from gpt.train.trainer import train
from gpt.weights.load import load


@dataclass
class ChatDemoConfig(ScriptConfig):
    """scripts/chat_demo.py's settings (configs/chat_demo.yaml)."""

    base: str = MISSING  # the pretrained base model: a run folder, checkpoint or export
    out_dir: str = "runs/chat_demo"
    n_train: int = 6000  # training conversations
    n_heldout: int = 200  # held-out prompts (exact match)
    max_iters: int = 1600  # optimizer steps of each fine-tuning
    batch_size: int = 32
    learning_rate: float = 1e-3  # full fine-tuning's
    lora_rank: int = 64  # half the default model's width: ranks 16 and 32 stop below 90% (sums), docs/chat.md
    lora_alpha: float = 64.0  # LoRA's scale is lora_alpha / lora_rank
    lora_learning_rate: float = 3e-3
    ways: list[str] = field(default_factory=lambda: ["full", "lora"])  # which fine-tunings to run, in this order
    seed: int = 1337
    device: DeviceConfig = field(default_factory=DeviceConfig)

    def __post_init__(self) -> None:
        check_positive(self, "n_train", "n_heldout", "max_iters", "batch_size", "lora_rank", "lora_alpha")
        if not self.ways or set(self.ways) - {"full", "lora"} or len(set(self.ways)) != len(self.ways):
            raise ConfigError(f"ways must name full, lora or both, once each; got {list(self.ways)!r}",
                              hint="ways=[full,lora], ways=[full] or ways=[lora]")


def prompt_ids(tokenizer: tok.Tokenizer, item: Item) -> list[int]:
    """The ids of a held-out prompt as the template renders it, ending where the assistant's reply begins."""
    ids, _ = encode_conversation(tokenizer, [{"role": "user", "content": item.prompt}])
    return ids + [tokenizer.special_tokens["<|im_start|>"], *tokenizer.encode("assistant\n")]


@torch.no_grad()
def exact_match(model: GPT, tokenizer: tok.Tokenizer, items: list[Item], batch: int = 50) -> dict[str, float]:
    """Greedy replies (to <|im_end|>) equal to the answer, per task and overall, as fractions."""
    end = tokenizer.special_tokens["<|im_end|>"]
    right: dict[str, list[bool]] = {}
    for start in range(0, len(items), batch):
        chunk = items[start:start + batch]
        prompts = [prompt_ids(tokenizer, item) for item in chunk]
        outs = generate_batch(model, prompts, 12, temperature=0.0, stop_token=end, vocab_limit=tokenizer.vocab_size)
        for item, prompt, out in zip(chunk, prompts, outs):
            reply = out[len(prompt):]
            reply = reply[: reply.index(end)] if end in reply else None  # a reply must end
            right.setdefault(item.task, []).append(reply is not None and tokenizer.decode(reply) == item.answer)
    scores = {task: sum(r) / len(r) for task, r in right.items()}
    return {**scores, "all": sum(sum(r) for r in right.values()) / len(items)}


def write_jsonl(path: Path, items: list[Item]) -> None:
    atomic_write(path, lambda f: f.write("".join(json.dumps({"messages": i.messages()}) + "\n"
                                                 for i in items).encode()), what="conversations")


def base_with_chat_tokens(cfg: ChatDemoConfig, device: torch.device) -> tuple[GPT, tok.Tokenizer]:
    """The base model as fine-tuning starts from it: ChatML's tokens added, their rows at the mean."""
    loaded, base, _ = load(cfg.base)
    chat = with_chat_tokens(base)
    config, state = add_token_rows(loaded.config, loaded.state_dict(), base, chat)
    model = GPT(config)
    model.load_state_dict(state)
    return model.to(device).eval(), chat


def fine_tune(cfg: ChatDemoConfig, out: Path, lora: bool, log: Callable[[str], None]) -> dict[str, Any]:
    """One fine-tuning through the training loop; its run folder, time, throughput and optimizer state."""
    name = "lora" if lora else "full"
    run = RunConfig(
        model=ModelConfig(), device=cfg.device, seed=cfg.seed, out_dir=str(out / name), init_from=cfg.base,
        train=TrainConfig(max_iters=cfg.max_iters, batch_size=cfg.batch_size, warmup_iters=cfg.max_iters // 20,
                          learning_rate=cfg.lora_learning_rate if lora else cfg.learning_rate,
                          eval_interval=cfg.max_iters, eval_iters=10, sample_tokens=0, weight_decay=0.0),
        chat=ChatConfig(data=str(out / "train.jsonl"), val_data=str(out / "heldout.jsonl"),
                        lora_rank=cfg.lora_rank if lora else 0, lora_alpha=cfg.lora_alpha))
    started = time.time()
    summary = train(run, out / name, log=log)
    if summary.interrupted:  # a stopped fine-tuning has no result to measure
        raise KeyboardInterrupt(f"{name} fine-tuning stopped at step {summary.step}; its checkpoint is "
                                f"{summary.ckpt}")
    ckpt = torch.load(out / name / "ckpt.pt", weights_only=True)
    state = ckpt["optimizer"]["state"].values()
    optimizer_bytes = sum(t.numel() * t.element_size() for s in state for t in s.values() if torch.is_tensor(t))
    trained = sum(s["exp_avg"].numel() for s in state)
    return {"run": str(out / name), "wall_s": time.time() - started, "tokens_per_sec": summary.tokens_per_sec,
            "val_loss": summary.best_val_loss, "trained_params": trained, "optimizer_state_bytes": optimizer_bytes,
            "saved_bytes": (out / name / ("adapter.pt" if lora else "ckpt.pt")).stat().st_size}


def run(cfg: ChatDemoConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Build the set, measure the base, fine-tune both ways, measure each; write report.json."""
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    device = resolve_device(cfg.device.type)
    train_items, heldout = split(cfg.n_train, cfg.n_heldout, cfg.seed)
    write_jsonl(out / "train.jsonl", train_items)
    write_jsonl(out / "heldout.jsonl", heldout)
    model, tokenizer = base_with_chat_tokens(cfg, device)
    report: dict[str, Any] = {"config": asdict(cfg), "before": exact_match(model, tokenizer, heldout)}
    log(f"base model, exact match on {len(heldout)} held-out prompts: {report['before']}")
    for name in cfg.ways:
        report[name] = fine_tune(cfg, out, name == "lora", log)
        tuned, tuned_tokenizer, _ = load(report[name]["run"], device)
        report[name]["exact_match"] = exact_match(tuned.eval(), tuned_tokenizer, heldout)
        log(f"{name}: {report[name]}")
    atomic_write(out / "report.json", lambda f: f.write(json.dumps(report, indent=1).encode()), what="report")
    log(f"report: {out / 'report.json'}")
    return report

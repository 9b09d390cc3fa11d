"""proof.md: the GPU proof's summary as Markdown, from the dict proof.json holds."""

from __future__ import annotations

from typing import Any

from gpt.bench.report import markdown_table


def num(x: Any, spec: str = ".3g") -> str:
    return "-" if x is None else format(x, spec) if isinstance(x, (int, float)) else str(x)


def percent(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def markdown(summary: dict[str, Any], words: dict[str, str]) -> str:
    """A heading with the machine, a table of the parts (``words``: what each checks), then each part's own table."""
    parts = summary["parts"]
    lines = [f"# GPU proof{' (dry run, CPU)' if summary['dry_run'] else ''}", "",
             f"{summary['device']}; {summary['gpus']} GPU(s); torch {summary['torch']} (CUDA {summary['cuda']}), "
             f"Python {summary['python']}; started {summary['started']}, {summary['seconds']:.0f} s of "
             f"{summary['budget_s']:.0f}.", "",
             markdown_table(["part", "what", "status", "seconds", "note"],
                            [[name, words[name], p["status"], num(p.get("seconds"), ".0f"),
                              (p.get("error") or p.get("note") or "").splitlines()[0][:160] if
                              (p.get("error") or p.get("note")) else ""] for name, p in parts.items()])]
    for name, part in parts.items():
        body = SECTIONS[name](part) if name in SECTIONS and part["status"] != "skipped" and "error" not in part else ""
        if body:
            lines += ["", f"## {name}: {words[name]}", "", body]
    return "\n".join(lines) + "\n"


def kernels(p: dict[str, Any]) -> str:
    w = p["worst"]
    head = (f"{p['cells']} cells checked ({p['not_applicable']} n/a: the kernel lacks the design's option); worst "
            f"relative error against float64: fp32 {num(w['fp32'])}, bf16 {num(w['bf16'])}, fp32 gradients "
            f"{num(w['grad'])}.")
    bad = [r for r in p["rows"] if r["status"] == "fail"]
    rows = [[r["design"], r["kernel"], num(r.get("fp32")), num(r.get("bf16")), num(r.get("grad")),
             r.get("backward", ""), r.get("why", "")] for r in bad]
    return head + ("\n\n" + markdown_table(["design", "kernel", "fp32", "bf16", "grad", "backward", "why"], rows)
                   if rows else "")


def train(p: dict[str, Any]) -> str:
    rows = [[r["shape"], num(r["bench_tokens_per_s"], ",.0f"), num(r["loop_tokens_per_s"], ",.0f"),
             f"{r['loop_vs_bench']:.3f}", percent(r["bench_mfu"]), percent(r["loop_mfu"])] for r in p["rows"]]
    return (markdown_table(["shape", "bench tokens/s", "loop tokens/s", "loop / bench", "bench MFU", "loop MFU"], rows)
            + f"\n\nThe loop with attention.backend=flash pinned: {num(p['pinned_flash_tokens_per_s'], ',.0f')} "
              f"tokens/s, {p['pinned_vs_unpinned']:.3f} x the loop with torch's choice. Targets: {p['targets']}.")


def decode(p: dict[str, Any]) -> str:
    rows = [[r["precision"], num(r["ours_ms"], ".2f"), f'{num(r["ours_pinned_ms"], ".2f")} ({r["pinned_backend"]})',
             num(r.get("transformers_ms"), ".2f"), num(r.get("speedup_vs_transformers"), ".2f"),
             num(r.get("same_tokens_as_transformers"), ".2f")]
            for r in p["rows"]]
    return (markdown_table(["precision", "ms/token", "ms/token, backend pinned", "transformers ms/token",
                            "speed-up", "tokens agreeing"], rows)
            + f"\n\n{p['new_tokens']} greedy tokens after a 16-token prompt, batch 1. Targets: {p['targets']}."
            + (f" Note: {p['note']}" if p.get("note") else ""))


def flex(p: dict[str, Any]) -> str:
    variants = ", ".join(f"{k}: {v}" for k, v in p["compiled_variants"].items())
    speed = f"; {num(p['tokens_per_s'], ',.0f')} tokens/s" if p.get("tokens_per_s") else ""
    return (f"Compiled variants (torch falls back to the unfused path past 8): {variants}; fallback warnings: "
            f"{len(p['fallback_warnings'])}{speed}." + (f" {p['training']}." if p.get("training") else ""))


def arena(p: dict[str, Any]) -> str:
    rows = [[r["variant"], num(r["val_bpb"], ".4f"), num(r["tokens_per_s"], ",.0f"), num(r["decode_tok_s"], ",.0f")]
            for r in p["rows"]]
    return markdown_table(["design", "val bits/byte", "train tokens/s", "decode tokens/s"], rows)


def fsdp(p: dict[str, Any]) -> str:
    return f"{p['processes']} processes, {num(p.get('tokens_per_s'), ',.0f')} tokens/s."


SECTIONS = {"kernels": kernels, "train": train, "decode": decode, "flex": flex, "arena": arena, "fsdp": fsdp}

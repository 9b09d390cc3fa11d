"""The GPU proof: every check of issue 30 in one command (scripts/gpu_proof.sh), one JSON and one Markdown summary.

Each part (benchmarks.gpu_proof_parts) runs in a process of its own with a time limit drawn from the run's budget, so
a part that fails, hangs or breaks the GPU fails alone and the summaries are always written. ``--dry-run`` runs every
part on the CPU at tiny sizes. Usage: python -m benchmarks.gpu_proof [--dry-run] [--out DIR] [--parts a,b]
[--budget-s S]

Run again into the same folder, a proof replaces its previous run's work (the runs, the arena, the parts' logs) and
then its summaries; the prepared data stays. A folder that another program wrote is refused, never cleared.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.gpu_proof_report import markdown
from gpt.cli import skip_final_collection

PARTS = ("kernels", "train", "decode", "flex", "arena", "fsdp")
CAPS = {"kernels": 90, "train": 330, "decode": 120, "flex": 150, "arena": 150, "fsdp": 150}  # seconds, on a GPU
WORDS = {"kernels": "every kernel x design against float64", "train": "bench_train and the real loop",
         "decode": "greedy decoding against transformers", "flex": "FlexAttention training, compiled once",
         "arena": "the arena's quick mode, every design", "fsdp": "FSDP2 over several GPUs"}
MARKER = ".gpu_proof"  # written first into the out folder: the folder is a proof's, to replace on the next run
WRITTEN = {MARKER, "runs", "arena", "parts", "data", "corpus", "proof.json", "proof.md"}  # what a proof writes in it
RUN_NAMES = re.compile(r"loop_b\d+(_flash)?|flex|fsdp")  # its training runs in out/runs (benchmarks.gpu_proof_parts)


def run_part(name: str, out: Path, dry: bool, fsdp: int) -> dict[str, Any]:
    """One part, here (inside its own process): its result, written to out/parts/<name>.json."""
    from benchmarks import gpu_proof_parts as parts

    sizes = parts.DRY if dry else parts.GPU
    if name == "fsdp":
        import torch

        result = parts.fsdp_run(sizes, out, fsdp or torch.cuda.device_count())
    else:
        result = {"kernels": parts.kernels, "train": parts.train_speed, "decode": parts.decode, "flex": parts.flex,
                  "arena": parts.arena}[name](sizes, out)
    (out / "parts").mkdir(parents=True, exist_ok=True)
    (out / "parts" / f"{name}.json").write_text(json.dumps(result, indent=1, default=str))
    return result


class Child:
    """One part running in a child process (its output in out/parts/<name>.log), until done or out of time."""

    def __init__(self, name: str, out: Path, dry: bool, fsdp: int, timeout: float) -> None:
        self.name, self.out, self.timeout, self.started = name, out, timeout, time.time()
        self.log = out / "parts" / f"{name}.log"
        self.log.parent.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "benchmarks.gpu_proof", "--part", name, "--out", str(out), "--fsdp", str(fsdp)]
        env = {**os.environ, **({"OMP_NUM_THREADS": "1"} if dry else {})}  # dry run: parts share the cores
        with open(self.log, "w") as f:
            self.process = subprocess.Popen(command + (["--dry-run"] if dry else []), stdout=f,
                                            stderr=subprocess.STDOUT, env=env)

    def result(self) -> dict[str, Any] | None:
        """None while it runs; then what it wrote, or why it has no result (killed once past its time)."""
        seconds = time.time() - self.started
        if self.process.poll() is None:
            if seconds < self.timeout:
                return None
            self.process.kill()
            self.process.wait()
            return {"status": "fail", "error": f"still running after {self.timeout:.0f} s (log: {self.log})",
                    "seconds": seconds}
        written = self.out / "parts" / f"{self.name}.json"
        if self.process.returncode != 0 or not written.exists():
            tail = "\n".join(self.log.read_text(errors="replace").strip().splitlines()[-12:])
            return {"status": "fail", "error": f"exit {self.process.returncode}: {tail}", "seconds": seconds}
        return {**json.loads(written.read_text()), "seconds": seconds}


def run_parts(wanted: list[str], out: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Every wanted part, ``args.jobs`` at a time, each within what is left of the budget; their results by name."""
    deadline, results, running = time.time() + args.budget_s, {}, []
    pending = list(wanted)
    while pending or running:
        while pending and len(running) < args.jobs:
            name, left = pending.pop(0), deadline - time.time() - 5
            if name == "fsdp" and fsdp_world(args) < 2:
                results[name] = {"status": "skipped", "seconds": 0.0,
                                 "note": f"{fsdp_world(args)} GPU(s): FSDP2 needs several (on a CPU: --fsdp 2)"}
            elif left < 20:
                results[name] = {"status": "skipped", "note": "the time budget was spent", "seconds": 0.0}
            else:
                print(f"[{name}] {WORDS[name]} ...", flush=True)
                running.append(Child(name, out, args.dry_run, args.fsdp, min(CAPS[name] * args.cap_scale, left)))
        for child in list(running):
            result = child.result()
            if result is not None:
                running.remove(child)
                results[child.name] = result
                print(f"[{child.name}] {result['status']} ({result['seconds']:.0f} s)", flush=True)
        time.sleep(0.2)
    return {name: results[name] for name in wanted}


def out_of_range(args: argparse.Namespace) -> str | None:
    """What is wrong with the numbers given (a NaN or endless budget, a count beyond any machine), or None."""
    if not (0 < args.budget_s <= 7 * 24 * 3600):  # NaN fails too
        return f"--budget-s must be a number of seconds in (0, 604800], got {args.budget_s}"
    if args.jobs is not None and not 1 <= args.jobs <= 64:
        return f"--jobs must be in [1, 64], got {args.jobs}"
    if not 0 <= args.fsdp <= 4096:
        return f"--fsdp must be in [0, 4096] processes, got {args.fsdp}"
    return None


def fsdp_world(args: argparse.Namespace) -> int:
    """FSDP2's processes: --fsdp N, else one per GPU (none on a CPU)."""
    import torch

    return args.fsdp or (0 if args.dry_run or not torch.cuda.is_available() else torch.cuda.device_count())


def environment(dry: bool) -> dict[str, Any]:
    import platform

    import torch

    cuda = torch.cuda.is_available()
    return {"dry_run": dry, "torch": torch.__version__, "python": platform.python_version(),
            "device": torch.cuda.get_device_name(0) if cuda and not dry else f"cpu ({torch.get_num_threads()} threads)",
            "gpus": torch.cuda.device_count() if cuda else 0, "cuda": torch.version.cuda,
            "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    out = Path(args.out)
    if args.part:
        run_part(args.part, out, args.dry_run, args.fsdp)
        skip_final_collection()
        return 0
    if args.fsdp_worker:
        from benchmarks import gpu_proof_parts as parts

        parts.fsdp_worker(parts.DRY if args.dry_run else parts.GPU, Path(args.fsdp_worker))
        skip_final_collection()
        return 0
    wanted = [p for p in (args.parts.split(",") if args.parts else PARTS) if p]
    unknown = sorted(set(wanted) - set(PARTS))
    if unknown:
        print(f"error: unknown part(s) {', '.join(unknown)}; valid: {', '.join(PARTS)}", file=sys.stderr)
        return 2
    wrong = out_of_range(args)
    if wrong:
        print(f"error: {wrong}", file=sys.stderr)
        return 2
    if args.jobs is None:
        args.jobs = 2 if args.dry_run else 1  # on a GPU one at a time: the timings must not overlap
    args.cap_scale = 10.0 if args.dry_run else 1.0  # the caps are a GPU's; a CPU is bounded by the budget alone
    refused = take_folder(out)
    if refused:
        print(f"error: {refused}", file=sys.stderr)
        return 2
    started = time.time()
    summary = {**environment(args.dry_run), "budget_s": args.budget_s}
    summary["parts"] = run_parts(wanted, out, args)
    summary["seconds"] = time.time() - started
    write_summaries(out, summary)
    print(f"wrote {out / 'proof.json'} and {out / 'proof.md'}")
    return 0 if all(p["status"] != "fail" for p in summary["parts"].values()) else 1


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_proof", description=__doc__.splitlines()[0])
    p.add_argument("--dry-run", action="store_true", help="every part on the CPU at tiny sizes")
    p.add_argument("--out", default="runs/gpu_proof", help="where the runs, proof.json and proof.md go")
    p.add_argument("--parts", default="", help=f"comma-separated, of {', '.join(PARTS)} (default: all)")
    p.add_argument("--budget-s", type=float, default=600.0, help="the whole run's time limit (default 600)")
    p.add_argument("--fsdp", type=int, default=0, help="FSDP2 processes (default: one per GPU when several)")
    p.add_argument("--jobs", type=int, help="parts at a time (default: 1 on a GPU, 2 in a dry run)")
    p.add_argument("--part", help=argparse.SUPPRESS)
    p.add_argument("--fsdp-worker", help=argparse.SUPPRESS)
    return p


def take_folder(out: Path) -> str | None:
    """Make ``out`` this run's: a new or empty folder is marked as a proof's; an earlier proof's loses that run's
    work (its summaries stay until this run's replace them). Why not, when ``out`` holds another program's files."""
    if out.exists() and not out.is_dir():
        return f"--out {out} is a file, not a folder"
    try:
        entries = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    except OSError as err:
        return f"cannot read --out {out}: {err.strerror or err}"
    earlier = (out / MARKER).is_file() or (set(entries) <= WRITTEN and any(  # or a proof's from before the marker
        (out / "parts" / f"{name}.log").is_file() for name in PARTS))
    if entries and not earlier:
        return (f"--out {out} holds files that no GPU proof wrote ({', '.join(entries[:3])}"
                f"{', ...' if len(entries) > 3 else ''}); the proof clears its own earlier work there, so it needs a "
                "new or empty folder, or one an earlier proof wrote (the default is runs/gpu_proof)")
    stale = [out / "parts", out / "arena"] + [p for p in sorted((out / "runs").glob("*"))
                                              if p.is_dir() and RUN_NAMES.fullmatch(p.name)]
    stale = [p for p in stale if p.exists()]
    if stale:
        print(f"replacing the earlier proof in {out}: removing {', '.join(p.name for p in stale)}", flush=True)
    try:
        for path in stale:
            shutil.rmtree(path)
        out.mkdir(parents=True, exist_ok=True)
        (out / MARKER).write_text("written by scripts/gpu_proof.sh: its next run replaces the runs here\n")
    except OSError as err:
        return f"cannot prepare --out {out}: {err.strerror or err}"
    return None


def write_summaries(out: Path, summary: dict[str, Any]) -> None:
    """proof.json (everything) and proof.md (a table of the parts, then each part's figures), replacing the
    previous run's together."""
    from gpt.files import atomic_write_all

    out.mkdir(parents=True, exist_ok=True)
    texts = {"proof.json": json.dumps(summary, indent=1, default=str) + "\n", "proof.md": markdown(summary, WORDS)}
    atomic_write_all([(out / name, lambda f, text=text: f.write(text.encode())) for name, text in texts.items()],
                     "the GPU proof's summaries")


if __name__ == "__main__":
    sys.exit(main())

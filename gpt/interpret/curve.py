"""When the heads formed: the head scalars a run with train.heads=true logged at each evaluation (TensorBoard's
heads/* and val/loss, read from the run's event files), as a table by step and a picture."""

from __future__ import annotations

import logging
from pathlib import Path

from gpt.errors import UserError

SCALARS = ("heads/induction_best", "heads/previous_token_best", "heads/in_context_loss", "val/loss")


def read_scalars(run: str | Path) -> dict[str, dict[int, float]]:
    """{tag: {step: value}} of SCALARS from the run folder's event files (a step logged twice, at a resume: the
    later value); a .pt file stands for its folder."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    folder = Path(run)
    folder = folder.parent if folder.is_file() else folder
    if not any(folder.glob("events.out.tfevents.*")):
        raise UserError(f"analysis=curve reads a run's TensorBoard events; {folder} has none",
                        hint="give ckpt= the run folder of a training run")
    logging.getLogger("tensorboard").setLevel(logging.WARNING)
    events = EventAccumulator(str(folder), size_guidance={"scalars": 0}, purge_orphaned_data=False)
    try:
        events.Reload()
    except Exception as err:  # a damaged file: the library's own error, whatever its type
        raise UserError(f"could not read the TensorBoard events in {folder}: {err}") from None
    tags = set(events.Tags().get("scalars", []))
    if "heads/induction_best" not in tags:
        raise UserError(f"the run in {folder} logged no head scores", hint="train it with train.heads=true")
    return {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in SCALARS if tag in tags}


def formation(scalars: dict[str, dict[int, float]], threshold: float = 0.5) -> dict:
    """The curve by step, the first step where the best induction score passes ``threshold``, and the evaluation
    interval where it rose most (the phase change)."""
    steps = sorted(scalars["heads/induction_best"])
    rows = [{"step": s, **{tag.split("/")[1]: scalars[tag].get(s) for tag in scalars}} for s in steps]
    score = [scalars["heads/induction_best"][s] for s in steps]
    over = next((s for s, v in zip(steps, score) if v > threshold), None)
    rises = [(score[k + 1] - score[k], steps[k], steps[k + 1]) for k in range(len(steps) - 1)]
    rise, start, end = max(rises) if rises else (0.0, None, None)
    return {"threshold": threshold, "first_step_over": over, "steepest_rise": {"from": start, "to": end,
                                                                                "by": rise}, "curve": rows}


def figure(result: dict, title: str = ""):
    """Two panels by step: the best heads' scores (with the threshold), and the in-context and validation loss."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["curve"]
    steps = [r["step"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    for key, label in (("induction_best", "best induction score"), ("previous_token_best", "best previous-token")):
        left.plot(steps, [r[key] for r in rows], marker=".", label=label)
    left.axhline(result["threshold"], color="grey", lw=0.8, ls="--")
    left.set(xlabel="step", ylabel="score on repeated random tokens", ylim=(0, 1.02))
    left.legend(fontsize=8)
    right.plot(steps, [r["in_context_loss"] for r in rows], marker=".", color="C2", label="in-context loss")
    right.axhline(0, color="grey", lw=0.8)
    right.set(xlabel="step", ylabel="late minus early positions (nats)")
    if "loss" in rows[0]:
        twin = right.twinx()
        twin.plot(steps, [r["loss"] for r in rows], color="C3", lw=0.8, label="val loss")
        twin.set_ylabel("val loss (nats)")
        twin.legend(fontsize=8, loc="upper right")
    right.legend(fontsize=8, loc="lower left")
    rise = result["steepest_rise"]
    for ax in (left, right):
        if rise["from"] is not None:
            ax.axvspan(rise["from"], rise["to"], color="C1", alpha=0.12)
    fig.suptitle(title or "induction heads forming (the shaded interval: the steepest rise)", fontsize=10)
    fig.tight_layout()
    return fig

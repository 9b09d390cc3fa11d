"""Capability probes: each attention design trained from scratch on small synthetic tasks (MQAR, MAD's six,
induction, passkey retrieval at several lengths) over seeds; a card of accuracy per task, Welch p against the
baseline and a composite (docs/probes.md).

python scripts/probe.py "probes.designs=[gpt2,linear,window]" probes.tasks=[mqar,passkey] probes.seeds=3
python scripts/probe.py probes.quick=true out_dir=runs/probes_quick
"""

from gpt.cli import hydra_entry


@hydra_entry("probe")
def main(cfg) -> None:
    from gpt.probes.card import run

    run(cfg)


if __name__ == "__main__":
    main()

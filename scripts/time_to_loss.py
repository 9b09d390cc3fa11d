"""Time to loss: how many steps, tokens and seconds each training recipe needs to reach a validation loss.

python scripts/time_to_loss.py                                      # gpt2 and modern, 3 seeds, the default run
python scripts/time_to_loss.py recipes=[gpt2,modern] seeds=[1] "overrides=['model=tiny','train.max_iters=300']"
"""

from gpt.cli import hydra_entry


@hydra_entry("time_to_loss")
def main(cfg) -> None:
    from gpt.arena.time_to_loss import run

    print(run(cfg))


if __name__ == "__main__":
    main()

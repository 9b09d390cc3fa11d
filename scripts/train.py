"""Train a GPT: python scripts/train.py [model=small] [attention=sdpa] [data=stdlib_char] [key=value ...]

Resume a run: add out_dir=<run dir> resume=true. Several processes: torchrun --nproc_per_node=N scripts/train.py ...
"""

import logging
import sys
from pathlib import Path

from gpt.cli import hydra_entry
from gpt.train.distributed import env_world_size, hydra_overrides_for_rank, run_worker

sys.argv += hydra_overrides_for_rank()  # ranks > 0 of a torchrun launch write nothing of their own


def script_path() -> str:
    path = Path(__file__).resolve()
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


@hydra_entry("train")
def main(run) -> None:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from gpt.errors import UserError
    from gpt.train.trainer import train

    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode == RunMode.MULTIRUN and env_world_size() > 1:
        raise UserError("a Hydra multirun (-m) cannot run under torchrun", hint="launch one torchrun per configuration")
    # a single run goes to out_dir; each job of a multirun (-m) to its numbered folder below it
    run_dir = Path(run.out_dir if hydra_cfg.mode == RunMode.RUN else hydra_cfg.runtime.output_dir)
    summary = train(run, run_dir, log=logging.getLogger("train").info, overrides=list(hydra_cfg.overrides.task),
                    script=script_path())
    if summary.interrupted:
        sys.exit(0)  # a stop signal ends a sweep too, not only its current job


if __name__ == "__main__":
    if env_world_size() > 1:
        run_worker(main)  # a torchrun worker ends without tearing down its process group
    else:
        main()

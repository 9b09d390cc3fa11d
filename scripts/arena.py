"""The attention arena: train attention variants on the same data, seed, batch and token budget; rank them by
held-out bits per byte, with parameters, tokens/s, peak memory, KV-cache bytes per token and decode tokens/s.

python scripts/arena.py arena.variants=[gpt2,rope,alibi,qk_norm,softcap,sink] arena.tokens=1000000
python scripts/arena.py "arena.variants=[gpt2,'rope+qk_norm','model.n_kv_head=1']" arena.quick=true
"""

import hydra
from omegaconf import DictConfig

from gpt.cli import report_user_errors
from gpt.schema import register, typed

register("arena")


@hydra.main(config_path="../configs", config_name="arena", version_base=None)
def main(cfg: DictConfig) -> None:
    from gpt.bench.arena import run

    report_user_errors(lambda: run(typed(cfg)))


if __name__ == "__main__":
    main()

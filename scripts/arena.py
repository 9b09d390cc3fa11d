"""The attention arena: train attention variants on the same data, seed, batch and token budget; rank them by
held-out bits per byte, with parameters, tokens/s, peak memory, KV-cache bytes per token and decode tokens/s.

python scripts/arena.py arena.variants=[gpt2,rope,alibi,qk_norm,softcap,sink] arena.tokens=1000000
python scripts/arena.py "arena.variants=[gpt2,'rope+qk_norm','model.n_kv_head=1']" arena.quick=true
"""

from gpt.cli import hydra_entry


@hydra_entry("arena")
def main(cfg) -> None:
    from gpt.arena.arena import run

    run(cfg)


if __name__ == "__main__":
    main()

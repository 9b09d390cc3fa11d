"""Export a trained model: python scripts/export.py ckpt=<run dir> [out=<folder>] -> model.safetensors + config.json"""

from pathlib import Path

import hydra
from omegaconf import DictConfig

from gpt.cli import report_user_errors
from gpt.schema import register

register()


@hydra.main(config_path="../configs", config_name="export", version_base=None)
def main(cfg: DictConfig) -> None:
    from gpt import pretrained
    from gpt import checkpoint

    def export() -> Path:
        config, state, tokenizer = pretrained.load_weights(cfg.ckpt)
        out = cfg.out or checkpoint.resolve(cfg.ckpt).parent / "export"
        return pretrained.export(state, config, tokenizer, out)

    print(f"wrote {report_user_errors(export)}/model.safetensors and config.json")


if __name__ == "__main__":
    main()

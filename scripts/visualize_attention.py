"""Draw attention maps: python scripts/visualize_attention.py ckpt=<run dir> 'prompt="..."' [layer=] [head=] [out=]"""

import hydra
from omegaconf import DictConfig

from gpt.cli import report_user_errors
from gpt.schema import register

register()


@hydra.main(config_path="../configs", config_name="visualize_attention", version_base=None)
def main(cfg: DictConfig) -> None:
    from gpt.decoding import prompt_ids
    from gpt.device import resolve_device
    from gpt.errors import UserError
    from gpt.generate import unescape
    from gpt.pretrained import load_model
    from gpt.visualize import save_attention_png

    def draw():
        model, tokenizer = load_model(cfg.ckpt, resolve_device(cfg.device.type), init_path=cfg.init_path)
        ids = prompt_ids(tokenizer, unescape(cfg.prompt))
        if len(ids) > model.config.block_size:
            raise UserError(f"the prompt has {len(ids)} tokens, more than block_size {model.config.block_size}")
        try:
            return save_attention_png(model, tokenizer, ids, cfg.out, cfg.layer, cfg.head)
        except ValueError as err:
            raise UserError(str(err), hint="layers and heads count from 0") from None

    print(f"wrote {report_user_errors(draw)}")


if __name__ == "__main__":
    main()

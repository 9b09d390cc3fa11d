"""Export a trained model: python scripts/export.py ckpt=<run dir> [out=<folder>] [format=hf|native] [overwrite=true]
[push_to_hub=<user/name>] -> a folder transformers opens (format=hf) or this project's own layout (format=native)."""

from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from gpt.cli import report_user_errors
from gpt.schema import ExportApp, register

register()


def default_out(ckpt: str) -> Path:
    """<run directory>/export for a checkpoint; other sources (an export, gpt2) need out= spelled out."""
    from gpt import checkpoint, hf, pretrained
    from gpt.errors import UserError

    if ckpt in pretrained.GPT2_SIZES or hf.is_folder(ckpt) or pretrained.is_export(ckpt):
        raise UserError(f"ckpt={ckpt} is not a training run, so there is no default out=", hint="pass out=<folder>")
    return checkpoint.resolve(ckpt).parent / "export"


@hydra.main(config_path="../configs", config_name="export", version_base=None)
def main(cfg: DictConfig) -> None:
    from gpt import hf, pretrained

    def export() -> None:
        app: ExportApp = OmegaConf.to_object(cfg)  # validates format (ExportApp.__post_init__)
        out = Path(app.out).expanduser() if app.out else default_out(app.ckpt)
        hf.check_out_dir(out, app.overwrite)  # before loading weights: a refusal costs nothing
        config, state, tokenizer = pretrained.load_weights(app.ckpt)
        pretrained.export(state, config, tokenizer, out, format=app.format, overwrite=app.overwrite)
        print(f"wrote {out} ({'Hugging Face GPT-2 layout' if app.format == 'hf' else 'native layout'})", flush=True)
        if app.push_to_hub:
            print(f"pushed to {hf.push_to_hub(out, app.push_to_hub, private=app.private)}")

    report_user_errors(export)


if __name__ == "__main__":
    main()

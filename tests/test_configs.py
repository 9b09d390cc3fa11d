"""Every shipped config composes against its typed schema; the GPT-2 family has its published sizes."""

import re
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException

from conftest import run_inline
from gpt import GPT
from gpt import kernels as attention
from gpt.data.config import DataConfig
from gpt.device import DeviceConfig
from gpt.errors import ConfigError
from gpt.model.config import ModelConfig
from gpt.schema import register, renamed, typed
from gpt.train.config import RunConfig, TrainConfig

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
register()


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONFIGS / group).glob("*.yaml"))


def compose_train(*overrides: str):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        return compose(config_name="train", overrides=renamed(list(overrides)))


@pytest.mark.parametrize("group", ["model", "attention", "data", "device"])
def test_every_option_of_every_group_composes_and_becomes_its_typed_config(group):
    for option in options(group):
        cfg = compose_train(f"{group}={option}", "out_dir=x", "data.path=somewhere", "data.dataset=somewhere")
        run = typed(cfg)
        assert isinstance(run, RunConfig)
        assert isinstance(run.data, DataConfig) and isinstance(run.device, DeviceConfig)
        assert isinstance(run.model, ModelConfig) and isinstance(run.train, TrainConfig)
        run.model.build(100)
        if group == "attention":
            assert run.model.attention == option  # the attention group writes straight into the model config


def test_a_value_the_schema_accepts_but_the_dataclass_refuses_is_a_config_error():
    from gpt.errors import ConfigError

    for override, message in [("train.learning_rate=nan", "train.learning_rate must be positive, got nan"),
                              ("train.beta2=1.5", "train.beta2 must be in [0, 1), got 1.5"),
                              ("data.name=a/b", "data.name must be a plain folder name"),
                              ("model.n_head=5", "must be divisible by model.n_head (5)"),
                              ("precision=fp8", "unknown precision 'fp8'"),
                              ("+train.lerning_rate=1", "unknown config key train.lerning_rate; valid keys of train: "
                                                        "max_iters, batch_size"),
                              ("+model.n_layers=3", "unknown config key model.n_layers; valid keys of model: n_layer"),
                              ("+sed=3", "unknown config key sed; valid keys: designs, model, data")]:
        with pytest.raises(ConfigError, match=re.escape(message)):
            typed(compose_train(override, "out_dir=x"))
    with pytest.raises(ConfigError, match="data.path must be given"):
        typed(compose_train("data=text", "out_dir=x"))


def test_every_attention_kernel_has_a_config_file():
    assert options("attention") == attention.available()


def test_train_defaults():
    cfg = compose_train("out_dir=x")
    assert cfg.model.n_layer == 4 and cfg.model.attention == "sdpa" and cfg.data.name == "stdlib_char"
    assert cfg.device.type == "auto" and cfg.precision == "auto"
    assert typed(cfg).train == TrainConfig()


def test_generate_and_prepare_configs_compose():
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        gen = compose(config_name="generate", overrides=["ckpt=runs/x"])
        assert gen.model is None and gen.device.type == "auto"
        gen = compose(config_name="generate", overrides=["ckpt=runs/x", "attention=manual"])
        assert gen.model.attention == "manual" and typed(gen).model.attention_backend is None
        prep = compose(config_name="prepare", overrides=["data=text", "data.path=somewhere"])
        assert prep.data.source == "path"


# every script's config, with what it must be given, and the dataclass it becomes
SCRIPT_CONFIGS = {
    "train": ([], "RunConfig"), "generate": (["ckpt=runs/x"], "GenerateConfig"),
    "prepare": ([], "PrepareConfig"), "eval": (["ckpt=runs/x"], "EvalConfig"),
    "export": (["ckpt=runs/x"], "ExportConfig"),
    "visualize_attention": (["ckpt=runs/x"], "VisualizeConfig"), "interpret": (["ckpt=runs/x"], "InterpretConfig"),
    "bench_decode": ([], "BenchDecodeConfig"),
    "bench_attention": ([], "BenchAttentionConfig"), "bench_train": ([], "BenchTrainConfig"),
    "arena": ([], "ArenaConfig"), "memory": ([], "MemoryConfig"), "time_to_loss": ([], "TimeToLossConfig"),
    "probe": ([], "ProbeConfig"),
    "serve": (["ckpt=runs/x"], "ServeConfig"), "bench_serve": ([], "BenchServeConfig"),
    "chat": (["ckpt=runs/x"], "ChatCommandConfig"), "chat_demo": (["base=runs/x"], "ChatDemoConfig"),
    "train_tokenizer": (["out=tokenizers/x"], "TrainTokenizerConfig"), "eval_tokenizer": ([], "EvalTokenizerConfig"),
}


def test_every_script_config_composes_into_its_typed_config():
    assert sorted(SCRIPT_CONFIGS) == sorted(p.stem for p in CONFIGS.glob("*.yaml"))
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        for name, (overrides, cls) in SCRIPT_CONFIGS.items():
            assert type(typed(compose(config_name=name, overrides=overrides))).__name__ == cls, name
        for name in ("generate", "visualize_attention", "interpret", "export", "serve", "chat"):
            with pytest.raises(ConfigError, match="ckpt must be given"):
                typed(compose(config_name=name))
        with pytest.raises(ConfigError, match="out must be given"):
            typed(compose(config_name="train_tokenizer"))


@pytest.mark.parametrize("name", sorted(set(SCRIPT_CONFIGS) - {"memory"}))  # memory: python -m gpt.memory
def test_every_script_refuses_a_key_its_config_lacks_in_one_line(name):
    result = run_inline(name, *SCRIPT_CONFIGS[name][0], "no_such_key=1")
    assert result.returncode == 2, (name, result.stderr)
    assert result.stderr.startswith("error:") and "no_such_key" in result.stderr.splitlines()[0], result.stderr
    assert "Traceback" not in result.stderr and "hydra.cc" not in result.stderr


def test_overrides_are_type_checked():
    with pytest.raises(ConfigCompositionException, match="model.n_layer=many"):
        compose_train("model.n_layer=many")
    with pytest.raises(ConfigCompositionException, match="model.n_layers"):
        compose_train("model.n_layers=3")
    cfg = compose_train("model.n_layer=3", "model.attention=manual", "train.batch_size=7", "seed=5")
    assert (cfg.model.n_layer, cfg.model.attention, cfg.train.batch_size, cfg.seed) == (3, "manual", 7, 5)


@pytest.mark.parametrize(
    "name, params",
    [("gpt2", 124_439_808), ("gpt2-medium", 354_823_168), ("gpt2-large", 774_030_080), ("gpt2-xl", 1_557_611_200)],
)
def test_gpt2_family_has_published_sizes(name, params):
    cfg = compose_train(f"model={name}", "out_dir=x")
    with torch.device("meta"):
        model = GPT(typed(cfg).model.build(50257))
    assert model.num_params(non_embedding=False) == params


def test_attention_backend_and_architecture_options_reach_the_model_config():
    cfg = compose_train("attention=sdpa", "attention.backend=math", "model.n_kv_head=1", "model.window=8",
                        "model.designs=[rope]", "out_dir=x")
    mcfg = typed(cfg).model.build(100)
    assert (mcfg.attention_backend, mcfg.n_kv_head, mcfg.window, mcfg.designs) == ("math", 1, 8, ["rope"])
    assert typed(compose_train("out_dir=x")).model.build(100).attention_backend is None
    from gpt.errors import ConfigError

    with pytest.raises(ConfigError, match="model.attention_backend=flash is not a backend of attention=manual"):
        typed(compose_train("attention=manual", "model.attention_backend=flash", "out_dir=x")).model.build(100)
    # the keys' spellings from before the attention group wrote into model.* still work
    assert renamed(["attention.backend=math", "attention.name=manual", "attention=sdpa", "-m"]) == [
        "model.attention_backend=math", "model.attention=manual", "attention=sdpa", "-m"]

"""The Hydra glue: the typed schemas behind configs/ registered with Hydra, and the one step that turns a
composed config into its dataclass. Hydra checks every override against the schema (names and types);
the dataclasses check the values when they are built. Nothing else under gpt/ imports omegaconf.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.errors import HydraException, MissingConfigException, OverrideParseException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, MissingMandatoryValue, OmegaConfBaseException

from gpt.errors import ConfigError
from gpt.model.renamed import command_line_error as old_design_field
from gpt.validate import INT64

DESIGNS = "designs"  # every script's key (gpt.model.config.ScriptConfig) for the designs a user brings
# The attention= group is written straight into model (configs/attention/*.yaml); its keys' earlier spellings
RENAMED = {"attention.name": "model.attention", "attention.backend": "model.attention_backend"}


def refuse_unknown_keys(node: DictConfig, where: str = "") -> None:
    """Hydra's ``+key=value`` adds keys that no schema declares: refuse them, listing the valid ones."""
    if node._is_none():  # an optional group left out (e.g. generate's attention: null)
        return
    schema = OmegaConf.get_type(node)
    if dataclasses.is_dataclass(schema):
        known = [f.name for f in dataclasses.fields(schema)]
        unknown = [key for key in node.keys() if key not in known]
        if unknown:
            of = f" of {where[:-1]}" if where else ""
            raise ConfigError(f"unknown config key {where}{unknown[0]}; valid keys{of}: {', '.join(known)}",
                              hint="check the spelling; keys added with + must exist in the schema")
    for key, child in node.items_ex(resolve=False):
        if isinstance(child, DictConfig) and not child._is_none():  # an optional group left at null
            refuse_unknown_keys(child, f"{where}{key}.")


def typed(cfg: DictConfig) -> Any:
    """The composed config as its dataclass; every dataclass validates itself as it is built (ConfigError).

    The designs a user brings (``designs=[...]``) are loaded first, so the model config may name them."""
    bring_designs(cfg)
    refuse_unknown_keys(cfg)
    refuse_huge_integers(cfg)
    try:
        return OmegaConf.to_object(cfg)
    except MissingMandatoryValue as err:
        key = err.full_key or str(err)
        raise ConfigError(f"{key} must be given (it has no default)",
                          hint=f"add {key}=<value> to the command") from None
    except OmegaConfBaseException as err:  # a value OmegaConf cannot convert or interpolate
        raise composition_error(err) from None


def refuse_huge_integers(cfg: DictConfig) -> None:
    """Refuse an integer beyond 64 bits anywhere in the config (seed=2**70): no setting means one, and torch,
    numpy and the file formats would each fail on it in their own way."""
    todo: list[tuple[str, Any]] = [("", OmegaConf.to_container(cfg, resolve=False))]
    while todo:
        where, node = todo.pop()
        if isinstance(node, dict):
            todo += [(f"{where}.{k}" if where else str(k), v) for k, v in node.items()]
        elif isinstance(node, list):
            todo += [(f"{where}[{i}]", v) for i, v in enumerate(node)]
        elif isinstance(node, int) and not isinstance(node, bool) and not INT64[0] <= node <= INT64[1]:
            raise ConfigError(f"{where}={node} is beyond the range of a 64-bit integer",
                              hint="no setting takes a number that large")


def composition_error(err: BaseException) -> ConfigError | None:
    """A Hydra or OmegaConf error met while composing a command's config, as one line naming the key (None when
    ``err`` is not one): an unknown group option or key, a value of the wrong type, an override Hydra cannot parse."""
    if isinstance(err, ConfigError):  # the command line's own check (renamed: an old design field)
        return err
    cause = err.__cause__ if isinstance(err.__cause__, OmegaConfBaseException) else err
    if isinstance(err, MissingConfigException) and err.missing_cfg_file and err.options is not None:
        group, _, name = err.missing_cfg_file.rpartition("/")
        return ConfigError(f"unknown {group}={name}; valid: {', '.join(err.options) or 'none'}",
                           hint=f"pick one of the {group} options (configs/{group}/)")
    if isinstance(err, OverrideParseException):
        return ConfigError(f"cannot read the override {err.override!r}: {err.message.splitlines()[0]}",
                           hint="write key=value; quote values with brackets, commas or spaces ('key=[1,2]')")
    if isinstance(cause, (ConfigKeyError, ConfigAttributeError)) and cause.full_key:
        schema = cause.object_type if dataclasses.is_dataclass(cause.object_type) else None
        parent = cause.full_key.rpartition(".")[0]
        valid = f"; valid keys{f' of {parent}' if parent else ''}: " + ", ".join(
            f.name for f in dataclasses.fields(schema)) if schema else ""
        return ConfigError(f"unknown config key {cause.full_key}{valid}",
                           hint="check the spelling (--cfg job prints every key)")
    if isinstance(cause, OmegaConfBaseException) or isinstance(err, HydraException):
        key = getattr(cause, "full_key", None)
        first = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
        return ConfigError(first + (f" ({key})" if key and key not in first else ""),
                           hint="check the command's overrides")
    return None


def bring_designs(cfg: DictConfig) -> None:
    """Load the files, packages or modules a script's ``designs`` key names (gpt.model.config.ScriptConfig), before the
    model config that may name their designs is checked."""
    sources = cfg.get(DESIGNS) if DESIGNS in cfg else None
    if sources:
        from gpt.designs import loading

        loading.load_all([str(s) for s in sources])


# schema name (as configs/<script>.yaml names it in its defaults) -> the dataclass, imported only when registered,
# so that registering generate's schema does not load the training package
SCHEMAS = {
    "train": "gpt.train.config:RunConfig",
    "generate": "gpt.inference.generate:GenerateConfig",
    "chat": "gpt.inference.chat:ChatCommandConfig",
    "chat_demo": "benchmarks.chat_demo:ChatDemoConfig",
    "prepare": "gpt.data.config:PrepareConfig",
    "export": "gpt.weights.export:ExportConfig",
    "visualize": "gpt.inference.visualize:VisualizeConfig",
    "interpret": "gpt.interpret.command:InterpretConfig",
    "eval": "gpt.evaluation.config:EvalConfig",
    "bench_decode": "gpt.bench.decode:BenchDecodeConfig",
    "bench_attention": "gpt.bench.attention:BenchAttentionConfig",
    "bench_train": "gpt.bench.train:BenchTrainConfig",
    "arena": "gpt.arena.arena:ArenaConfig",
    "time_to_loss": "gpt.arena.time_to_loss:TimeToLossConfig",
    "probe": "gpt.probes.probe:ProbeConfig",
    "memory": "gpt.memory:MemoryConfig",
    "serve": "gpt.serve.config:ServeConfig",
    "bench_serve": "gpt.bench.serve:BenchServeConfig",
    "train_tokenizer": "gpt.evaluation.tokenizer_train:TrainTokenizerConfig",
    "eval_tokenizer": "gpt.evaluation.tokenizer:EvalTokenizerConfig",
}


def schema(name: str) -> type:
    """The dataclass behind configs/<name>.yaml's ``<name>_schema``."""
    module, _, cls = SCHEMAS[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def renamed(overrides: list[str]) -> list[str]:
    """Overrides with their keys' earlier spellings (RENAMED) replaced, so command lines from before still run; a
    design's setting (``model.design_options.rope.base=5e5``) set or added alike (``++``: the mapping holds only
    the designs given). An old design field (``model.qk_norm=true``) is a ConfigError giving its new spelling."""
    def rename(override: str) -> str:
        problem = old_design_field(override)
        if problem is not None:
            raise problem
        key, sep, value = override.partition("=")
        if sep and key.startswith("model.design_options."):
            return "++" + override
        return RENAMED.get(key, key) + sep + value if sep else override

    return [rename(override) for override in overrides]


def register(*names: str) -> None:
    """Register the named schemas (all, when none is named) with Hydra's ConfigStore as ``<name>_schema``, and
    respell the command line's renamed keys (the scripts call this before Hydra reads sys.argv)."""
    sys.argv[1:] = renamed(sys.argv[1:])
    cs = ConfigStore.instance()
    for name in names or SCHEMAS:
        cs.store(name=f"{name}_schema", node=schema(name))

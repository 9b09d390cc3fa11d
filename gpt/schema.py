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
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from gpt.errors import ConfigError

DESIGNS = "designs"  # every script's key (gpt.config.ScriptConfig) for the designs a user brings
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
    try:
        return OmegaConf.to_object(cfg)
    except MissingMandatoryValue as err:
        key = err.full_key or str(err)
        raise ConfigError(f"{key} must be given (it has no default)",
                          hint=f"add {key}=<value> to the command") from None


def bring_designs(cfg: DictConfig) -> None:
    """Load the files, packages or modules a script's ``designs`` key names (gpt.config.ScriptConfig), before the
    model config that may name their designs is checked."""
    sources = cfg.get(DESIGNS) if DESIGNS in cfg else None
    if sources:
        from gpt.designs import loading

        loading.load_all([str(s) for s in sources])


# schema name (as configs/<script>.yaml names it in its defaults) -> the dataclass, imported only when registered,
# so that registering generate's schema does not load the training package
SCHEMAS = {
    "train": "gpt.train.config:RunConfig",
    "generate": "gpt.generate:GenerateConfig",
    "prepare": "gpt.data.config:PrepareConfig",
    "export": "gpt.export:ExportConfig",
    "visualize": "gpt.visualize:VisualizeConfig",
    "eval": "gpt.evaluation.config:EvalConfig",
    "bench_decode": "gpt.bench.decode:BenchDecodeConfig",
    "bench_attention": "gpt.bench.attention:BenchAttentionConfig",
    "bench_train": "gpt.bench.train:BenchTrainConfig",
    "arena": "gpt.bench.arena:ArenaConfig",
    "time_to_loss": "gpt.bench.time_to_loss:TimeToLossConfig",
    "memory": "gpt.memory:MemoryConfig",
}


def schema(name: str) -> type:
    """The dataclass behind configs/<name>.yaml's ``<name>_schema``."""
    module, _, cls = SCHEMAS[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def renamed(overrides: list[str]) -> list[str]:
    """Overrides with their keys' earlier spellings (RENAMED) replaced, so command lines from before still run."""
    def rename(override: str) -> str:
        key, sep, value = override.partition("=")
        return RENAMED.get(key, key) + sep + value if sep else override

    return [rename(override) for override in overrides]


def register(*names: str) -> None:
    """Register the named schemas (all, when none is named) with Hydra's ConfigStore as ``<name>_schema``, and
    respell the command line's renamed keys (the scripts call this before Hydra reads sys.argv)."""
    sys.argv[1:] = renamed(sys.argv[1:])
    cs = ConfigStore.instance()
    for name in names or SCHEMAS:
        cs.store(name=f"{name}_schema", node=schema(name))

"""The Hydra glue: the typed schemas behind configs/ registered with Hydra, and the one step that turns a
composed config into its dataclass. Hydra checks every override against the schema (names and types);
the dataclasses check the values when they are built. Nothing else under gpt/ imports omegaconf.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from gpt.errors import ConfigError


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
    """The composed config as its dataclass; every dataclass validates itself as it is built (ConfigError)."""
    refuse_unknown_keys(cfg)
    try:
        return OmegaConf.to_object(cfg)
    except MissingMandatoryValue as err:
        key = err.full_key or str(err)
        raise ConfigError(f"{key} must be given (it has no default)",
                          hint=f"add {key}=<value> to the command") from None


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


def register(*names: str) -> None:
    """Register the named schemas (all, when none is named) with Hydra's ConfigStore as ``<name>_schema``."""
    cs = ConfigStore.instance()
    for name in names or SCHEMAS:
        cs.store(name=f"{name}_schema", node=schema(name))

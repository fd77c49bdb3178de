"""Run configuration: typed dataclasses with verl's keys, YAML recipes, overrides.

The package itself stays light (no torch, no scorers): reward worker
processes import the schema. The checks (`thinkrl.config.checks.validate`),
which know the algorithm registries, are imported from their module.
"""

from thinkrl.config.loading import config_to_dict, flatten_keys, load_config
from thinkrl.config.schema import Config

__all__ = ["Config", "config_to_dict", "flatten_keys", "load_config"]

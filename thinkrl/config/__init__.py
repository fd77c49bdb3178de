"""Run configuration: typed dataclasses with verl's keys, YAML recipes, overrides, checks."""

from thinkrl.config.checks import DerivedSizes, execution_backend, validate
from thinkrl.config.inactive import inactive_settings
from thinkrl.config.loading import config_to_dict, flatten_keys, load_config
from thinkrl.config.schema import Config

__all__ = ["Config", "DerivedSizes", "execution_backend", "config_to_dict", "flatten_keys", "inactive_settings", "load_config", "validate"]

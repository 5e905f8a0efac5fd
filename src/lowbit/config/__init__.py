"""Run configuration: options with their precedence (default < TOML < command line) and TOML configs in
MASE's layout, validated before any work starts."""

from lowbit.config.options import OPTIONS, EffectiveOptions, Option, check_option_value, merge_options
from lowbit.config.toml_config import RunConfig, load_run_config, na_to_none, none_to_na, parse_run_config, read_toml

__all__ = ["EffectiveOptions", "OPTIONS", "Option", "RunConfig", "check_option_value", "load_run_config",
           "merge_options", "na_to_none", "none_to_na", "parse_run_config", "read_toml"]  # fmt: skip

"""The opsctl config file (see docs/health.md, "Configuration")."""

from opsctl.config.schema import Config, ConfigError, duration_seconds, load_config, parse_config

__all__ = ["Config", "ConfigError", "duration_seconds", "load_config", "parse_config"]

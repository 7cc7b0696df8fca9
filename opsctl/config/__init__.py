"""The opsctl config file (see docs/health.md, "Configuration")."""

from opsctl.config.schema import Config, Duration, duration_seconds, load_config, parse_config
from opsctl.errors import ConfigError

__all__ = ["Config", "ConfigError", "Duration", "duration_seconds", "load_config", "parse_config"]

"""prom."""

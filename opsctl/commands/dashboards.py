"""`opsctl dashboards export` and `opsctl rules export --format grafana`: the Grafana dashboards for the
config in effect. They need grafana-foundation-sdk, an extra that head nodes do not install."""

from pathlib import Path

import click

from opsctl.config import Config, load_config
from opsctl.errors import ConfigError, ExitCode

MISSING_SDK = ("the dashboards need grafana-foundation-sdk: pip install 'opsctl[dashboards]' "
               "(on the machine that renders them, not on head nodes)")


def _renderers():  # imported late: the SDK is optional
    try:
        from opsctl.dashboards import render, render_all
    except ImportError:
        raise ConfigError(MISSING_SDK) from None
    return render, render_all


def gpu_dashboard(config: Config) -> str:
    """The dashboard of the catalog's GPU rules (what `rules export --format grafana` prints)."""
    render, _ = _renderers()
    return render(config, "opsctl-gpu")


def export_dashboards(config_path, out_dir) -> ExitCode:
    _, render_all = _renderers()
    rendered = render_all(load_config(config_path))
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name, text in rendered.items():
            (out / name).write_text(text)
    except OSError as err:
        raise ConfigError(f"--out {out}: {err.strerror}") from None
    click.echo(f"wrote {len(rendered)} dashboards to {out}: {', '.join(sorted(rendered))}")
    return ExitCode.OK

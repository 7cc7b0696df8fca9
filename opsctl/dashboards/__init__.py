"""opsctl's Grafana dashboards, generated with grafana-foundation-sdk from the health catalog and the
config, so their thresholds are the ones `opsctl health` and the alerts use.

The SDK is an extra (`pip install 'opsctl[dashboards]'`): head nodes never import this package.
`dashboards/*.json` in the repository is `render_all` of the default config; a unit test keeps it so.
"""

from opsctl.config.schema import Config
from opsctl.dashboards import gpu, infiniband, overview, runs, storage
from opsctl.dashboards.common import Site, encode
from opsctl.health.catalog import load_catalog

BUILDERS = {module.UID: module.build for module in (overview, gpu, infiniband, storage, runs)}


def render_all(config: Config) -> dict[str, str]:
    """File name -> dashboard JSON, for every dashboard."""
    site = Site(config, {rule.id: rule for rule in load_catalog(config)})
    return {f"{uid}.json": encode(build(site)) for uid, build in BUILDERS.items()}


def render(config: Config, uid: str) -> str:
    site = Site(config, {rule.id: rule for rule in load_catalog(config)})
    return encode(BUILDERS[uid](site))

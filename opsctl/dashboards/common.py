"""What every opsctl dashboard shares: the datasource and node/GPU variables, links between the
dashboards, panel defaults, thresholds drawn from the catalog, and the deterministic JSON encoding.

Every panel and query variable names its datasource as `${datasource}`, the dashboard's datasource
variable, never a datasource UID: the dashboards work with whatever Prometheus datasource a site has.
"""

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import heatmap, prometheus, stat, statetimeline, table, text, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import prometheus as pm
from grafana_foundation_sdk.models import text as tm

from opsctl.config.schema import Config
from opsctl.health.catalog import Rule

DATASOURCE = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
TAG = "opsctl"
# An H200 SXM draws at most 700 W (NVIDIA H200 product brief); more means a misreading or a fault.
H200_POWER_LIMIT_WATTS = 700.0
SEVERITY_COLOUR = {"fail": "red", "warn": "orange"}
# Every dashboard, by uid: the overview links to the others, the others back to the overview.
TITLES = {
    "opsctl-overview": "opsctl: cluster overview",
    "opsctl-gpu": "opsctl: GPU health",
    "opsctl-infiniband": "opsctl: InfiniBand fabric",
    "opsctl-storage": "opsctl: storage",
    "opsctl-runs": "opsctl: health runs",
}
Panel = Any  # any panel builder of the SDK (each panel type has its own class)


@dataclass(frozen=True)
class Site:
    """The config a dashboard is rendered for: job names, the node label, the catalog's thresholds."""

    config: Config
    rules: dict[str, Rule]

    @property
    def node(self) -> str:
        return self.config.node_mapping.target_label or "instance"

    @property
    def dcgm(self) -> str:
        return f'job="{self.config.prometheus.jobs["dcgm"]}"'

    @property
    def node_exporter(self) -> str:
        return f'job="{self.config.prometheus.jobs.get("node")}"'

    @property
    def exporters(self) -> str:
        return f'job=~"{"|".join(self.config.prometheus.jobs.values())}"'

    def on_node(self) -> str:
        return f'{self.node}=~"$node"'

    def on_gpu(self) -> str:
        return f'{self.node}=~"$node", gpu=~"$gpu"'


# ---- queries and thresholds -------------------------------------------------------------------
def query(expr: str, legend: str = "", ref: str = "A", instant: bool = False) -> prometheus.Dataquery:
    q = prometheus.Dataquery().expr(expr).ref_id(ref).datasource(DATASOURCE)
    if legend:
        q = q.legend_format(legend)
    return q.instant() if instant else q.range()


def steps(base: str, *marks: tuple[float, str]) -> db.ThresholdsConfig:
    """Absolute thresholds: `base` colour below the first mark, each mark's colour from its value up."""
    return db.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps(
        [dm.Threshold(value=None, color=base), *(dm.Threshold(value=v, color=c) for v, c in marks)])


def rule_thresholds(rule: Rule) -> db.ThresholdsConfig:
    """The rule's threshold from the catalog (with the site's overrides): breaching values are coloured by
    the rule's severity, on the side its operator points to."""
    colour = SEVERITY_COLOUR[rule.severity]
    if rule.op in ("<", "<="):
        return steps(colour, (rule.threshold, "green"))
    return steps("green", (rule.threshold, colour))


def panel_expr(rule: Rule) -> str:
    """The rule's PromQL for plotting: the value it compares with the threshold, without the hold (a
    hold of 5m would hide a fault for 5 minutes): a range over Grafana's rate interval instead of the
    rule's hold, and the value before opsctl's hold wrapper (Rule.plot_expr) for the rules it holds. A
    counter's `and x offset <hold>` (the series must exist at the window's start) follows the window."""
    expr = rule.plot_expr or rule.expr
    return expr.replace(f"[{rule.hold}]", "[$__rate_interval]").replace(f"offset {rule.hold}",
                                                                        "offset $__rate_interval")


def mapping(values: dict[int, tuple[str, str]]) -> list[dm.ValueMapping]:
    return [dm.ValueMap(options={str(v): dm.ValueMappingResult(text=t, color=c, index=i)
                                 for i, (v, (t, c)) in enumerate(values.items())})]


# ---- panels -----------------------------------------------------------------------------------
def _common(panel: Panel, title: str, description: str, unit: str, height: int, width: int) -> Panel:
    return panel.title(title).description(description).datasource(DATASOURCE).unit(unit).height(height).span(width)


def graph(title: str, description: str, unit: str, targets: Sequence[prometheus.Dataquery],
          thresholds: db.ThresholdsConfig | None = None, width: int = 12, height: int = 8) -> Panel:
    panel = _common(timeseries.Panel(), title, description, unit, height, width).targets(list(targets))
    panel = panel.legend(cb.VizLegendOptions().display_mode(cm.LegendDisplayMode.LIST)
                         .placement(cm.LegendPlacement.BOTTOM).show_legend(True))
    if thresholds is not None:
        panel = panel.thresholds(thresholds).thresholds_style(
            cb.GraphThresholdsStyleConfig().mode(cm.GraphThresholdsStyleMode.LINE))
    return panel


def rule_graph(site: Site, rule_id: str, title: str, filter_on: str, unit: str = "short", width: int = 12,
               by_device: bool = True) -> Panel:
    """One catalog rule, plotted per node and device, with the rule's threshold drawn in.

    `filter_on` keeps the series of the picked nodes (and GPUs or HCAs): `and on (...)` against a
    selector of the variables, so that the catalog's PromQL stays exactly as the alert has it. A rule whose
    device label no selector has (firmware-drift's `firmware`) is kept by node alone: by_device=False."""
    rule = site.rules[rule_id]
    legend = "{{" + site.node + "}}" + (" {{" + rule.device_label + "}}" if rule.device_label else "")
    keys = ", ".join([site.node, rule.device_label] if rule.device_label and by_device else [site.node])
    expr = f"({panel_expr(rule)}) and on ({keys}) group by ({keys}) ({filter_on})"
    description = (f"Rule `{rule.id}` ({rule.severity}, {rule.action}): alerts and `opsctl health` act when the "
                   f"value is {rule.op} {rule.threshold:g} (hold {rule.hold}). {rule.description}\n\n"
                   f"Remediation: {rule.remediation}")
    return graph(f"{rule.id}: {title}", description, unit, [query(expr, legend)], rule_thresholds(rule), width)


def single(title: str, description: str, unit: str, expr: str, thresholds: db.ThresholdsConfig,
           mappings: list[dm.ValueMapping] | None = None, legend: str = "", width: int = 6, height: int = 5) -> Panel:
    panel = _common(stat.Panel(), title, description, unit, height, width).with_target(query(expr, legend))
    panel = panel.thresholds(thresholds).color_mode(cm.BigValueColorMode.BACKGROUND).graph_mode(
        cm.BigValueGraphMode.NONE).reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]))
    return panel.mappings(mappings) if mappings else panel


def timeline(title: str, description: str, unit: str, expr: str, legend: str,
             thresholds: db.ThresholdsConfig, mappings: list[dm.ValueMapping] | None = None,
             width: int = 24, height: int = 10) -> Panel:
    """A state timeline: one row per node, coloured by thresholds or value mappings (not 512 lines)."""
    panel = _common(statetimeline.Panel(), title, description, unit, height, width)
    panel = panel.with_target(query(expr, legend)).thresholds(thresholds).show_value(cm.VisibilityMode.NEVER)
    panel = panel.color_scheme(db.FieldColor().mode(dm.FieldColorModeId.THRESHOLDS))
    return panel.mappings(mappings) if mappings else panel


def heat(title: str, description: str, unit: str, expr: str, width: int = 12, height: int = 8) -> Panel:
    """How the values of every GPU are spread over time, one cell per bucket and step."""
    panel = _common(heatmap.Panel(), title, description, unit, height, width).with_target(query(expr))
    return panel.calculate(True).y_axis(heatmap.YAxisConfig().unit(unit))


def listing(title: str, description: str, expr: str, width: int = 12, height: int = 8) -> Panel:
    """An instant table of the series that match (one row per series, its labels as columns)."""
    q = query(expr, instant=True).format(pm.PromQueryFormat.TABLE)
    return _common(table.Panel(), title, description, "short", height, width).with_target(q)


def note(title: str, content: str, width: int = 24, height: int = 3) -> Panel:
    return text.Panel().title(title).mode(tm.TextMode.MARKDOWN).content(content).height(height).span(width)


# ---- dashboards -------------------------------------------------------------------------------
def variables(site: Site, hca: bool = False) -> list[Any]:
    found: list[Any] = [
        db.DatasourceVariable("datasource").label("Prometheus").type("prometheus"),
        _query_var("node", "Node", f"label_values(up{{{site.exporters}}}, {site.node})"),
        _query_var("gpu", "GPU", f'label_values(DCGM_FI_DEV_GPU_TEMP{{{site.dcgm}, {site.on_node()}}}, gpu)'),
    ]
    if hca:
        found.append(_query_var("hca", "HCA", f"label_values(node_infiniband_state_id{{{site.node_exporter}, "
                                              f"{site.on_node()}}}, device)"))
    return found


def _query_var(name: str, label: str, expr: str) -> db.QueryVariable:
    return (db.QueryVariable(name).label(label).datasource(DATASOURCE).query(expr).multi(True).include_all(True)
            .all_value(".*").refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(dm.VariableSort.NATURAL_ASC)
            .current(dm.VariableOption(selected=True, text="All", value="$__all")))


def new_dashboard(uid: str, description: str, site: Site, hca: bool = False) -> db.Dashboard:
    dash = (db.Dashboard(TITLES[uid]).uid(uid).description(description).tags([TAG]).refresh("1m")
            .time("now-6h", "now").timezone("browser").tooltip(dm.DashboardCursorSync.CROSSHAIR)
            .variables(variables(site, hca)))
    targets = [u for u in TITLES if u != uid] if uid == "opsctl-overview" else ["opsctl-overview"]
    for target in targets:
        dash = dash.link(db.DashboardLink(TITLES[target]).type(dm.DashboardLinkType.LINK).url(f"/d/{target}")
                         .include_vars(True).keep_time(True).icon("dashboard").as_dropdown(False)
                         .target_blank(False).tooltip(""))
    return dash


def encode(dash: db.Dashboard) -> str:
    """Deterministic JSON for file provisioning; panels are numbered in order (Grafana needs unique ids)."""
    built = dash.build()
    panels = list(built.panels or [])
    for index, panel in enumerate(panels, start=1):
        panel.id_val = index
    return json.dumps(built, cls=JSONEncoder, sort_keys=True, indent=2) + "\n"

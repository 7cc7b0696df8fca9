"""The fabric test's picture and metrics (opsctl/fabrictest/figures.py, picture.py, textfile.py, the InfiniBand
dashboard's fabric test row): a cell per node and rail in the layout, coloured by bandwidth, the culprit
outlined and labelled, the history strip, well-formed SVG and HTML, the textfile's figures and the command's
--html/--svg/--png. Runs are made with the fabric test's own scheduler (pairing.isolate) and FabricTest; that a
browser shows the grid is tests/component/test_fabric_picture_browser.py."""

import json
import sys
import xml.etree.ElementTree as ET

import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

import opsctl.fabrictest.run as fabric_run
from opsctl.actor.result import ActionResult
from opsctl.cli import main
from opsctl.clients import Clients
from opsctl.config import parse_config
from opsctl.dashboards import render_all
from opsctl.errors import ExitCode
from opsctl.fabrictest import textfile
from opsctl.fabrictest.figures import (
    AMBER,
    GREEN,
    LIGHT_GREEN,
    NOT_TESTED,
    RED,
    YELLOW,
    PastRun,
    Scale,
    figures,
    mix,
    natural_key,
    rgb,
)
from opsctl.fabrictest.pairing import Measurement, RailVerdict, isolate
from opsctl.fabrictest.picture import HISTORY_RUNS, OUTLINE, SVG_NS, html, layout, svg
from opsctl.fabrictest.run import FabricTest
from tests.unit.fakes import FakeSlurm, gpu_nodes
from tests.unit.test_fabric_test import FakeRemote

HCAS = [f"mlx5_{i}" for i in range(8)]
SCALE = Scale(expected_gbps=400.0, slow_gbps=360.0)
NS = {"svg": SVG_NS, "h": "http://www.w3.org/1999/xhtml"}


def fabric_run_with(bad: dict[tuple[str, int], float], count: int = 12, seed: int = 1) -> FabricTest:
    nodes = [f"gpu{i:03d}" for i in range(1, count + 1)]

    def measure(tests):
        return [Measurement(t.a, t.b, rail, min(bad.get((t.a, rail), 392.3), bad.get((t.b, rail), 392.3)))
                for t in tests for rail in range(len(HCAS))]

    verdicts, rounds = isolate(nodes, measure, rails=len(HCAS), seed=seed)
    return FabricTest(verdicts=verdicts, rounds={}, rails=HCAS, rounds_run=rounds, pair_tests=0, rail_tests=0,
                      slow_gbps=360.0, action=ActionResult(), exit_code=ExitCode.FAILING)


# ---- figures and colours ------------------------------------------------------------------------------------
def test_colours_follow_the_bandwidth_against_the_expected_rate():
    assert SCALE.colour(None) == NOT_TESTED
    assert SCALE.colour(0.0) == SCALE.colour(0.5) == RED
    assert SCALE.colour(200.0) == AMBER
    assert SCALE.colour(359.999) == mix(AMBER, YELLOW, 159.999 / 160)
    assert SCALE.colour(360.0) == LIGHT_GREEN
    assert SCALE.colour(400.0) == SCALE.colour(450.0) == GREEN
    # Every passing value is green (more green than red), every failing one is not.
    for gbps in range(0, 420, 5):
        r, g, _ = rgb(SCALE.colour(float(gbps)))
        assert (g > r + 20) == (gbps >= 360), gbps
    assert [label for _, label in SCALE.legend()] == ["0 dead", "100", "200 half", "<360 slow", "360", "400 full",
                                                      "not tested"]


def test_a_culprit_shows_its_worst_measurement_and_its_reference_partners_their_own():
    result = fabric_run_with({("gpu005", 3): 196.0})
    found = {(f.node, f.rail): f for f in figures(result)}
    assert [key for key, f in found.items() if f.culprit] == [("gpu005", 3)]
    assert found["gpu005", 3].gbps == 196.0 and found["gpu005", 3].verdict == "slow"
    # Every partner of the culprit measured 196 against it, yet shows what it reached with the others.
    partners = {m.b if m.a == "gpu005" else m.a for m in result.verdicts["gpu005"][3].evidence}
    assert len(partners) >= 2
    assert all(found[p, 3].gbps == pytest.approx(392.3) for p in partners)
    assert all(f.gbps is not None and f.gbps >= 360 for f in found.values() if f.verdict == "good")


def test_a_rail_never_measured_is_not_tested_and_nodes_sort_naturally():
    result = fabric_run_with({}, count=4)
    result.verdicts["gpu10"] = {rail: RailVerdict("unknown") for rail in range(len(HCAS))}
    result.verdicts["gpu9"] = result.verdicts.pop("gpu004")
    found = figures(result)
    assert [f.node for f in found[::8]] == ["gpu001", "gpu002", "gpu003", "gpu9", "gpu10"]
    assert {f.gbps for f in found if f.node == "gpu10"} == {None}
    assert sorted(["n10", "n9", "n1a", "n1"], key=natural_key) == ["n1", "n1a", "n9", "n10"]


# ---- the layout -----------------------------------------------------------------------------------------------
def test_every_node_and_rail_has_one_cell_inside_the_page_and_none_overlap():
    result = fabric_run_with({("gpu007", 2): 0.0}, count=40)
    page = layout(result, SCALE)
    assert sorted((c.figure.node, c.figure.rail) for c in page.cells) == sorted(
        (node, rail) for node in result.verdicts for rail in range(len(HCAS)))
    boxes = [c.box for c in page.cells]
    assert all(0 <= b.x and b.x + b.w <= page.width and 0 <= b.y and b.y + b.h <= page.height for b in boxes)
    edges = sorted({(b.x, b.y) for b in boxes})
    assert len(edges) == len(boxes)
    assert all(abs(a.x - b.x) >= a.w or abs(a.y - b.y) >= a.h for i, a in enumerate(boxes) for b in boxes[i + 1:])
    # 40 nodes: a block of 32 columns, then one of 8 below it; rails go down, the same order in each block.
    assert len({b.x for b in boxes}) == 32
    assert page.cell("gpu033", 0).box.y > page.cell("gpu032", 7).box.y
    assert page.cell("gpu001", 1).box.y > page.cell("gpu001", 0).box.y


def test_cells_are_coloured_by_their_bandwidth():
    page = layout(fabric_run_with({("gpu004", 6): 196.0, ("gpu009", 1): 0.0}), SCALE)
    assert page.cell("gpu004", 6).fill == SCALE.colour(196.0) == mix(RED, AMBER, 195 / 199)
    assert page.cell("gpu009", 1).fill == RED
    assert page.cell("gpu001", 0).fill == SCALE.colour(392.3)
    assert {c.fill for c in page.cells} == {SCALE.colour(196.0), RED, SCALE.colour(392.3)}


def svg_cells(document: str) -> dict[tuple[str, int], ET.Element]:
    root = ET.fromstring(document)
    return {(g.get("data-node"), int(g.get("data-rail"))): g for g in root.iter(f"{{{SVG_NS}}}g")}


def test_the_culprit_is_outlined_and_labelled_and_no_other_cell_is():
    page = layout(fabric_run_with({("gpu004", 6): 196.0}), SCALE)
    cells = svg_cells(svg(page))
    assert len(cells) == 12 * 8
    culprit = cells["gpu004", 6]
    outlines = [r for r in culprit.findall("svg:rect", NS) if r.get("stroke") == OUTLINE]
    assert len(outlines) == 1 and float(outlines[0].get("stroke-width")) >= 2
    assert [t.text for t in culprit.findall("svg:text", NS)] == ["196", "slow"]
    assert culprit.get("data-verdict") == "slow" and "slow, 196 Gb/s" in culprit.find("svg:title", NS).text
    assert [key for key, g in cells.items() if any(r.get("stroke") for r in g.findall("svg:rect", NS))] == [
        ("gpu004", 6)]
    texts = [t.text for t in ET.fromstring(svg(page)).iter(f"{{{SVG_NS}}}text")]
    assert "culprit: gpu004 mlx5_6 (rail 6) slow 196 Gb/s" in texts


def test_an_unresolved_rail_is_dashed_with_a_question_mark():
    result = fabric_run_with({}, count=4)
    result.verdicts["gpu002"][5] = RailVerdict("unknown", result.verdicts["gpu002"][5].evidence)
    cell = svg_cells(svg(layout(result, SCALE)))["gpu002", 5]
    assert [r.get("stroke-dasharray") for r in cell.findall("svg:rect", NS) if r.get("stroke")] == ["3,2"]
    assert [t.text for t in cell.findall("svg:text", NS)][-1] == "?"


def test_the_history_strip_shows_earlier_runs_newest_first_under_each_column():
    result = fabric_run_with({("gpu004", 6): 196.0}, count=4)
    named = [i % 2 == 0 for i in range(HISTORY_RUNS + 3)]  # the newest run (12) named it, the one before did not
    runs = [PastRun(f"run {i}", {("gpu004", 6): 180.0 if bad else 392.0}, frozenset({("gpu004", 6)}) if bad
                    else frozenset()) for i, bad in enumerate(named)]
    page = layout(result, SCALE, runs)
    assert len(page.bands) == HISTORY_RUNS * 4 * 8
    labels = list(dict.fromkeys(b.run for b in page.bands))
    assert labels == [f"run {i}" for i in range(HISTORY_RUNS + 2, 2, -1)]  # the last ten, newest first
    newest = [b for b in page.bands if b.run == labels[0]]
    column = page.cell("gpu004", 6).box.x
    band = next(b for b in newest if (b.node, b.rail) == ("gpu004", 6))
    assert band.box.x == column and band.culprit and band.fill == SCALE.colour(180.0)
    assert {b.fill for b in newest if (b.node, b.rail) != ("gpu004", 6)} == {NOT_TESTED}  # not in that run
    assert min(b.box.y for b in page.bands) > page.cell("gpu004", 7).box.y
    assert layout(result, SCALE).bands == []
    older = next(b for b in page.bands if b.run == labels[1] and (b.node, b.rail) == ("gpu004", 6))
    assert older.box.y > band.box.y and not older.culprit


def test_the_svg_and_the_html_are_well_formed_and_self_contained():
    page = layout(fabric_run_with({("gpu004", 6): 196.0}), SCALE, [PastRun("12-01", {}, frozenset())], "run <1> & 2")
    drawn = svg(page)
    root = ET.fromstring(drawn)
    assert root.tag == f"{{{SVG_NS}}}svg" and float(root.get("width")) == page.width
    assert root.find("svg:title", NS).text == "run <1> & 2"
    document = ET.fromstring(html(page))
    assert document.tag == "{http://www.w3.org/1999/xhtml}html"
    body = document.find("h:body", NS)
    assert body[0].tag == f"{{{SVG_NS}}}svg", "the SVG comes first, at the page's top left"
    assert document.find("h:head/h:title", NS).text == "run <1> & 2"
    tags = {element.tag.split("}")[1] for element in document.iter()}
    assert not tags & {"script", "link", "img", "iframe", "object", "image", "use"}
    refs = [value for element in document.iter() for name, value in element.attrib.items()
            if name.endswith("href") or name == "src"]
    assert refs == []


# ---- metrics ----------------------------------------------------------------------------------------------
def samples(text: str) -> dict[str, dict[tuple, float]]:
    found: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            found.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return found


def test_the_textfile_holds_each_rails_gbps_and_whether_it_is_a_culprit():
    result = fabric_run_with({("gpu004", 6): 196.0})
    result.verdicts["gpu012"][2] = RailVerdict("unknown")
    got = samples(textfile.metrics_text(result, SCALE, 1765000000.0))
    key = (("device", "mlx5_6"), ("rail", "6"), ("slurm_node", "gpu004"))
    assert got[textfile.GBPS][key] == 196.0 and got[textfile.CULPRIT][key] == 1
    assert got[textfile.RAIL_STATUS][key] == 2
    assert sum(got[textfile.CULPRIT].values()) == 1 and len(got[textfile.CULPRIT]) == 12 * 8
    untested = (("device", "mlx5_2"), ("rail", "2"), ("slurm_node", "gpu012"))
    assert untested not in got[textfile.GBPS] and got[textfile.RAIL_STATUS][untested] == 1
    assert len(got[textfile.GBPS]) == 12 * 8 - 1
    assert got[textfile.SLOW_GBPS][()] == 360 and got[textfile.EXPECTED][()] == 400
    assert got[textfile.TIMESTAMP][()] == 1765000000.0


def test_the_textfile_goes_beside_opsctls_own_and_a_failure_only_warns(tmp_path):
    assert str(textfile.fabric_textfile("/var/lib/prometheus/node-exporter/opsctl.prom")) == \
        "/var/lib/prometheus/node-exporter/opsctl-fabric-test.prom"
    result = fabric_run_with({})
    warnings: list[str] = []
    assert textfile.write_metrics(None, result, SCALE, 0.0, warnings.append) is None
    missing = tmp_path / "absent" / "opsctl.prom"
    assert textfile.write_metrics(str(missing), result, SCALE, 0.0, warnings.append) is None
    assert len(warnings) == 1 and "fabric test metrics not written" in warnings[0]


def test_the_dashboard_plots_what_the_textfile_holds_with_the_sites_slow_threshold():
    config = parse_config({"ib": {"slow_gbps": 300}}, "t", {})
    dashboard = json.loads(render_all(config)["opsctl-infiniband.json"])
    panels = dashboard["panels"]
    row = [p["title"] for p in panels].index("Fabric test: last results")
    fabric = {p["title"]: p for p in panels[row + 1:]}
    grid = fabric["Fabric test: Gb/s per node and rail"]
    assert grid["type"] == "state-timeline" and grid["fieldConfig"]["defaults"]["unit"] == "Gbits"
    assert textfile.GBPS in grid["targets"][0]["expr"] and '$node' in grid["targets"][0]["expr"]
    assert [(s["value"], s["color"]) for s in grid["fieldConfig"]["defaults"]["thresholds"]["steps"]] == [
        (None, "red"), (1.0, "orange"), (300, "green")]
    assert textfile.CULPRIT in fabric["Fabric test: culprits"]["targets"][0]["expr"]
    assert textfile.TIMESTAMP in fabric["Fabric test: age of the results"]["targets"][0]["expr"]


# ---- the command ------------------------------------------------------------------------------------------
@pytest.fixture
def fabric(tmp_path, monkeypatch):
    FakeRemote.bad, FakeRemote.unreachable, FakeRemote.wedged, FakeRemote.commands = {}, set(), set(), []
    monkeypatch.setattr(fabric_run, "ParamikoRemote", FakeRemote)
    hosts = "\n".join(f"        gpu{i:03d}: {{ansible_host: 10.20.1.{i}}}" for i in range(1, 9))
    (tmp_path / "hosts.yml").write_text(f"all:\n  children:\n    gpu_nodes:\n      hosts:\n{hosts}\n")
    return FakeRemote


def fabric_cli(tmp_path, *args):
    config = parse_config({"metrics": {"textfile": str(tmp_path / "opsctl.prom")}}, "t",
                          env={"OPSCTL_STATE_DIR": str(tmp_path / "state")})
    clients = Clients(config=config, slurm=FakeSlurm(gpu_nodes(8)))
    return CliRunner().invoke(main, ["ib", "fabric-test", "--inventory", str(tmp_path), *args], obj=clients)


def test_the_command_draws_the_run_and_exports_its_metrics(tmp_path, fabric):
    fabric.bad = {("gpu003", "mlx5_2"): 196.0}
    result = fabric_cli(tmp_path, "--html", str(tmp_path / "f.html"), "--svg", str(tmp_path / "f.svg"))
    assert result.exit_code == 1, result.output
    cells = svg_cells((tmp_path / "f.svg").read_text())
    assert len(cells) == 64 and cells["gpu003", 2].get("data-verdict") == "slow"
    page = ET.fromstring((tmp_path / "f.html").read_text())
    assert svg_cells(ET.tostring(page.find("h:body/svg:svg", NS), encoding="unicode")).keys() == cells.keys()
    got = samples((tmp_path / "opsctl-fabric-test.prom").read_text())
    assert got[textfile.CULPRIT][(("device", "mlx5_2"), ("rail", "2"), ("slurm_node", "gpu003"))] == 1
    assert not (tmp_path / "opsctl.prom").exists(), "opsctl's own textfile is the health run's"


def test_without_cairosvg_a_png_is_refused_before_any_test_runs(tmp_path, fabric, monkeypatch):
    monkeypatch.setitem(sys.modules, "cairosvg", None)  # import cairosvg raises ImportError
    result = fabric_cli(tmp_path, "--png", str(tmp_path / "f.png"))
    assert result.exit_code == 2 and "--png needs cairosvg" in result.output
    assert fabric.commands == []


def test_a_picture_that_cannot_be_written_is_a_usage_error_after_the_report(tmp_path, fabric):
    result = fabric_cli(tmp_path, "--html", str(tmp_path / "absent" / "f.html"))
    assert result.exit_code == 2
    assert f"--html {tmp_path / 'absent' / 'f.html'}: No such file or directory" in result.output
    assert "rounds: 1" in result.output

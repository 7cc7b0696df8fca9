"""The picture of a fabric test run (`opsctl ib fabric-test --html/--svg/--png FILE`): the rails x nodes grid,
one cell per node and rail coloured by its measured bandwidth against the expected rate (opsctl.fabrictest.figures
says which measurement and which colour), culprits outlined and labelled, rails left unresolved outlined dashed,
a legend with the numbers, the culprits listed, and a history strip of earlier runs when there are any.

Nodes go left to right in blocks of `BLOCK` (a scalable unit of 32 nodes fits a screen), rails top to bottom.
Under each block, the strip has one thin band per earlier run (newest first), that run's rails of the same
nodes, so a node's history reads straight down its column.

`layout` places everything (pure; the tests read the cells' places from it); `svg` draws a layout with
presentation attributes only, no CSS or script, so that browsers and cairosvg draw it alike; `html` wraps that
SVG in one self-contained page (no network, no JavaScript); `png` renders the SVG with cairosvg (the extra
opsctl[picture], Debian's python3-cairosvg). `write_pictures` writes the files a person named.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from opsctl.errors import ConfigError
from opsctl.fabrictest.figures import PastRun, RailFigure, Scale, figures, natural_key
from opsctl.fabrictest.pairing import UNKNOWN
from opsctl.fabrictest.run import FabricTest
from opsctl.fileio import write_atomic

BLOCK = 32  # nodes per block of columns
CELL_W, CELL_H, GAP = 40, 30, 2
BAND_RAIL_H = 4  # a rail's height in a history band
HISTORY_RUNS = 10  # earlier runs drawn, newest first
MARGIN, RAIL_LABEL_W, TITLE_H, CHAR_W = 12, 96, 46, 6.2
OUTLINE = "#000000"
FONT = "DejaVu Sans, Verdana, sans-serif"
SVG_NS = "http://www.w3.org/2000/svg"


@dataclass(frozen=True)
class Box:
    x: float
    y: float
    w: float
    h: float


@dataclass(frozen=True)
class Cell:
    figure: RailFigure
    box: Box
    fill: str


@dataclass(frozen=True)
class BandCell:
    run: str
    node: str
    rail: int
    box: Box
    fill: str
    culprit: bool


@dataclass(frozen=True)
class Text:
    x: float
    y: float
    text: str
    size: float = 11
    anchor: str = "start"
    weight: str = "normal"
    rotate: bool = False  # read bottom to top (node names over their columns)
    fill: str = "#222222"


@dataclass
class Layout:
    width: float
    height: float
    title: str
    cells: list[Cell] = field(default_factory=list)
    bands: list[BandCell] = field(default_factory=list)
    texts: list[Text] = field(default_factory=list)
    swatches: list[tuple[Box, str]] = field(default_factory=list)

    def cell(self, node: str, rail: int) -> Cell:
        return next(c for c in self.cells if c.figure.node == node and c.figure.rail == rail)


def layout(result: FabricTest, scale: Scale, history: Sequence[PastRun] = (), title: str = "") -> Layout:
    """Place the grid, the history strip, the legend and the culprit list (top to bottom)."""
    found = figures(result)
    nodes = sorted({f.node for f in found}, key=natural_key)
    rails = len(result.rails)
    runs = list(history)[-HISTORY_RUNS:][::-1]
    name_h = math.ceil(max((len(n) for n in nodes), default=4) * CHAR_W) + 8
    band_h = rails * BAND_RAIL_H + 4
    block_h = name_h + rails * (CELL_H + GAP) + (len(runs) * band_h + 16 if runs else 0) + 14
    columns = min(BLOCK, max(1, len(nodes)))
    width = MARGIN * 2 + RAIL_LABEL_W + columns * (CELL_W + GAP)
    page = Layout(width=max(width, 560.0), height=0, title=title or "Fabric test")
    culprits = [f for f in found if f.culprit]
    page.texts += [Text(MARGIN, 20, page.title, 15, weight="bold"), Text(MARGIN, 38, _summary(result, culprits))]
    by_cell = {(f.node, f.rail): f for f in found}
    y: float = TITLE_H
    for start in range(0, len(nodes), BLOCK):
        _block(page, nodes[start:start + BLOCK], result.rails, by_cell, scale, runs, y, name_h)
        y += block_h
    y = _legend(page, scale, y)
    for f in culprits:
        page.texts.append(Text(MARGIN, y, f"culprit: {f.node} {f.hca} (rail {f.rail}) {f.verdict} "
                                          f"{f.gbps or 0.0:.0f} Gb/s", 11, weight="bold"))
        y += 16
    page.width, page.height = math.ceil(page.width), math.ceil(y + MARGIN)  # whole pixels: a PNG's size
    return page


def _summary(result: FabricTest, culprits: list[RailFigure]) -> str:
    named = f"{len(culprits)} (listed below)" if culprits else "none"
    return (f"{len(result.verdicts)} nodes x {len(result.rails)} rails, {result.rounds_run} rounds, "
            f"{result.pair_tests} pair tests; slow below {result.slow_gbps:g} Gb/s; culprits: {named}")


def _block(page: Layout, nodes: list[str], hcas: list[str], by_cell: dict[tuple[str, int], RailFigure],
           scale: Scale, runs: list[PastRun], top: float, name_h: float) -> None:
    left = MARGIN + RAIL_LABEL_W
    grid_top = top + name_h
    for column, node in enumerate(nodes):
        x = left + column * (CELL_W + GAP)
        named = any(by_cell[node, rail].culprit for rail in range(len(hcas)) if (node, rail) in by_cell)
        page.texts.append(Text(x + CELL_W / 2 + 4, grid_top - 4, node, 10, rotate=True,
                               weight="bold" if named else "normal", fill="#b2182b" if named else "#222222"))
        for rail in range(len(hcas)):
            figure = by_cell.get((node, rail))
            if figure is not None:
                box = Box(x, grid_top + rail * (CELL_H + GAP), CELL_W, CELL_H)
                page.cells.append(Cell(figure, box, scale.colour(figure.gbps)))
    for rail, hca in enumerate(hcas):
        page.texts.append(Text(left - 6, grid_top + rail * (CELL_H + GAP) + CELL_H / 2 + 4, f"{hca} (rail {rail})",
                               10, anchor="end"))
    if not runs:
        return
    band_top = grid_top + len(hcas) * (CELL_H + GAP) + 14
    page.texts.append(Text(MARGIN, band_top - 4, "earlier runs, newest first", 9))
    for index, run in enumerate(runs):
        y = band_top + index * (len(hcas) * BAND_RAIL_H + 4)
        page.texts.append(Text(left - 6, y + len(hcas) * BAND_RAIL_H - 1, run.label, 9, anchor="end"))
        for column, node in enumerate(nodes):
            for rail in range(len(hcas)):
                box = Box(left + column * (CELL_W + GAP), y + rail * BAND_RAIL_H, CELL_W, BAND_RAIL_H - 1)
                page.bands.append(BandCell(run.label, node, rail, box, scale.colour(run.gbps.get((node, rail))),
                                           (node, rail) in run.culprits))


def _legend(page: Layout, scale: Scale, top: float) -> float:
    page.texts.append(Text(MARGIN, top + 12, f"Gb/s measured by ib_write_bw against the expected "
                                             f"{scale.expected_gbps:g} Gb/s; culprits outlined, unresolved "
                                             "rails dashed", 10))
    x: float = MARGIN
    for value, label in scale.legend():
        box = Box(x, top + 20, 28, 16)
        page.swatches.append((box, scale.colour(value)))
        page.texts.append(Text(x + 32, top + 32, label, 10))
        x += 32 + len(label) * CHAR_W + 14
    page.width = max(page.width, x + MARGIN)
    return top + 60


# ---- SVG, HTML, PNG --------------------------------------------------------------------------------------------
def svg(page: Layout) -> str:
    """The layout as a standalone SVG document (XML)."""
    parts = [f'<svg xmlns="{SVG_NS}" width="{page.width:g}" height="{page.height:g}" '
             f'viewBox="0 0 {page.width:g} {page.height:g}" font-family={quoteattr(FONT)}>',
             f"<title>{escape(page.title)}</title>",
             f'<rect x="0" y="0" width="{page.width:g}" height="{page.height:g}" fill="#ffffff"/>']
    parts += [_cell(c) for c in page.cells]
    parts += [_band(b) for b in page.bands]
    parts += [f'<rect x="{b.x:g}" y="{b.y:g}" width="{b.w:g}" height="{b.h:g}" fill="{fill}" stroke="#888888" '
              'stroke-width="0.5"/>' for b, fill in page.swatches]
    parts += [_text(t) for t in page.texts]
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _cell(cell: Cell) -> str:
    f, b = cell.figure, cell.box
    value = "-" if f.gbps is None else f"{f.gbps:.0f}"
    tip = f"{f.node} {f.hca} (rail {f.rail}): {f.verdict}, {value} Gb/s, {f.measurements} measurements"
    parts = [f'<g data-node={quoteattr(f.node)} data-rail="{f.rail}" data-verdict="{f.verdict}">',
             f"<title>{escape(tip)}</title>",
             f'<rect x="{b.x:g}" y="{b.y:g}" width="{b.w:g}" height="{b.h:g}" fill="{cell.fill}"/>']
    if f.culprit:  # the outline lies inside the cell, so neighbours never cover it
        parts.append(f'<rect x="{b.x + 1.5:g}" y="{b.y + 1.5:g}" width="{b.w - 3:g}" height="{b.h - 3:g}" '
                     f'fill="none" stroke="{OUTLINE}" stroke-width="3"/>')
    elif f.verdict == UNKNOWN:
        parts.append(f'<rect x="{b.x + 1:g}" y="{b.y + 1:g}" width="{b.w - 2:g}" height="{b.h - 2:g}" '
                     'fill="none" stroke="#444444" stroke-width="1.5" stroke-dasharray="3,2"/>')
    label = f.verdict if f.culprit else ("?" if f.verdict == UNKNOWN else "")
    centre = b.x + b.w / 2
    parts.append(_text(Text(centre, b.y + (13 if label else 19), value, 10, "middle",
                            "bold" if f.culprit else "normal")))
    if label:
        parts.append(_text(Text(centre, b.y + 25, label, 8, "middle", "bold")))
    parts.append("</g>")
    return "".join(parts)


def _band(cell: BandCell) -> str:
    b = cell.box
    stroke = f' stroke="{OUTLINE}" stroke-width="1"' if cell.culprit else ""
    return (f'<rect x="{b.x:g}" y="{b.y:g}" width="{b.w:g}" height="{b.h:g}" fill="{cell.fill}"{stroke}>'
            f"<title>{escape(f'{cell.run}: {cell.node} rail {cell.rail}')}</title></rect>")


def _text(t: Text) -> str:
    turn = f' transform="rotate(-90 {t.x:g} {t.y:g})"' if t.rotate else ""
    return (f'<text x="{t.x:g}" y="{t.y:g}" font-size="{t.size:g}" text-anchor="{t.anchor}" '
            f'font-weight="{t.weight}" fill="{t.fill}"{turn}>{escape(t.text)}</text>')


def html(page: Layout) -> str:
    """One self-contained page: the SVG inline at the top left (its cells sit where the layout says), no
    external resource, no script. Well-formed XML as well (XHTML syntax)."""
    return ("<!DOCTYPE html>\n"
            '<html xmlns="http://www.w3.org/1999/xhtml" lang="en">\n<head>\n<meta charset="utf-8"/>\n'
            f"<title>{escape(page.title)}</title>\n"
            "<style>html, body { margin: 0; padding: 0; background: #ffffff; } svg { display: block; }</style>\n"
            "</head>\n<body>\n" + svg(page) + "</body>\n</html>\n")


def png(svg_text: str) -> bytes:
    """The SVG rendered by cairosvg, at one pixel per unit."""
    cairosvg = png_renderer()
    data = cairosvg.svg2png(bytestring=svg_text.encode())
    if not isinstance(data, bytes):
        raise ConfigError("--png: cairosvg returned no PNG")
    return data


def png_renderer() -> Any:
    """cairosvg, or a one-line error saying what to install (checked before a run that writes a PNG)."""
    try:
        import cairosvg  # type: ignore[import-untyped]
    except (ImportError, OSError) as err:  # OSError: the cairo library itself is missing
        raise ConfigError(f"--png needs cairosvg and libcairo2: pip install 'opsctl[picture]' or apt install "
                          f"python3-cairosvg ({err})") from None
    return cairosvg


def write_pictures(result: FabricTest, scale: Scale, html_path: str | None = None, svg_path: str | None = None,
                   png_path: str | None = None, history: Sequence[PastRun] = (), title: str = "") -> None:
    """Write each picture asked for, atomically; a file that cannot be written is a usage error (exit 2)."""
    if not (html_path or svg_path or png_path):
        return
    page = layout(result, scale, history, title)
    drawn = svg(page)
    outputs: list[tuple[str, str, str | bytes]] = []
    if html_path:
        outputs.append(("--html", html_path, html(page)))
    if svg_path:
        outputs.append(("--svg", svg_path, drawn))
    if png_path:
        outputs.append(("--png", png_path, png(drawn)))
    for option, path, data in outputs:
        try:
            write_atomic(Path(path), data, 0o644)
        except OSError as err:
            raise ConfigError(f"{option} {path}: {err.strerror or err}") from None

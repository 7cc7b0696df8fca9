"""The fabric test's picture as a person sees it: the --html page of a run with one culprit, opened in real
headless Chromium (Debian's `chromium`, `--screenshot`), shows the culprit's cell in its bandwidth's colour with
the outline around it, and a healthy cell in green; the --png (cairosvg) shows the same. The run is made with
the fabric test's own scheduler and types (opsctl.fabrictest.pairing, FabricTest), no hardware. Where each cell
is comes from the layout the picture was drawn from."""

import math
import shutil
import struct
import subprocess
import zlib

import pytest

from opsctl.actor.result import ActionResult
from opsctl.errors import ExitCode
from opsctl.fabrictest.figures import GREEN, PastRun, Scale, rgb
from opsctl.fabrictest.pairing import Measurement, isolate
from opsctl.fabrictest.picture import OUTLINE, html, layout, png, svg, write_pictures
from opsctl.fabrictest.run import FabricTest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
NODES = [f"gpu{i:03d}" for i in range(1, 17)]
HCAS = [f"mlx5_{i}" for i in range(8)]
CULPRIT, HEALTHY = ("gpu010", 3), ("gpu002", 6)
SCALE = Scale(expected_gbps=400.0, slow_gbps=360.0)


def run_with_one_culprit() -> FabricTest:
    bad = {CULPRIT: 196.0}

    def measure(tests):
        return [Measurement(t.a, t.b, rail, min(bad.get((t.a, rail), 392.3), bad.get((t.b, rail), 392.3)))
                for t in tests for rail in range(len(HCAS))]

    verdicts, rounds = isolate(NODES, measure, rails=len(HCAS), seed=7)
    return FabricTest(verdicts=verdicts, rounds={}, rails=HCAS, rounds_run=rounds, pair_tests=0, rail_tests=0,
                      slow_gbps=360.0, action=ActionResult(), exit_code=ExitCode.FAILING)


def history() -> list[PastRun]:
    return [PastRun(f"12-0{day} 10:00", {(n, r): 392.0 for n in NODES for r in range(len(HCAS))} | {CULPRIT: 170.0},
                    frozenset({CULPRIT})) for day in (1, 2)]


def decode_png(data: bytes) -> tuple[int, int, list[bytes], int]:
    """Width, height, rows and bytes per pixel of an 8-bit RGB or RGBA PNG, not interlaced (what Chromium and
    cairo write)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            idat += body
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and colour in (2, 6) and interlace == 0, (depth, colour, interlace)
    bpp = 3 if colour == 2 else 4
    raw, stride, rows, previous = zlib.decompress(idat), width * bpp, [], bytes(width * bpp)
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1:start + 1 + stride])
        for i in range(stride):
            left = line[i - bpp] if i >= bpp else 0
            up, corner = previous[i], previous[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                line[i] = (line[i] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)) & 0xFF
        rows.append(bytes(line))
        previous = rows[-1]
    return width, height, rows, bpp


def pixel(image: tuple[int, int, list[bytes], int], x: float, y: float) -> tuple[int, int, int]:
    _, _, rows, bpp = image
    row, i = rows[int(y)], int(x) * bpp
    return row[i], row[i + 1], row[i + 2]


def near(got: tuple[int, int, int], colour: str, tolerance: int = 6) -> bool:
    return all(abs(a - b) <= tolerance for a, b in zip(got, rgb(colour), strict=True))


def assert_culprit_shown(image, page) -> None:
    culprit, healthy = page.cell(*CULPRIT), page.cell(*HEALTHY)
    assert culprit.figure.verdict == "slow" and healthy.figure.verdict == "good"
    assert culprit.fill == SCALE.colour(196.0) and not near(rgb(culprit.fill), GREEN, 40)
    box = culprit.box
    inside = pixel(image, box.x + 5, box.y + 5)  # inside the outline, clear of the centred text
    assert near(inside, culprit.fill), f"culprit cell is {inside}, drawn {culprit.fill}"
    outline = pixel(image, box.x + 1, box.y + box.h / 2)
    assert near(outline, OUTLINE, 40), f"culprit outline is {outline}"
    b = healthy.box
    assert near(pixel(image, b.x + 5, b.y + 5), healthy.fill) and near(rgb(healthy.fill), GREEN, 30)
    assert not near(pixel(image, b.x + 1, b.y + b.h / 2), OUTLINE, 40), "a healthy cell is outlined"


@pytest.mark.skipif(CHROMIUM is None, reason="needs chromium (make deps-test)")
def test_headless_chromium_shows_the_culprits_cell_in_its_colour_with_its_outline(tmp_path):
    page = layout(run_with_one_culprit(), SCALE, history(), "fabric test")
    (tmp_path / "fabric.html").write_text(html(page))
    shot = tmp_path / "shot.png"
    proc = subprocess.run(
        [CHROMIUM, "--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars", "--no-first-run",
         "--force-device-scale-factor=1", "--force-color-profile=srgb", f"--user-data-dir={tmp_path / 'profile'}",
         f"--window-size={math.ceil(page.width)},{math.ceil(page.height)}", f"--screenshot={shot}",
         (tmp_path / "fabric.html").as_uri()], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and shot.exists(), proc.stderr[-2000:]
    image = decode_png(shot.read_bytes())
    assert image[0] >= page.width - 1 and image[1] >= page.height - 1
    assert_culprit_shown(image, page)


def test_the_png_is_the_same_picture(tmp_path):
    pytest.importorskip("cairosvg", reason="needs cairosvg (the test extra)")
    page = layout(run_with_one_culprit(), SCALE, history())
    image = decode_png(png(svg(page)))
    assert (image[0], image[1]) == (math.ceil(page.width), math.ceil(page.height))
    assert_culprit_shown(image, page)


def test_write_pictures_writes_the_png_asked_for(tmp_path):
    pytest.importorskip("cairosvg", reason="needs cairosvg (the test extra)")
    result = run_with_one_culprit()
    write_pictures(result, SCALE, png_path=str(tmp_path / "fabric.png"))
    assert_culprit_shown(decode_png((tmp_path / "fabric.png").read_bytes()), layout(result, SCALE))

"""Regenerate opsctl/health/xid_catalog.json, opsctl's copy of NVIDIA's XID catalog.

NVIDIA publishes the catalog as a table and a spreadsheet ("Analyzing Xid Errors with the Xid Catalog",
https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html): per XID its mnemonic, description
and two resolution buckets, the immediate action (RESET_GPU, RESTART_BM, RESTART_APP, IGNORE,
CONTACT_SUPPORT, WORKFLOW_XID_48, ...) and the investigatory one. gpud (github.com/leptonai/gpud,
Apache-2.0) keeps a generated Go copy of that sheet, components/accelerator/nvidia/xid/
catalog_generated.go; this script reads that file, whose header names the sheet's URL and when it was
read, so that the JSON records both. What each bucket means to opsctl is opsctl/health/xid.py's.

Run: python3 tools/gen_xid_catalog.py CATALOG_GENERATED_GO COMMIT > opsctl/health/xid_catalog.json
(tests/fixtures/gpu/gpud_xid_catalog_generated.go.txt is the copy the shipped JSON was made from.)
"""

import json
import re
import sys
from pathlib import Path

_HEADER = re.compile(r"^// Generated at (?P<at>\S+)\. Source: (?P<url>\S+)$", re.M)
_BLOCK = re.compile(r"^var catalogEntries = \[\]catalogEntry\{\n(?P<body>.*?)^\}", re.M | re.S)
_STRING = r'"((?:[^"\\]|\\.)*)"'
_ENTRY = re.compile(r"\{Code: (?P<code>\d+), Mnemonic: " + _STRING + ", Description: " + _STRING
                    + ", ImmediateResolution: " + _STRING + ", InvestigatoryResolution: " + _STRING + r"\},")


def _text(go_string: str) -> str:
    """A Go string literal's body as text, its line breaks as spaces (the sheet's cells wrap)."""
    return " ".join(json.loads(f'"{go_string}"').split())


def parse(go_source: str) -> dict:
    header = _HEADER.search(go_source)
    block = _BLOCK.search(go_source)
    if header is None or block is None:
        raise SystemExit("gen_xid_catalog: not a gpud catalog_generated.go (no header or catalogEntries)")
    entries = []
    for line in block["body"].splitlines():
        match = _ENTRY.search(line)
        if match is None:
            raise SystemExit(f"gen_xid_catalog: cannot read catalog line: {line.strip()[:80]}")
        code, mnemonic, description, immediate, investigatory = match.groups()
        entries.append({"code": int(code), "mnemonic": _text(mnemonic), "description": _text(description),
                        "immediate": _text(immediate), "investigatory": _text(investigatory)})
    return {"source": header["url"], "read_at": header["at"], "entries": entries}


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        raise SystemExit(__doc__)
    catalog = parse(Path(argv[0]).read_text())
    catalog["via"] = (f"github.com/leptonai/gpud @ {argv[1]} : components/accelerator/nvidia/xid/"
                      "catalog_generated.go")
    sys.stdout.write(json.dumps(catalog, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

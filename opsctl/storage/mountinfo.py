r"""/proc/self/mountinfo (proc(5)), one line per mount:

    36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
    (1)(2)(3)   (4)   (5)      (6)      (7)   (8) (9)   (10)         (11)

Optional fields (7) end at the lone "-". Spaces, tabs, newlines and backslashes in paths are octal escapes
(\\040). Where two mounts share a mount point, the later line is on top and is the one a path reaches.
"""

import re
from dataclasses import dataclass

from opsctl.errors import SourceUnavailable

_ESCAPE = re.compile(r"\\([0-7]{3})")


@dataclass(frozen=True)
class Mount:
    point: str
    fstype: str
    source: str
    options: str  # the per-mount options (6), e.g. rw,relatime


def unescape(field: str) -> str:
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str, source: str = "mountinfo") -> dict[str, Mount]:
    """Mount point -> the mount on top of it."""
    mounts: dict[str, Mount] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        fields = line.split(" ")
        try:
            dash = fields.index("-", 6)
            point, options = fields[4], fields[5]
            fstype, device = fields[dash + 1], fields[dash + 2]
        except (ValueError, IndexError):
            raise SourceUnavailable(f"{source} line {number}: not a mountinfo line: {line[:120]!r}") from None
        if not (fields[0].isdigit() and point.startswith("/")):
            raise SourceUnavailable(f"{source} line {number}: not a mountinfo line: {line[:120]!r}")
        mounts[unescape(point)] = Mount(point=unescape(point), fstype=fstype, source=unescape(device),
                                        options=options)
    return mounts

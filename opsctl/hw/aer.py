"""PCIe Advanced Error Reporting counts of a node's GPUs and HCAs, read from sysfs.

Linux (4.19 and later) counts, per AER-capable device, the errors it saw in three files under
/sys/bus/pci/devices/<bdf>: aer_dev_correctable, aer_dev_nonfatal and aer_dev_fatal. Each holds one error
a line, its name then its count, and the total last (Documentation/ABI/testing/sysfs-bus-pci-devices-aer_stats;
drivers/pci/pcie/aer.c names them RxErr, BadTLP, ... since 5.x, "Receiver Error", "Bad TLP", ... before):

    RxErr 2
    BadTLP 0
    ...
    TOTAL_ERR_COR 2

Only the totals are read. A device without AER (or an older kernel) has no such file: it has no count.
Correctable errors are repaired by the link (a replay), yet their rise is a link going bad: a reseat, a
riser, a cable; uncorrectable ones have cost data or a reset already.
"""

from pathlib import Path

from opsctl.hw.pcie_tree import PCI_DEVICES

# severity -> (file, its total's name)
FILES = {"correctable": ("aer_dev_correctable", "TOTAL_ERR_COR"),
         "nonfatal": ("aer_dev_nonfatal", "TOTAL_ERR_NONFATAL"),
         "fatal": ("aer_dev_fatal", "TOTAL_ERR_FATAL")}


def parse_total(text: str, total: str) -> int | None:
    """The count on the `total` line of an aer_dev_* file; None when there is none."""
    for line in text.splitlines():
        name, _, count = line.strip().rpartition(" ")
        if name == total and count.isdigit():
            return int(count)
    return None


def read_aer(sysfs_root: str | Path, devices: dict[str, str]) -> dict[str, dict[str, int]]:
    """device name -> severity -> errors so far, for each device (name -> bdf) whose kernel counts them."""
    counts: dict[str, dict[str, int]] = {}
    for name, bdf in sorted(devices.items()):
        for severity, (file, total) in FILES.items():
            try:
                value = parse_total((Path(sysfs_root) / PCI_DEVICES / bdf / file).read_text(), total)
            except OSError:
                continue
            if value is not None:
                counts.setdefault(name, {})[severity] = value
    return counts

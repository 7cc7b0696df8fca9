"""The lab fabric model: what bandwidth an RDMA write test gets between two emulated HCAs.

A rail-optimised NDR fabric without congestion: a transfer runs at the slower of the two ports'
trained rates, times the efficiency a real CX-7 back-to-back test shows (ib_write_bw 65536 B,
392.34 of 400 Gb/s: tests/fixtures/infiniband/ib_write_bw_ib_read_bw_cx7_ndr_b2b_client.txt).
`ib-slow` on either end halves that rail; a port that is not ACTIVE carries nothing.
"""

from dataclasses import dataclass

from opsctl_lab.hardware import NodeHardware, stable_int

EFFICIENCY = 392.34 / 400.0
PEAK_OVER_AVG = 0.04  # Gb/s, as in the real capture (peak 392.38, average 392.34)


@dataclass(frozen=True)
class PortView:
    """What one end tells the other: enough for the model, nothing else."""

    node: str
    hca: str
    active: bool
    rate_gbps: float
    slow: bool

    @classmethod
    def of(cls, hw: NodeHardware, hca: str) -> "PortView":
        port = hw.hca_port(hca)
        return cls(node=hw.node, hca=hca, active=port["state"].startswith("4"),
                   rate_gbps=float(port["rate"].split()[0]), slow=hw.has("ib-slow", hca=hca))

    def to_dict(self) -> dict[str, str | bool | float]:
        return {"node": self.node, "hca": self.hca, "active": self.active, "rate_gbps": self.rate_gbps,
                "slow": self.slow}


def bandwidth_gbps(a: PortView, b: PortView) -> tuple[float, float]:
    """(peak, average) Gb/s of a write test between a and b; (0, 0) when a port is not active."""
    if not (a.active and b.active):
        return 0.0, 0.0
    link = min(a.rate_gbps, b.rate_gbps)
    if a.slow or b.slow:
        link /= 2
    # A small, stable per-pair spread, as repeated runs on real hardware show.
    pair = sorted([(a.node, a.hca), (b.node, b.hca)])
    average = round(link * EFFICIENCY - stable_int(*pair, "bw", modulo=30) / 100.0, 2)
    return round(average + PEAK_OVER_AVG, 2), average

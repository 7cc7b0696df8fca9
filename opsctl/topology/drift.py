"""Cabling drift: what differs between the live fabric and the accepted one (or a design), and what the live
fabric says about itself, each change named. Pure: the fabric in, a list of Drift out.

The live fabric alone shows (no record needed):
  cross-rail       an HCA on a leaf of another rail (the leaf's rail: the HCA name most of its HCAs share) -
                   drained;
  left-leaf-group  an HCA on a leaf outside its node's leaf group (the scalable unit that holds most of the
                   node's HCAs) - drained.
Against the accepted fabric or the design (`base`, a Fabric.record()):
  cross-rail, left-leaf-group  as above, when the leaf the HCA is on now has another rail or group than the
                   one it was on;
  moved            an HCA on another leaf of the same group - a warning;
  moved-port       an HCA on another port of the same leaf - a warning;
  missing-link     an HCA that was linked and is not (its port is down or its cable gone; the node check and
                   the health rules drain for a port that is down) - a warning;
  link-rate        an HCA's link at another width or speed (4xNDR -> 2xNDR) - a warning;
  new-link         an HCA that was not in the record (a new node, or one back) - a warning;
  fewer-uplinks    a leaf with fewer links to the switches above it - a warning (the switches' business, not
                   a node's);
  missing-switch, new-switch   a switch gone or new - a warning.
Only what moves a node's HCA out of its rail or leaf group drains the node (`opsctl:ib-cabling <hca> <what>`):
Slurm would place its jobs by a topology the node no longer has, and its traffic would cross the spines.
"""

from dataclasses import dataclass
from typing import Any

from opsctl.topology.fabric import Fabric, Hca

CROSS_RAIL, LEFT_GROUP, MOVED, MOVED_PORT = "cross-rail", "left-leaf-group", "moved", "moved-port"
MISSING_LINK, LINK_RATE, NEW_LINK = "missing-link", "link-rate", "new-link"
FEWER_UPLINKS, MISSING_SWITCH, NEW_SWITCH = "fewer-uplinks", "missing-switch", "new-switch"
DRAINS = (CROSS_RAIL, LEFT_GROUP)
KINDS = (CROSS_RAIL, LEFT_GROUP, MOVED, MOVED_PORT, MISSING_LINK, LINK_RATE, NEW_LINK, FEWER_UPLINKS, MISSING_SWITCH,
         NEW_SWITCH)


@dataclass(frozen=True)
class Drift:
    kind: str  # one of KINDS
    node: str  # "" for a switch's change
    hca: str
    rail: str  # "rail 3" (the HCA's place in ib.rails), or the HCA name when it has none
    switch: str  # the switch it is about (where the HCA is now, or the leaf)
    detail: str  # in words, for people

    @property
    def drains(self) -> bool:
        return self.kind in DRAINS

    @property
    def evidence(self) -> str:
        """The words of the drain reason after the rule: `mlx5_3 cross-rail rail4-su1-leaf`."""
        return f"{self.hca} {self.kind} {self.switch}"


def rail_of(hca: str, rails: tuple[str, ...]) -> str:
    return f"rail {rails.index(hca)}" if hca in rails else hca


def _rail_words(hca: str, rails: tuple[str, ...]) -> str:
    """`rail 4 (mlx5_4)`, or the HCA name alone when it is no rail of ib.rails."""
    return f"rail {rails.index(hca)} ({hca})" if hca in rails else hca


def _named(key: str, rail: str) -> str:
    """`gpu010 mlx5_3 (rail 3)`; the key alone when the HCA is no rail of ib.rails."""
    return key if key.endswith(f" {rail}") else f"{key} ({rail})"


def find_drift(live: Fabric, base: dict[str, Any] | None, rails: tuple[str, ...]) -> list[Drift]:
    """Every change: against the record `base` when there is one (and what the live fabric shows of the HCAs the
    record lacks), else what the live fabric shows of itself; one per HCA, then the switches'."""
    if base is None:
        return own_drift(live, rails)
    # An HCA of the record is judged by where the record had it and what the record says of the leaf it is on
    # now: when many HCAs move at once, the live majority of a leaf may be the moved ones.
    return [*_hca_drift(live, base, rails), *(d for d in own_drift(live, rails) if f"{d.node} {d.hca}" not in
                                               base["hcas"]), *_switch_drift(live, base)]


def own_drift(live: Fabric, rails: tuple[str, ...]) -> list[Drift]:
    out = []
    for hca in sorted(live.hcas.values(), key=lambda h: h.key):
        if not hca.switch:
            continue
        leaf, rail = live.switches[hca.switch], rail_of(hca.hca, rails)
        if leaf.rail and leaf.rail != hca.hca:
            out.append(Drift(CROSS_RAIL, hca.node, hca.hca, rail, leaf.name,
                             f"{_named(hca.key, rail)} is cabled to {leaf.name} port {hca.port}, a leaf of "
                             f"{_rail_words(leaf.rail, rails)}"))
        elif leaf.group != live.home.get(hca.node, leaf.group):
            out.append(Drift(LEFT_GROUP, hca.node, hca.hca, rail, leaf.name,
                             f"{_named(hca.key, rail)} is cabled to {leaf.name} port {hca.port} of leaf group "
                             f"{leaf.group}, while the node's other HCAs are in {live.home[hca.node]}"))
    return out


def _hca_drift(live: Fabric, base: dict[str, Any], rails: tuple[str, ...]) -> list[Drift]:
    switches, out = base["switches"], []
    for key, was in sorted(base["hcas"].items()):
        node, _, name = key.partition(" ")
        now, rail = live.hcas.get(key), rail_of(name, rails)
        before = switches.get(was["switch"], {})
        if not was["switch"]:
            continue
        if now is None or not now.switch:
            out.append(Drift(MISSING_LINK, node, name, rail, before.get("name", was["switch"]),
                             f"{_named(key, rail)} has no link; it was on {before.get('name')} port {was['port']}"))
        elif now.switch != was["switch"]:
            out.append(_moved(live, now, base, was, rails))
        elif now.port != was["port"]:
            out.append(Drift(MOVED_PORT, node, name, rail, before.get("name", ""),
                             f"{_named(key, rail)} is on port {now.port} of {before.get('name')}, "
                             f"was port {was['port']}"))
        elif now.rate != was["rate"]:
            out.append(Drift(LINK_RATE, node, name, rail, before.get("name", ""),
                             f"{_named(key, rail)} links at {now.rate}, was {was['rate']}"))
    for key in sorted(set(live.hcas) - set(base["hcas"])):
        hca = live.hcas[key]
        where = live.switches[hca.switch].name if hca.switch else ""
        out.append(Drift(NEW_LINK, hca.node, hca.hca, rail_of(hca.hca, rails), where,
                         f"{key} is new{f' on {where} port {hca.port}' if where else ''}"))
    return out


def _moved(live: Fabric, now: Hca, base: dict[str, Any], was: dict[str, Any], rails: tuple[str, ...]) -> Drift:
    """The HCA on another switch: its rail and group as the record knows the new switch (the live fabric's view
    when the switch is new)."""
    leaf, before, rail = live.switches[now.switch], base["switches"].get(was["switch"], {}), rail_of(now.hca, rails)
    known = base["switches"].get(now.switch, {"rail": leaf.rail, "group": leaf.group})
    place = f"{_named(now.key, rail)} is on {leaf.name} port {now.port}, was {before.get('name')} port {was['port']}"
    if before.get("rail") and known["rail"] and known["rail"] != before["rail"]:
        return Drift(CROSS_RAIL, now.node, now.hca, rail, leaf.name,
                     f"{place}: a leaf of {_rail_words(known['rail'], rails)}, not of "
                     f"{_rail_words(before['rail'], rails)}")
    if before.get("group") and known["group"] != before["group"]:
        return Drift(LEFT_GROUP, now.node, now.hca, rail, leaf.name,
                     f"{place}: leaf group {known['group']}, not {before['group']}")
    return Drift(MOVED, now.node, now.hca, rail, leaf.name, f"{place}, in the same leaf group {known['group']}")


def _switch_drift(live: Fabric, base: dict[str, Any]) -> list[Drift]:
    out = []
    for guid, was in sorted(base["switches"].items(), key=lambda item: item[1]["name"]):
        now = live.switches.get(guid)
        if now is None:
            out.append(Drift(MISSING_SWITCH, "", "", "", was["name"], f"switch {was['name']} ({guid}) is gone"))
        elif was["level"] == 0 and now.level == 0 and now.uplinks < was["uplinks"]:
            out.append(Drift(FEWER_UPLINKS, "", "", "", now.name,
                             f"leaf {now.name} has {now.uplinks} up-links, was {was['uplinks']}"))
    for guid in sorted(set(live.switches) - set(base["switches"])):
        name = live.switches[guid].name
        out.append(Drift(NEW_SWITCH, "", "", "", name, f"switch {name} ({guid}) is new"))
    return out

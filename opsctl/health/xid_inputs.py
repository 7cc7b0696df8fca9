"""The XID rules' raw series, read once per round for all of them (the recording rules' shared stage).

Every XID rule of the shipped catalog reads the same three series families over the whole fleet: the
windowed count (DCGM_EXP_XID_ERRORS_COUNT), the last-XID gauge (DCGM_FI_DEV_XID_ERRORS, read only on
targets without the count: `unless on(<by>) group by (<by>) (count)`) and the kernel log's count
(opsctl_node_kernel_xid_count). Evaluated by each of some 25 rules, that is two passes over every GPU's
series per rule and round. The recording group of the XID rules reads each family once instead, and
records only what is not zero, as opsctl:xid_input{opsctl_input="count"|"gauge"|"gauge_alone"|"kernel"}:

  count        max by (<by>, gpu, xid, window_size_in_ms) (<count>) != 0
  kernel       the same of the kernel log's count
  gauge        <gauge> != 0                        (every label kept: the rules filter it by value)
  gauge_alone  <gauge> != 0 unless on(<by>) group by (<by>) (<count>)

A healthy GPU has nothing there, so each rule's own stages then read a few series. The rules' decisions
do not change: a rule keeps only the series whose value is not certainly ok, and a zero (a count of 0, a
gauge that never saw an XID) is certainly ok for every XID rule (op ">", threshold 0, or the gauge compared
with a code); NaN and infinities are not zero, so they are kept. The count is taken per code first, and a
rule's `max by` over fewer labels takes the maximum of those maxima: the same number.

rewrite() turns a rule's expression into the same over opsctl:xid_input. It does so only for a rule of the
shipped catalog whose expression, op and threshold no file or override replaced (Rule.shipped), whose
gauge comparisons select codes, never 0; any other rule keeps a group of its own.
"""

import re
from dataclasses import dataclass

from opsctl.config.schema import Config
from opsctl.health.catalog import Rule

INPUT = "opsctl:xid_input"
INPUT_LABEL = "opsctl_input"
COUNT_METRIC = "DCGM_EXP_XID_ERRORS_COUNT"
GAUGE_METRIC = "DCGM_FI_DEV_XID_ERRORS"
KERNEL_METRIC = "opsctl_node_kernel_xid_count"
RAW_METRICS = (COUNT_METRIC, GAUGE_METRIC, KERNEL_METRIC)


@dataclass(frozen=True)
class Sources:
    """The raw selectors as the catalog spells them for a config."""

    by: str  # "node, job, instance"
    dcgm: str  # the dcgm-exporter scrape job
    node: str  # the node_exporter scrape job ("" without one)

    @property
    def count(self) -> str:
        return f'{COUNT_METRIC}{{job="{self.dcgm}"}}'

    @property
    def gauge(self) -> str:
        return f'{GAUGE_METRIC}{{job="{self.dcgm}"}}'

    @property
    def kernel(self) -> str:
        return f'{KERNEL_METRIC}{{job="{self.node}"}}'

    @property
    def without_count(self) -> str:
        """The catalog's guard that reads the gauge only on targets without the windowed count."""
        return f" unless on({self.by}) group by ({self.by}) ({self.count})"

    def expr(self, name: str) -> str:
        """What opsctl:xid_input records for one input."""
        per_code = f"{self.by}, gpu, xid, window_size_in_ms"
        return {"count": f"max by ({per_code}) ({self.count}) != 0",
                "kernel": f"max by ({per_code}) ({self.kernel}) != 0",
                "gauge": f"{self.gauge} != 0",
                "gauge_alone": f"{self.gauge} != 0{self.without_count}"}[name]

    def selector(self, name: str) -> str:
        """The start of a selector of one input, without its closing brace: a rule's own matchers follow."""
        return f'{INPUT}{{{INPUT_LABEL}="{name}"'


def sources(config: Config) -> Sources:
    return Sources(by=", ".join(config.node_mapping.by), dcgm=config.prometheus.jobs["dcgm"],
                   node=config.prometheus.jobs.get("node", ""))


# The gauge compared with a code: `== 79`, `== -1`, `>= 143 <= 150`, `> 172`, or `< 0` (nothing). Zero never
# passes these; a rule that compares the gauge otherwise (`< 5` holds for 0) is not rewritten.
_CODE_FILTER = re.compile(r"\s*(?:==\s*-?[1-9][0-9]*|>=?\s*[1-9][0-9]*(?:\s*<=\s*[1-9][0-9]*)?"
                          r"|<\s*0(?![.0-9]))")


@dataclass(frozen=True)
class Rewritten:
    expr: str  # the rule's expression (Rule.plot_expr or Rule.expr) over opsctl:xid_input
    inputs: frozenset[str]  # which inputs it reads


def rewrite(rule: Rule, src: Sources) -> Rewritten | None:
    """The rule's expression over the shared inputs, or None when it is not an XID rule of that shape."""
    if not rule.shipped or (rule.xid is None and not rule.xid_series):
        return None
    expr = rule.plot_expr or rule.expr
    inputs: set[str] = set()
    # Within `max by (<by>, gpu) (<gauge filter>) unless on(<by>) group by (<by>) (<count>)` the gauge is
    # read only where the count is missing: gauge_alone holds exactly that.
    head = f"max by ({src.by}, gpu) ("
    guarded = re.compile(re.escape(head) + r"(.*?)\)" + re.escape(src.without_count))
    for match in list(guarded.finditer(expr)):
        inner = match.group(1)
        if not _codes_only(inner, src):
            return None
        inputs.add("gauge_alone")
        expr = expr.replace(match.group(0), head + inner.replace(src.gauge, src.selector("gauge_alone") + "}") + ")")
    if src.gauge in expr:
        # The gauge variant: the gauge itself, judged `== <code>`; or the gauge filtered by codes.
        whole = expr == src.gauge and rule.op == "==" and rule.threshold != 0
        if not (whole or _codes_only(expr, src)):
            return None
        inputs.add("gauge")
        expr = expr.replace(src.gauge, src.selector("gauge") + "}")
    for name, raw in (("count", src.count[:-1]), ("kernel", src.kernel[:-1])):
        if raw in expr:
            inputs.add(name)
            expr = expr.replace(raw, src.selector(name))
    if any(metric in expr for metric in RAW_METRICS):
        return None
    # The gauge variant's series are the gauge's own: without the input's label they are the direct ones.
    return Rewritten(expr=f'label_replace({expr}, "{INPUT_LABEL}", "", "", "")', inputs=frozenset(inputs))


def _codes_only(text: str, src: Sources) -> bool:
    """Every use of the gauge in `text` compares it with a code other than 0."""
    return all(_CODE_FILTER.match(after) for after in text.split(src.gauge)[1:])

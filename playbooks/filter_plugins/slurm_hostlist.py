"""Jinja filters for Slurm config templates.

hostlist_expression: fold host names into Slurm's bracket notation, so that 64 H200 nodes take one
NodeName= line instead of 64:

    {{ ['gpu001', 'gpu002', 'gpu003', 'gpu010', 'head'] | hostlist_expression }}
    -> ['gpu[001-003,010]', 'head']

The implementation is opsctl's own (opsctl/slurm/hostlist.py), taken from this checkout, so the
playbooks and opsctl always fold names alike.
"""

import sys
from pathlib import Path

# playbooks/filter_plugins/ -> the checkout that holds the opsctl package these playbooks belong to.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from opsctl.slurm.hostlist import hostlist_expression  # noqa: E402


class FilterModule:
    def filters(self):
        return {"hostlist_expression": hostlist_expression}

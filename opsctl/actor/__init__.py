"""The one gateway: every change to a node in Slurm (actor/act.py: the run lock, compare and set, the intent
before scontrol, the audit record after it) and every write of opsctl's state (actor/ledger.py, onto the
stores of actor/state.py and the audit log of actor/audit.py) goes through this package; tests/unit/
test_gateway.py fails if anything outside it does either. actor/result.py is the one result of what an
acting command did."""

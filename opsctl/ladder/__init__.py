"""`opsctl remediate` and `opsctl hold`: the remediation ladder after a drain for a GPU fault (reset, reboot,
validate, resume or RMA), its reasons, its pure plan, and the node's own step (`opsctl node check
--remediate-self`)."""

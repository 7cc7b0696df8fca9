"""The command layer: what each `opsctl` command does with the core and how its result is shown.

It sits above `health`, `remediation`, `prom` and `slurm`, which never import it. `opsctl/cli.py`
parses arguments and calls one function here per command.
"""

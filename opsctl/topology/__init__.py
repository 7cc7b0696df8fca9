"""`opsctl ib topology`: the InfiniBand fabric from ibnetdiscover (ibnetdiscover.py), each node's HCAs on their
leaves and the leaf groups (fabric.py), topology.conf for Slurm (render.py), cabling drift (drift.py), and the
run that reads, writes, checks and drains (run.py)."""

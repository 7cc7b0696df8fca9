"""Node-local storage health: the required mounts are there with the right type, each answers within a
timeout, a probe file can be written and read back, every Lustre import is healthy, every LNet NI is up
and the MGS answers a ping, and NFS's RPC retransmissions, for `opsctl node check` (docs/storage.md).

The readers (mountinfo, mountstats, lustre, lnet) are pure parsers of the real formats; `probe` runs the
one call that can hang, a stat of a mount, in a child process; `check` judges what they read.
"""

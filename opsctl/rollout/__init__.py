"""`opsctl rollout drain|reboot|resume`: provisioning's rolling changes, a batch of GPU nodes at a time."""

"""`opsctl ib fabric-test`: rail-aligned ib_write_bw between nodes over SSH (runner, ssh), the rounds that
isolate a slow or dead HCA (pairing), the Ansible inventory it reads (inventory), and ib_write_bw's parser."""

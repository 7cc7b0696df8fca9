"""Ansible connection: the local one under its own name, for the hosts of
tests/component/platform_host (their modules run here, with the fake host loaded). A connection named
"local" would make ansible.builtin.reboot refuse to run at all, even in check mode."""

from ansible.plugins.connection.local import Connection as LocalConnection

DOCUMENTATION = """
name: opsctl_fake_host
short_description: the local connection, for check-mode runs on recorded platforms
description:
  - Runs modules on the control node, as the local connection does, under another name.
author: opsctl
"""


class Connection(LocalConnection):
    transport = "opsctl_fake_host"

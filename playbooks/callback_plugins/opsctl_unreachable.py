"""Names the hosts a run could not reach, after the recap, and in the file $OPSCTL_UNREACHABLE_FILE when set
(`make provision` prints it as its last lines).

site.yml's first play only pings: a host that does not answer (one node in 64 is usually down) is left
out of every later play and the run goes on for the others. ansible-playbook then exits 4; this says
which hosts, and why, where an operator reads first. Their Slurm lines still come from the fact cache.
"""

import os

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
    name: opsctl_unreachable
    type: aggregate
    short_description: names the unreachable hosts at the end of a run
    description:
      - After the recap, one line naming every host the run could not reach, with the first line of why.
      - Also written to the file named by the environment variable OPSCTL_UNREACHABLE_FILE, when set.
    requirements:
      - enable in callbacks_enabled (playbooks/ansible.cfg)
"""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "opsctl_unreachable"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self._why: dict[str, str] = {}

    def v2_runner_on_unreachable(self, result):
        message = str(result._result.get("msg", "")).strip().splitlines()
        self._why.setdefault(result._host.get_name(), message[0] if message else "no answer")

    def v2_playbook_on_stats(self, stats):
        if not self._why:
            return
        line = ("unreachable, left out of this run (nothing changed there; Slurm keeps them from the fact cache): "
                + "; ".join(f"{host} ({why})" for host, why in sorted(self._why.items())))
        self._display.display(line, stderr=False)
        path = os.environ.get("OPSCTL_UNREACHABLE_FILE")
        if path:
            with open(path, "w", encoding="utf-8") as out:
                out.write(line + "\n")

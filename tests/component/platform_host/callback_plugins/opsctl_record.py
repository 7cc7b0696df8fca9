"""Ansible callback: every task result as one JSON line in $OPSCTL_RECORD (host, task, action, status,
the module's arguments, the diff and the message), for tests/component/test_platform_check_mode.py."""

import json
import os

from ansible.plugins.callback import CallbackBase


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "opsctl_record"
    CALLBACK_NEEDS_ENABLED = True

    def _record(self, result, status: str) -> None:
        data = result._result
        items = data.get("results") if isinstance(data.get("results"), list) else [data]
        with open(os.environ["OPSCTL_RECORD"], "a") as handle:
            for item in items:
                if not isinstance(item, dict):
                    continue
                handle.write(json.dumps({
                    "host": result._host.get_name(), "task": result._task.get_name(), "action": result._task.action,
                    "status": status, "args": (item.get("invocation") or {}).get("module_args"),
                    "diff": item.get("diff"), "msg": item.get("msg") or data.get("msg"),
                }, default=str) + "\n")

    def v2_runner_on_ok(self, result):
        self._record(result, "ok")

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._record(result, "failed")

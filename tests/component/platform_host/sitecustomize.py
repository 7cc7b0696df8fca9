"""A host of a platform this machine cannot boot, for check-mode runs of the playbooks
(tests/component/test_platform_check_mode.py).

The inventory's ansible_python_interpreter for such a host is a wrapper that puts this directory first on
PYTHONPATH, so this module loads into the Python of every Ansible module run "on" the host. The real
module still parses and validates its arguments (a misspelt option or a wrong type fails as it would on
the host); then, instead of acting, it answers as the host would in check mode: its facts are the recorded
ones of the platform (OPSCTL_FAKE_HOST_FACTS), nvidia-smi answers with the lab's emulated H200s, and
everything it is asked to change is reported changed. The packages apt was asked for are remembered
(OPSCTL_FAKE_HOST_STATE), so that package_facts lists them for the holds. Nothing on this machine is read
or written by a module.
"""

import base64
import contextlib
import importlib.abc
import importlib.util
import io
import json
import os
import re
import shlex
import sys

STATE = os.environ.get("OPSCTL_FAKE_HOST_STATE", "")
FACTS = os.environ.get("OPSCTL_FAKE_HOST_FACTS", "")
PINNED_DRIVER = "570.133.20"


def _state() -> dict:
    try:
        with open(STATE) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return {"packages": []}


def _remember_packages(names: list[str]) -> None:
    state = _state()
    state["packages"] = sorted(set(state["packages"]) | {name.split("=", 1)[0] for name in names})
    with open(STATE, "w") as handle:
        json.dump(state, handle)


def _nvidia_smi(argv: list[str]) -> tuple[int, str]:
    from opsctl_lab.hwtools import nvidia_smi

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = nvidia_smi.main(argv)
    return rc, out.getvalue()


def _command(params: dict) -> dict:
    if params.get("argv"):
        argv = [str(a) for a in params["argv"]]
    else:
        raw = str(params.get("cmd") or params.get("_raw_params") or "")
        argv = shlex.split(raw.split("&&")[-1]) if "|" not in raw else ["sh", "-c", raw]
    while argv and argv[0] == "timeout":  # "timeout 60 nvidia-smi ...": the host's nvidia-smi answers
        argv = argv[2:]
    rc, out = 0, ""
    if argv and argv[0] == "nvidia-smi":
        rc, out = _nvidia_smi(argv[1:])
    elif argv[:1] == ["which"]:
        out = f"/usr/bin/{argv[1]}\n"
    elif argv[:2] == ["scontrol", "-o"]:
        out = f"NodeName={argv[-1]} Arch=x86_64 CoresPerSocket=56 Sockets=2 ThreadsPerCore=2 State=IDLE\n"
    elif argv[:1] == ["munge"]:
        out = "MUNGE:AwQDAACm3Gu2yq+Vq0v5RgS8fHRmUoPdI7sL2Qe1TzIMVLIlZPc=:\n"
    return {"changed": True, "rc": rc, "stdout": out, "stderr": "", "stdout_lines": out.splitlines(),
            "cmd": argv}


def _stat(params: dict) -> dict:
    path = str(params["path"])
    if re.fullmatch(r"/dev/nvidia\d+", path):
        return {"stat": {"exists": True, "ischr": True, "isreg": False, "path": path}}
    if path.startswith("/sys/module/"):
        return {"stat": {"exists": True, "isdir": True, "path": path}}
    if path.endswith("/munge.key"):  # the controller's key and the node's are the same one
        return {"stat": {"exists": True, "isreg": True, "checksum": "0" * 64, "mode": "0400", "path": path}}
    return {"stat": {"exists": False, "path": path}}


def _facts() -> dict:
    with open(FACTS) as handle:
        return json.load(handle)


def answer(module: str, params: dict) -> dict:
    """What the host answers to `module` with `params`, in check mode."""
    if module in ("setup", "gather_facts"):
        return {"ansible_facts": _facts()["ansible_facts"], "changed": False}
    if module == "opsctl_hw_facts":
        return {"ansible_facts": {"opsctl_hw": _facts()["opsctl_hw"]}, "changed": False}
    if module == "apt":
        names = params.get("name") or []
        _remember_packages([names] if isinstance(names, str) else list(names))
        return {"changed": bool(names) or bool(params.get("update_cache"))}
    if module == "package_facts":
        packages = {name: [{"name": name, "version": "", "source": "apt"}] for name in _state()["packages"]}
        return {"ansible_facts": {"packages": packages}, "changed": False}
    if module in ("command", "shell"):
        return _command(params)
    if module == "stat":
        return _stat(params)
    if module == "slurp":
        return {"content": base64.b64encode(b"munge key of the controller").decode(), "encoding": "base64",
                "source": params["src"]}
    if module == "uri":
        return {"status": 200, "url": params["url"], "changed": False,
                "content": "DCGM_FI_DEV_GPU_TEMP node_exporter_build_info"}
    if module == "find":
        return {"files": [{"path": "/var/tmp/opsctl-wheel/opsctl-0.1.0-py3-none-any.whl"}], "matched": 1,
                "changed": False}
    if module in ("systemd_service", "systemd", "service"):
        acting = any(params.get(key) is not None for key in ("state", "enabled", "masked", "daemon_reload"))
        return {"changed": acting, "name": params.get("name"),
                "status": {"ActiveState": "active", "LoadState": "loaded"}}
    if module in ("wait_for", "validate_argument_spec"):
        return {"changed": False, "elapsed": 0}
    return {"changed": True}


def _patch(basic) -> None:
    original = basic.AnsibleModule.__init__

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        result = answer(self._name.rsplit(".", 1)[-1], dict(self.params))
        result.setdefault("invocation", {"module_args": self.params})
        self.exit_json(**result)

    basic.AnsibleModule.__init__ = __init__


class _PatchBasic(importlib.abc.MetaPathFinder):
    """Patches ansible.module_utils.basic (from the module's own payload) when the module imports it."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "ansible.module_utils.basic":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        exec_module = loader.exec_module  # one loader (the payload's zipimporter) loads every module_utils

        def exec_and_patch(module):
            if module.__name__ != fullname:
                return exec_module(module)
            loader.exec_module = exec_module
            exec_module(module)
            _patch(module)

        loader.exec_module = exec_and_patch
        return spec


if FACTS:
    sys.meta_path.insert(0, _PatchBasic())

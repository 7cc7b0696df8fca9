"""Ansible connection for check-mode runs of the playbooks on a platform this machine cannot boot
(tests/component/test_platform_check_mode.py).

A module sent to the host is not run: the connection reads its name and arguments from the module
payload and answers as the host would in check mode. Its facts are the recorded ones of the platform
(host variable opsctl_fake_host_facts), nvidia-smi answers with the lab's emulated H200s, and everything
the module is asked to change is reported changed. The packages apt was asked for are remembered
(opsctl_fake_host_state), so that dpkg-query lists them for the holds. Any other command (temporary
directories, file transfers of the template action) runs here, as the local connection runs it.
Module arguments are checked against each module's specification by ansible-lint (`args` rule), not here.
"""

import ast
import base64
import contextlib
import glob
import io
import json
import os
import re
import shlex
from pathlib import Path

from ansible.plugins.connection.local import Connection as LocalConnection

DOCUMENTATION = """
name: opsctl_fake_host
short_description: a host that answers module calls with recorded facts, in check mode
description:
  - Answers each module sent to the host from its name and arguments; runs any other command locally.
author: opsctl
options:
  facts:
    description: JSON file with the host's recorded facts (ansible_facts) and hardware facts (opsctl_hw).
    vars:
      - name: opsctl_fake_host_facts
  state:
    description: JSON file where the host remembers the packages it was asked to install.
    vars:
      - name: opsctl_fake_host_state
"""

# ansible-core 2.19 hands the module to _ansiballz_main(..., ansible_module='apt', ..., params='{...}');
# 2.16 to 2.18 set ANSIBALLZ_PARAMS and run the module by its qualified name.
_MODULE_219 = re.compile(r"^ansible_module=('[^']*'),$", re.M)
_PARAMS_219 = re.compile(r"^params=('.*'),$", re.M)
_MODULE_216 = re.compile(r"mod_name='[\w.]*\.(\w+)'")
_PARAMS_216 = re.compile(r"^\s*ANSIBALLZ_PARAMS = ('.*')$", re.M)


def parse_module_payload(payload: bytes) -> tuple[str, dict] | None:
    text = payload.decode(errors="replace")
    name = _MODULE_219.search(text)
    params = _PARAMS_219.search(text)
    if name and params:
        module = ast.literal_eval(name.group(1))
    else:
        name, params = _MODULE_216.search(text), _PARAMS_216.search(text)
        if not (name and params):
            return None
        module = name.group(1)
    return module.rsplit(".", 1)[-1], json.loads(ast.literal_eval(params.group(1)))["ANSIBLE_MODULE_ARGS"]


class Connection(LocalConnection):
    transport = "opsctl_fake_host"

    def exec_command(self, cmd, in_data=None, sudoable=True):
        request = parse_module_payload(in_data) if in_data else None
        if request is None:
            return super().exec_command(cmd, in_data=in_data, sudoable=sudoable)
        module, params = request
        visible = {k: v for k, v in params.items() if not k.startswith("_ansible")}
        result = FakeHost(self.get_option("facts"), self.get_option("state")).answer(module, visible)
        result.setdefault("invocation", {"module_args": visible})
        return 0, json.dumps(result).encode(), b""


class FakeHost:
    def __init__(self, facts_file: str, state_file: str):
        self.facts_file, self.state_file = facts_file, state_file

    def facts(self) -> dict:
        with open(self.facts_file) as handle:
            return json.load(handle)

    def installed(self) -> list[str]:
        try:
            with open(self.state_file) as handle:
                return json.load(handle)["packages"]
        except (OSError, ValueError, KeyError):
            return []

    def remember(self, names: list[str]) -> None:
        packages = sorted(set(self.installed()) | {name.split("=", 1)[0] for name in names})
        with open(self.state_file, "w") as handle:
            json.dump({"packages": packages}, handle)

    def answer(self, module: str, params: dict) -> dict:
        if module in ("setup", "gather_facts"):
            return {"ansible_facts": self.facts()["ansible_facts"], "changed": False}
        if module == "opsctl_hw_facts":
            return {"ansible_facts": {"opsctl_hw": self.facts()["opsctl_hw"]}, "changed": False}
        if module == "apt":
            names = params.get("name") or []
            self.remember([names] if isinstance(names, str) else list(names))
            return {"changed": bool(names) or bool(params.get("update_cache"))}
        if module in ("command", "shell"):
            return self.command(params)
        if module == "stat":
            return {"stat": stat(str(params["path"]))}
        if module == "slurp":
            return {"content": base64.b64encode(b"munge key of the controller").decode(), "encoding": "base64",
                    "source": params["src"]}
        if module == "uri":
            return {"status": 200, "url": params["url"], "changed": False,
                    "content": "DCGM_FI_DEV_GPU_TEMP node_exporter_build_info"}
        if module == "find":  # only the control host's wheel directory is searched: look there
            files = [{"path": path} for directory in as_list(params["paths"])
                     for pattern in as_list(params.get("patterns") or "*")
                     for path in sorted(glob.glob(os.path.join(directory, pattern)))]
            return {"files": files, "matched": len(files), "changed": False}
        if module in ("systemd_service", "systemd", "service"):
            acting = any(params.get(key) is not None for key in ("state", "enabled", "masked"))
            return {"changed": acting, "name": params.get("name"),
                    "status": {"ActiveState": "active", "LoadState": "loaded"}}
        if module == "wait_for":
            return {"changed": False, "elapsed": 0}
        # copy, file, template and the rest report the path they act on, as they do on a real host
        return {"changed": True, **{key: params[key] for key in ("dest", "path") if key in params}}

    def command(self, params: dict) -> dict:
        if params.get("argv"):
            argv = [str(a) for a in params["argv"]]
        else:
            raw = str(params.get("cmd") or params.get("_raw_params") or "")
            argv = shlex.split(raw.split("&&")[-1]) if "|" not in raw else ["sh", "-c", raw]
        while argv and argv[0] == "timeout":  # "timeout 60 nvidia-smi ...": the host's nvidia-smi answers
            argv = argv[2:]
        rc, out = 0, ""
        if argv and argv[0] == "nvidia-smi":
            rc, out = nvidia_smi(argv[1:])
        elif argv[:1] == ["which"]:
            out = f"/usr/bin/{argv[1]}\n"
        elif argv[:2] == ["scontrol", "-o"]:
            out = f"NodeName={argv[-1]} Arch=x86_64 CoresPerSocket=56 Sockets=2 ThreadsPerCore=2 State=IDLE\n"
        elif argv[1:3] == ["ib", "check"] and argv[0].endswith("/opsctl"):
            rc, out = ib_check(argv[3:], self.facts()["ansible_facts"].get("ansible_hostname", "node"))
        elif argv[1:3] == ["ib", "quarantine"] and argv[0].endswith("/opsctl"):
            rc, out = ib_quarantine(str(params.get("stdin") or "{}"), dry_run="--dry-run" in argv)
        elif argv[:1] == ["dpkg-query"]:  # the holds' `<status> <want> <name>` lines; nothing is held yet
            out = "".join(f"installed install {name}\n" for name in self.installed())
        elif argv[:1] == ["munge"]:
            out = "MUNGE:AwQDAACm3Gu2yq+Vq0v5RgS8fHRmUoPdI7sL2Qe1TzIMVLIlZPc=:\n"
        return {"changed": True, "rc": rc, "stdout": out, "stderr": "", "stdout_lines": out.splitlines(),
                "cmd": argv}


def as_list(value) -> list[str]:
    """A list option as the module receives it: a list, or one string of comma-separated items."""
    return [str(item) for item in value] if isinstance(value, list) else str(value).split(",")


def stat(path: str) -> dict:
    if re.fullmatch(r"/dev/nvidia\d+", path):
        return {"exists": True, "ischr": True, "isreg": False, "path": path}
    if path.startswith("/sys/module/"):
        return {"exists": True, "isdir": True, "path": path}
    if path.endswith("/munge.key"):  # the controller's key and the node's are the same one
        return {"exists": True, "isreg": True, "checksum": "0" * 64, "mode": "0400", "path": path}
    return {"exists": False, "path": path}


def ib_check(argv: list[str], node: str) -> tuple[int, str]:
    """opsctl's own `ib check`, over the lab's emulated sysfs of a healthy H200 node (8 NDR HCAs, no fault)."""
    import tempfile

    from click.testing import CliRunner

    from opsctl.cli import main
    from opsctl_lab.hardware import NodeHardware
    from opsctl_lab.ib_sysfs import write_tree

    with tempfile.TemporaryDirectory() as root:
        write_tree(Path(root), NodeHardware(node=node))
        options = [a for a in argv if a != "--sysfs-root"]
        if "--sysfs-root" in argv:  # drop the option's value: the emulated tree stands in for it
            index = argv.index("--sysfs-root")
            options = argv[:index] + argv[index + 2:]
        result = CliRunner().invoke(main, ["ib", "check", *options, "--sysfs-root", root])
    return result.exit_code, result.output


def ib_quarantine(reports: str, dry_run: bool) -> tuple[int, str]:
    """The head's answer where Slurm holds no drain: the failing nodes are quarantined, nobody resumed.
    (The decision itself is opsctl's, tested against real Slurm in the provision tier.)"""
    nodes = json.loads(reports)
    failing = sorted(n for n, r in nodes.items() if r.get("verdict") != "pass")
    verb = "would drain" if dry_run else "drained"
    out = {"tested": sorted(nodes), "quarantine": failing, "passed": sorted(set(nodes) - set(failing)),
           "drained": failing, "resumed": [], "dry_run": dry_run, "stop": "",
           "actions": [f"{verb} {n}: opsctl:ib-precheck" for n in failing],
           "done": [] if dry_run else [f"drain {n}: opsctl:ib-precheck" for n in failing],
           "would": [f"drain {n}: opsctl:ib-precheck" for n in failing] if dry_run else [],
           "refused": {}, "skipped": {}}
    return (1 if failing else 0), json.dumps(out)


def nvidia_smi(argv: list[str]) -> tuple[int, str]:
    """The lab's emulated nvidia-smi of eight H200s, default state (no fault, minor numbers = indexes)."""
    from opsctl_lab.hwtools import nvidia_smi as emulated

    out = io.StringIO()
    os.environ["OPSCTL_HW_STATE"] = "/nonexistent/opsctl-fake-host/hardware.json"
    with contextlib.redirect_stdout(out):
        rc = emulated.main(argv)
    return rc, out.getvalue()

"""The lab's Slurm accounting: Debian's real MariaDB and slurmdbd, so that `sacct` answers as on a cluster.

MariaDB runs as the `mysql` user from a data directory of the lab's own, with no option file of the host
(`--no-defaults`), on a loopback port of its slot; it is set up once (mariadb-install-db) and kept across
`down` and `up`, as Slurm's state is. slurmdbd reaches it over TCP as the user `slurm`, whose password is
made at random on the first `up` and kept in a root-only file: the lab has no default password. Root
sets the database up over the server's socket, which MariaDB lets in by the unix_socket plugin.
slurmctld registers the lab's cluster with slurmdbd itself on its first start.
"""

import os
import pwd
import secrets
import socket
from pathlib import Path

from opsctl_lab import paths as lp
from opsctl_lab import processes
from opsctl_lab.slurm_lab import wait_for

DATABASE = "slurm_acct_db"
DB_USER = "slurm"
# The least that slurmdbd accepts without complaining in its log (Slurm's accounting docs: buffer pool,
# redo log and lock wait); the rest is the lab's: no binary log, no performance schema, no DNS.
_SERVER_OPTIONS = ["--innodb-buffer-pool-size=128M", "--innodb-log-file-size=64M",
                   "--innodb-lock-wait-timeout=900", "--skip-log-bin", "--performance-schema=off",
                   "--skip-name-resolve"]


def _client(paths: lp.LabPaths) -> list[str]:
    return ["mariadb", "--no-defaults", f"--socket={_socket(paths)}", "--user=root", "--batch"]


def _data(paths: lp.LabPaths) -> Path:
    """MariaDB's data directory, the `mysql` user's: its socket and PID file go there too."""
    return paths.accounting / "mariadb"


def _socket(paths: lp.LabPaths) -> Path:
    return _data(paths) / "mariadb.sock"


def password(paths: lp.LabPaths) -> str:
    """The database password of slurmdbd, made once (O_EXCL: never a file someone else put there)."""
    path = paths.accounting / "db-password"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return path.read_text().strip()
    with os.fdopen(fd, "w") as out:
        out.write(secrets.token_urlsafe(24) + "\n")
    return path.read_text().strip()


def render_slurmdbd_conf(paths: lp.LabPaths) -> None:
    """slurmdbd.conf beside slurm.conf (where slurmdbd looks for it), root's only: it holds the password,
    and slurmdbd refuses a file that others may read."""
    text = "\n".join([
        "# slurmdbd.conf of the opsctl lab. Rendered by `opsctl lab up`; holds the database password.",
        "AuthType=auth/munge",
        f"AuthInfo=socket={paths.munge / 'munge.socket'}",
        "DbdHost=localhost",
        "DbdAddr=127.0.0.1",
        f"DbdPort={lp.slurmdbd_port()}",
        "SlurmUser=root",
        f"LogFile={paths.logs / 'slurmdbd.log'}",
        f"PidFile={paths.accounting / 'slurmdbd.pid'}",
        "DebugLevel=info",
        "StorageType=accounting_storage/mysql",
        "StorageHost=127.0.0.1",
        f"StoragePort={lp.mariadb_port()}",
        f"StorageUser={DB_USER}",
        f"StoragePass={password(paths)}",
        f"StorageLoc={DATABASE}",
        "",
    ])
    conf = paths.slurm / "slurmdbd.conf"
    conf.unlink(missing_ok=True)
    fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)


def start(paths: lp.LabPaths) -> None:
    """MariaDB (set up on the first run), the database and its user, then slurmdbd; returns once slurmdbd
    answers on its port."""
    paths.accounting.mkdir(parents=True, exist_ok=True)
    os.chmod(paths.accounting, 0o755)  # mysql reaches its data directory through it
    mysql = pwd.getpwnam("mysql")
    data = _data(paths)
    if not (data / "mysql").is_dir():
        data.mkdir(exist_ok=True)
        os.chown(data, mysql.pw_uid, mysql.pw_gid)
        processes.run(["mariadb-install-db", "--no-defaults", f"--datadir={data}", "--user=mysql",
                       "--auth-root-authentication-method=socket", "--skip-test-db"], timeout=120)
    processes.start("mariadb", [
        "mariadbd", "--no-defaults", f"--datadir={data}", f"--socket={_socket(paths)}", "--user=mysql",
        "--bind-address=127.0.0.1", f"--port={lp.mariadb_port()}", f"--pid-file={data / 'mariadb.pid'}",
        *_SERVER_OPTIONS], paths.run, paths.logs)
    wait_for(lambda: processes.run(_client(paths) + ["-e", "SELECT 1"], check=False, timeout=10).returncode == 0,
          60, f"MariaDB did not answer on {_socket(paths)} (log: {paths.logs / 'mariadb.log'})")
    secret = password(paths).replace("\\", "\\\\").replace("'", "\\'")
    # The password goes in on stdin, never on a command line that `ps` shows.
    processes.run(_client(paths), input=(
        f"CREATE DATABASE IF NOT EXISTS {DATABASE};\n"
        f"CREATE USER IF NOT EXISTS '{DB_USER}'@'127.0.0.1' IDENTIFIED BY '{secret}';\n"
        f"ALTER USER '{DB_USER}'@'127.0.0.1' IDENTIFIED BY '{secret}';\n"
        f"GRANT ALL ON {DATABASE}.* TO '{DB_USER}'@'127.0.0.1';\n"), timeout=30)
    render_slurmdbd_conf(paths)
    processes.start("slurmdbd", ["slurmdbd", "-D"], paths.run, paths.logs,
                    env={"SLURM_CONF": str(paths.slurm_conf)})
    wait_for(lambda: _listening(lp.slurmdbd_port()), 60,
          f"slurmdbd did not listen on port {lp.slurmdbd_port()} (log: {paths.logs / 'slurmdbd.log'})")


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0

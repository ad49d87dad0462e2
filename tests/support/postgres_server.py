"""A real PostgreSQL server on 127.0.0.1 for the tests, started and stopped by PID.

Debian's ``postgresql`` package (``/usr/lib/postgresql/<version>/bin``). The server refuses to run as root, so a
root test run starts it as the ``postgres`` user (its data directory under a fresh directory of /tmp it owns); any
other user runs it as themselves. Fsync is off: these are throwaway clusters.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from tests.support.mirror_proc import free_port


def bin_dir() -> Path | None:
    for found in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if Path(found, "initdb").exists() and Path(found, "pg_ctl").exists():
            return Path(found)
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def available() -> bool:
    if bin_dir() is None:
        return False
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return False
    return True


class PostgresServer:
    """``with PostgresServer() as pg:`` -> ``pg.url(db)``, ``pg.create_database()``, ``pg.stop()``/``pg.start()``."""

    def __init__(self) -> None:
        self.bin = bin_dir()
        self.port = free_port()
        self.user = "postgres" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
        self.root = Path(tempfile.mkdtemp(prefix="hf-mirror-pg-"))
        self.data = self.root / "data"
        self.log_path = self.root / "server.log"
        if os.geteuid() == 0:
            account = pwd.getpwnam("postgres")
            os.chown(self.root, account.pw_uid, account.pw_gid)

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[bytes]:
        command = [str(self.bin / args[0]), *args[1:]] if self.bin else list(args)
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        return subprocess.run(command, capture_output=True, check=check, timeout=120)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{database}"

    def initdb(self) -> None:
        self._run("initdb", "-D", str(self.data), "-U", self.user, "--auth=trust", "-E", "UTF8",
                  "--no-sync", "--no-instructions")

    def start(self, timeout: float = 60.0) -> PostgresServer:
        if not self.data.exists():
            self.initdb()
        options = (f"-k {self.root} -h 127.0.0.1 -p {self.port} -c fsync=off -c synchronous_commit=off "
                   f"-c full_page_writes=off -c max_connections=300")
        result = self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log_path), "-o", options,
                           "-w", "-t", str(int(timeout)), "start", check=False)
        if result.returncode != 0:
            raise RuntimeError(f"PostgreSQL did not start: {result.stderr.decode(errors='replace')}\n"
                               f"{self.log_tail()}")
        return self

    def pid(self) -> int | None:
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (FileNotFoundError, ValueError, IndexError):
            return None

    def stop(self, timeout: float = 30.0) -> None:
        """Fast shutdown of the postmaster by its PID; kill -9 after ``timeout``."""
        pid = self.pid()
        if pid is None:
            return
        try:
            os.kill(pid, signal.SIGINT)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)
        os.kill(pid, signal.SIGKILL)

    def create_database(self) -> str:
        """A fresh database (one per test, so tests never see each other's rows); its URL."""
        name = f"t_{uuid.uuid4().hex[:12]}"
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except FileNotFoundError:
            return ""

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

"""A throwaway PostgreSQL cluster: 127.0.0.1, a random free port, a temporary data directory.

No pytest in here, so experiments can start the same cluster as the tests
(``with PgCluster() as pg: url = pg.create_database()``). ``initdb`` and
``postgres`` refuse to run as root, and everything here runs as root, so as root
the cluster runs as the ``postgres`` system user (``runuser -u postgres --``) with
the data directory owned by it; as anyone else it runs as that user.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path
from types import TracebackType

import psycopg
from psycopg import sql

SERVER_USER = "postgres"
_NEEDED = ("initdb", "pg_ctl", "postgres")


class ClusterUnavailable(RuntimeError):
    """The cluster could not be found or started; the message says why."""


def find_bindir() -> Path:
    """The directory holding initdb, pg_ctl and postgres: pg_config, then PATH, then Debian's layout."""
    candidates: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, timeout=10, check=True)
            candidates.append(Path(out.stdout.strip()))
    pg_ctl = shutil.which("pg_ctl")
    if pg_ctl:
        candidates.append(Path(pg_ctl).resolve().parent)  # /usr/local/bin/pg_ctl may be a symlink

    def version(path: str) -> int:
        name = Path(path).parent.name
        return int(name) if name.isdigit() else 0

    candidates += [Path(p) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version, reverse=True)]
    for bindir in candidates:
        if all(os.access(bindir / tool, os.X_OK) for tool in _NEEDED):
            return bindir
    looked = ", ".join(str(c) for c in candidates) or "nothing found"
    raise ClusterUnavailable(
        f"PostgreSQL server binaries (initdb, pg_ctl, postgres) not found (looked in: {looked}); "
        "run .ci/ensure-postgres"
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgCluster:
    """One PostgreSQL server for a test session or a benchmark; ``stop()`` leaves nothing behind.

    ``durable=False`` (tests) turns off fsync: the tests kill clients, never the
    server, so they lose nothing, and they run several times faster.
    """

    def __init__(self, *, durable: bool = False, max_connections: int = 300) -> None:
        self.durable = durable
        self.max_connections = max_connections
        self.port = 0
        self.tmp: Path | None = None
        self._running = False
        self._prefix: list[str] = []
        self._bindir = Path()

    # -- life cycle ---------------------------------------------------------------

    def start(self) -> None:
        self._bindir = bindir = find_bindir()
        self._prefix = self._run_as_prefix()
        self.tmp = Path(tempfile.mkdtemp(prefix="effectlog-pg-"))
        atexit.register(self.stop)  # a safety net if the session ends without teardown
        if self._prefix:
            user = pwd.getpwnam(SERVER_USER)
            os.chown(self.tmp, user.pw_uid, user.pw_gid)
        os.chmod(self.tmp, 0o700)
        self._run(
            [
                str(bindir / "initdb"),
                "-D",
                str(self.data),
                "-U",
                "postgres",
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
                "--no-instructions",
            ],
            "initdb",
        )
        last = ""
        for _ in range(3):  # the random port can be taken between choosing and binding it
            self.port = free_port()
            options = (
                f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.tmp} -c max_connections={self.max_connections}"
            )
            if not self.durable:
                options += " -c fsync=off -c full_page_writes=off -c synchronous_commit=off"
            try:
                self._run(
                    [
                        str(bindir / "pg_ctl"),
                        "-D",
                        str(self.data),
                        "-l",
                        str(self.log),
                        "-o",
                        options,
                        "-w",
                        "-t",
                        "60",
                        "start",
                    ],
                    "pg_ctl start",
                )
            except ClusterUnavailable as exc:
                last = str(exc)
                if "already in use" not in self.log_tail():
                    break
                continue
            self._running = True
            return
        raise ClusterUnavailable(f"{last}; server log: {self.log_tail()}")

    def stop(self) -> None:
        """Stop the server (fast, then immediate, then SIGKILL) and remove the data directory."""
        if self.tmp is None:
            return
        if self._running:
            for mode in ("fast", "immediate"):
                try:
                    self._run(
                        [str(self._bindir / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "-t", "30", "stop"],
                        "pg_ctl stop",
                    )
                    break
                except ClusterUnavailable:
                    continue
            pid = self._postmaster_pid()
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self._running = False
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.tmp = None
        atexit.unregister(self.stop)

    def __enter__(self) -> PgCluster:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    # -- databases ----------------------------------------------------------------

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def create_database(self, name: str | None = None, *, options: str = "") -> str:
        """Create a fresh database and return its URL. ``options`` is appended to CREATE DATABASE."""
        name = name or f"t_{uuid.uuid4().hex[:16]}"
        query = sql.SQL("CREATE DATABASE {} ").format(sql.Identifier(name)) + sql.SQL(options)
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(query)
        return self.url(name)

    def drop_database(self, name: str) -> None:
        """Drop a database, ending any session a test left open in it."""
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))

    # -- internals ----------------------------------------------------------------

    @property
    def data(self) -> Path:
        assert self.tmp is not None
        return self.tmp / "data"

    @property
    def log(self) -> Path:
        assert self.tmp is not None
        return self.tmp / "server.log"

    def log_tail(self, lines: int = 15) -> str:
        try:
            return " | ".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no server log)"

    @staticmethod
    def _run_as_prefix() -> list[str]:
        if os.geteuid() != 0:
            return []
        try:
            pwd.getpwnam(SERVER_USER)
        except KeyError:
            raise ClusterUnavailable(
                f"running as root and there is no {SERVER_USER!r} system user to run the server as "
                "(install Debian's postgresql package: .ci/ensure-postgres)"
            ) from None
        runuser = shutil.which("runuser") or next(
            (p for p in ("/usr/sbin/runuser", "/sbin/runuser") if os.access(p, os.X_OK)), None
        )
        if runuser is None:
            raise ClusterUnavailable("running as root and runuser (util-linux) is not installed")
        return [runuser, "-u", SERVER_USER, "--"]

    def _run(self, argv: list[str], what: str) -> None:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "HOME": str(self.tmp)}
        try:
            done = subprocess.run(
                self._prefix + argv, cwd=self.tmp, env=env, capture_output=True, text=True, timeout=120, check=False
            )
        except (OSError, subprocess.SubprocessError) as exc:
            raise ClusterUnavailable(f"{what} could not run: {exc}") from None
        if done.returncode != 0:
            output = " | ".join((done.stdout + done.stderr).strip().splitlines()[-10:])
            raise ClusterUnavailable(f"{what} exited {done.returncode}: {output}")

    def server_pid(self) -> int | None:
        """The running server's postmaster process id (benchmarks read its CPU time), if any."""
        return self._postmaster_pid()

    def _postmaster_pid(self) -> int | None:
        try:
            first = (self.data / "postmaster.pid").read_text().splitlines()[0]
        except (OSError, IndexError):
            return None
        return int(first) if first.strip().isdigit() else None

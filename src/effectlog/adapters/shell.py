"""The ``shell`` adapter, for coding agents: push, deploy, migrate.

Runs an argv with a working directory, an environment allow-list and a timeout.
On timeout it kills the whole process group (children included) and reports
"outcome unknown". The step's idempotency key is passed as
``EFFECTLOG_IDEMPOTENCY_KEY`` so a script can deduplicate itself. Non-idempotent
unless the plan declares otherwise.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import subprocess
from typing import Any

from effectlog.adapters.protocol import Receipt, Request
from effectlog.errors import BadInput

DEFAULT_ENV_ALLOW = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR")


class ShellTimeout(TimeoutError):
    """The command outlived its timeout; its process group was killed. Outcome unknown."""


class ShellAdapter:
    blocking = True
    # It enforces timeout_s itself and kills the process group; the runtime waits this much
    # longer so the kill is done before the run records "outcome unknown" (and maybe exits).
    timeout_grace_s = 5.0

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        options = options or {}
        self.env_allow = tuple(options.get("env_allow", DEFAULT_ENV_ALLOW))
        self.default_timeout = float(options.get("timeout_s", 600))

    def invoke(self, request: Request) -> Receipt:
        args = request.args
        argv = args.get("argv")
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            raise BadInput(f"step {request.step_id!r}: args.argv must be a non-empty list of strings")
        env = {k: os.environ[k] for k in self.env_allow if k in os.environ}
        env.update({str(k): str(v) for k, v in (args.get("env") or {}).items() if k in self.env_allow})
        env["EFFECTLOG_IDEMPOTENCY_KEY"] = request.idempotency_key
        timeout = request.timeout_s or self.default_timeout
        proc = subprocess.Popen(
            argv,
            cwd=args.get("cwd") or None,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own process group, so a timeout kills children too
        )
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise ShellTimeout(f"{argv[0]} timed out after {timeout}s; process group {proc.pid} killed") from None
        return Receipt(
            ok=proc.returncode == 0,
            data={
                "exit_status": proc.returncode,
                "pgid": proc.pid,
                "stdout_sha256": hashlib.sha256(out).hexdigest(),
                "stderr_sha256": hashlib.sha256(err).hexdigest(),
                "stdout_bytes": len(out),
                "stderr_bytes": len(err),
            },
        )

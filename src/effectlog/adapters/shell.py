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
import selectors
import signal
import subprocess
import time
from typing import Any

from effectlog.adapters.protocol import Receipt, Request
from effectlog.errors import BadInput

DEFAULT_ENV_ALLOW = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR")
# After the command exits, how long its output pipes may stay open (a daemon it started holds them)
# before the adapter stops reading: the command's exit, not the pipes' end, is its outcome.
EXITED_DRAIN_S = 0.5
_POLL_S = 0.05  # how often the command's exit is checked while its pipes stay open


class ShellTimeout(TimeoutError):
    """The command outlived its timeout; its process group was killed. Outcome unknown."""


class ShellAdapter:
    blocking = True
    keeps_descriptors = True  # its command runs in a child process, whose closes are its own
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
            out, err = _outputs(proc, timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            _close(proc)
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


def _outputs(proc: subprocess.Popen[bytes], timeout: float) -> tuple[bytes, bytes]:
    """The command's stdout and stderr until it exits (and its pipes end, or ``EXITED_DRAIN_S`` more
    pass: a daemon it started may hold them for ever). ``TimeoutExpired`` once ``timeout`` passes first,
    whether its pipes are open or not."""
    assert proc.stdout is not None  # both are pipes (Popen with PIPE)
    assert proc.stderr is not None
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    chunks: dict[int, list[bytes]] = {out_fd: [], err_fd: []}
    deadline = time.monotonic() + timeout
    exited_at: float | None = None
    with selectors.DefaultSelector() as selector:
        for fd in chunks:
            os.set_blocking(fd, False)
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map():
            now = time.monotonic()
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            if exited_at is not None and now >= exited_at + EXITED_DRAIN_S:
                break
            if exited_at is None and now >= deadline:
                raise subprocess.TimeoutExpired(proc.args, timeout)
            for key, _ in selector.select(min(_POLL_S, max(deadline - now, 0.0))):
                try:
                    data = os.read(key.fd, 65536)
                except BlockingIOError:
                    continue
                if data:
                    chunks[key.fd].append(data)
                else:
                    selector.unregister(key.fd)
    # Both pipes may end long before the command does (it closed them, ``exec >&- 2>&-``): the
    # timeout still holds for the wait (``TimeoutExpired``: the caller kills the process group).
    proc.wait(timeout=max(deadline - time.monotonic(), 0.0) if exited_at is None else None)
    _close(proc)
    return b"".join(chunks[out_fd]), b"".join(chunks[err_fd])


def _close(proc: subprocess.Popen[bytes]) -> None:
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()

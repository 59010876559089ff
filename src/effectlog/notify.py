"""Notifications: tell a person that a run waits for them, with the command that resolves it.

A hook is any callable taking a ``Notification``. It is called once when a run
suspends for approval (``suspended``), stops on an uncertain step (``stopped``), or a
fleet request needs an operator (``operator_needed``), after the event that says so
is durable. A hook that fails never fails or changes the run: its error is written to
stderr and the run goes on as it would have. Delivery is at most once per such event
(no retry): the journal, not the hook, is the record; ``effectlog status --state
suspended`` lists what waits.

For the CLI: ``--notify-command CMD`` runs ``CMD`` through the shell with the
notification as JSON on stdin (and ``EFFECTLOG_NOTIFY_*`` in its environment);
``--notify-url URL`` POSTs the JSON to ``URL`` with an ``Idempotency-Key`` naming the event.
Around a plan run in your own code: ``since = marks(journal, [run_id])`` before
``Runtime.run``, ``notify_new_waits(hooks, journal, location, since)`` after.
"""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal

import msgspec

from effectlog import events as ev
from effectlog.errors import BadInput
from effectlog.journal import load_run
from effectlog.journal.sidecars import masked
from effectlog.stake import approve_command, reconcile_command

Kind = Literal["suspended", "stopped", "operator_needed"]


class Notification(msgspec.Struct, frozen=True, kw_only=True):
    """What waits, where, and the command that resolves it."""

    kind: Kind
    run_id: str
    step_id: str | None = None
    reason: str = ""
    command: str = ""  # the CLI line that resolves it (approve, reconcile, operator)
    journal: str = ""  # the journal (or fleet store) it is in
    request_id: int | None = None  # a fleet request
    seq: int = 0  # the journal event (or the request's attempt) that made it wait: with kind, names it

    @property
    def key(self) -> str:
        """One key per waiting event, for receivers that deduplicate (``Idempotency-Key``)."""
        return f"{self.kind}/{self.run_id}/{self.step_id or ''}/{self.seq}"


Notifier = Callable[[Notification], None]


def encode(note: Notification) -> bytes:
    return msgspec.json.encode(note)


def deliver(hooks: Iterable[Notifier], note: Notification) -> None:
    """Call each hook once; a hook's failure is written to stderr and goes no further."""
    for hook in hooks:
        try:
            hook(note)
        except Exception as exc:  # a hook must never fail or change the run
            name = getattr(hook, "__name__", type(hook).__name__)
            sys.stderr.write(
                f"effectlog: notification {note.kind} for run {note.run_id!r} step {note.step_id!r} "
                f"not delivered by {name}: {type(exc).__name__}: {exc}\n"
            )


def hooks_of(notify: Notifier | Sequence[Notifier] | None) -> tuple[Notifier, ...]:
    if notify is None:
        return ()
    if callable(notify):
        return (notify,)
    return tuple(notify)


class HookFailed(Exception):
    """A command hook exited non-zero, or a webhook answered an error."""


def command_hook(command: str, *, timeout_s: float = 30.0) -> Notifier:
    """Run ``command`` in the shell, the notification as JSON on stdin and in ``EFFECTLOG_NOTIFY_*``.

    The command is done when its shell exits: stdin and stderr are files, not pipes, so something it
    starts in the background (``notify-send ... &``) and that keeps them open holds nothing up. It runs
    in its own process group: on the timeout the whole group is killed, not just the shell."""

    def notify_command(note: Notification) -> None:
        env = {
            **os.environ,
            "EFFECTLOG_NOTIFY_KIND": note.kind,
            "EFFECTLOG_NOTIFY_RUN_ID": note.run_id,
            "EFFECTLOG_NOTIFY_STEP_ID": note.step_id or "",
            "EFFECTLOG_NOTIFY_COMMAND": note.command,
        }
        with tempfile.TemporaryFile() as stdin, tempfile.TemporaryFile() as stderr:
            stdin.write(encode(note))
            stdin.seek(0)
            proc = subprocess.Popen(  # noqa: S602 - the user's own command line, run as their shell would
                command,
                shell=True,
                stdin=stdin,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                start_new_session=True,
            )
            try:
                status = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise HookFailed(f"{command!r} still ran after {timeout_s:g}s; its process group was killed") from None
            if status != 0:
                stderr.seek(max(0, os.fstat(stderr.fileno()).st_size - 4096))
                tail = stderr.read().decode(errors="replace").strip().splitlines()[-1:] or [""]
                raise HookFailed(f"{command!r} exited {status} {tail[0]}".strip())

    return notify_command


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is not followed: urllib would re-send the POST as a GET without its body, which reaches
    nobody and yet answers 200."""

    def redirect_request(  # noqa: PLR0917 - urllib's own signature
        self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str
    ) -> None:
        raise HookFailed(
            f"{_origin(req.full_url)} answered a redirect ({code}) to {_origin(newurl)}; "
            "a notification is not re-sent to another address: give --notify-url the final one"
        )


_OPENER = urllib.request.build_opener(_NoRedirect)


def url_hook(url: str, *, timeout_s: float = 10.0) -> Notifier:
    """POST the notification as JSON to ``url`` (any host the user names); a redirect is not followed."""
    if not url.startswith(("http://", "https://")):
        shown = shown_location(url) if "://" in url else url  # a URL's password is not echoed either
        raise BadInput(f"--notify-url {shown!r}: expected an http:// or https:// URL")

    # urllib takes user:password@host for the host name: the credentials go in a Basic header, as curl sends them.
    target, auth = _without_userinfo(url)

    def notify_url(note: Notification) -> None:
        # urllib's timeout bounds each socket read, not the answer: a receiver sending a byte at a time
        # would hold the caller for as long as it liked. The POST runs on a daemon thread, given timeout_s.
        failed: list[BaseException] = []

        def post() -> None:
            headers = {"Content-Type": "application/json", "Idempotency-Key": note.key, **auth}
            request = urllib.request.Request(  # noqa: S310 - the scheme is checked above
                target, data=encode(note), method="POST", headers=headers
            )
            try:
                with _OPENER.open(request, timeout=timeout_s) as response:
                    if response.status >= 300:
                        raise HookFailed(f"{_origin(url)} answered HTTP {response.status}")
            except BaseException as exc:  # handed to the caller's thread, which reports it
                failed.append(exc)

        worker = threading.Thread(target=post, name="effectlog-notify-url", daemon=True)
        worker.start()
        worker.join(timeout_s)
        if worker.is_alive():
            raise HookFailed(f"{_origin(url)} did not answer within {timeout_s:g}s; not waiting longer")
        if failed:
            raise failed[0]

    return notify_url


def _origin(url: str) -> str:
    """``scheme://host[:port]`` of ``url``, for messages: a webhook's path or query is often its secret
    (a chat service's hook URL), and stderr ends up in logs."""
    try:
        parts = urllib.parse.urlsplit(url)
        return f"{parts.scheme}://{parts.hostname or ''}" + (f":{parts.port}" if parts.port else "")
    except ValueError:
        return "(an unparsable URL)"


def _without_userinfo(url: str) -> tuple[str, dict[str, str]]:
    """``url`` without ``user:password@``, and the ``Authorization: Basic`` header they make (if any)."""
    try:
        parts = urllib.parse.urlsplit(url)
        if parts.username is None and parts.password is None:
            return url, {}
        host = parts.netloc.rsplit("@", 1)[1]
    except ValueError:
        return url, {}  # urllib will say what is wrong with it
    user = urllib.parse.unquote(parts.username or "")
    secret = urllib.parse.unquote(parts.password or "")
    token = base64.b64encode(f"{user}:{secret}".encode()).decode()
    return urllib.parse.urlunsplit(parts._replace(netloc=host)), {"Authorization": f"Basic {token}"}


def cli_hooks(command: str | None, url: str | None) -> tuple[Notifier, ...]:
    """The hooks ``--notify-command`` and ``--notify-url`` ask for."""
    hooks: list[Notifier] = []
    if command:
        hooks.append(command_hook(command))
    if url:
        hooks.append(url_hook(url))
    return tuple(hooks)


def shown_location(location: str) -> str:
    """A journal or store location fit to send: a URL's password is never part of a notification, and a
    file's path is made absolute, so the command a notification carries works from any directory."""
    if "://" not in location:
        # A directory whose name is not UTF-8 (Latin-1 bytes) has no absolute path a notification can carry
        # as text, nor one the CLI takes: the path as given then, which works from the run's directory.
        full = os.path.abspath(location)
        return full if _is_text(full) else location if _is_text(location) else _escaped(location)
    return masked(location)


def opened_location(journal: Any, location: str) -> str:
    """Where ``journal`` is, to name it in a notification: a SQLite journal by the absolute path it was
    opened at, since a tool may have changed the working directory since (a relative location made
    absolute then named another directory's journal, which a pasted command decided); else ``location``."""
    path = getattr(journal, "path", None)
    return path if isinstance(path, str) and "://" not in location and _is_text(path) else location


def _is_text(path: str) -> bool:
    """Whether ``path`` encodes as UTF-8 (a name with bytes that are not is decoded with lone surrogates)."""
    try:
        path.encode()
    except UnicodeEncodeError:
        return False
    return True


def _escaped(path: str) -> str:
    """``path`` with each byte that is not UTF-8 shown as ``\\xNN``: text a notification can carry."""
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


# -- around a plan run (the CLI's --notify-*; a library user can do the same around Runtime.run) --


def marks(journal: Any, run_ids: Iterable[str]) -> dict[str, int]:
    """Each run's last sequence number now: what was written after it is this command's."""
    return {run_id: journal.head(run_id)[0] for run_id in run_ids}


def notify_new_waits(
    notifiers: Sequence[Notifier], journal: Any, location: str, since: Mapping[str, int]
) -> list[Notification]:
    """One notification per ``run.suspended``/``run.stopped`` written after ``since[run_id]``.

    A suspension's approve command (a stop's reconcile command) is bound to the held call as ``status``
    lists it (``--attempt N --expect-digest D``): the attempt and digest of the step's last event before
    it, or, when that was written before ``since`` (a caller's own mark), of the run's state."""
    sent: list[Notification] = []
    if not notifiers:
        return sent
    # No URL's password, no path relative to this directory (nor to the one a tool changed it to).
    location = shown_location(opened_location(journal, location))
    for run_id, seq in since.items():
        held: dict[str, tuple[int, str]] = {}
        for record in journal.read(run_id, seq):
            event = ev.decode(record.body)
            if isinstance(event, ev.StepEvent):
                held[event.step_id] = (event.attempt, getattr(event, "args_digest", ""))
            elif isinstance(event, ev.RunSuspended | ev.RunStopped):
                bound = held.get(event.step_id)
                if bound is None or not bound[1]:  # its held event is older, or carries no digest
                    bound = _held_now(journal, run_id, event.step_id) or bound
                note = _notification(location, event, bound)
                deliver(notifiers, note)
                sent.append(note)
    return sent


def _held_now(journal: Any, run_id: str, step_id: str) -> tuple[int, str] | None:
    step = load_run(journal, run_id).step(step_id)
    return None if step is None else (step.attempt, step.args_digest)


def _notification(
    location: str, event: ev.RunSuspended | ev.RunStopped, bound: tuple[int, str] | None = None
) -> Notification:
    if isinstance(event, ev.RunSuspended):
        attempt, digest = bound if bound is not None else (None, "")
        return Notification(
            kind="suspended",
            run_id=event.run_id,
            step_id=event.step_id,
            reason=event.reason,
            command=approve_command(location, event.run_id, event.step_id, digest, attempt),
            journal=location,
            seq=event.seq,
        )
    return Notification(
        kind="stopped",
        run_id=event.run_id,
        step_id=event.step_id,
        reason=event.reason,
        command=reconcile_command(location, event.run_id, event.step_id, bound[0] if bound is not None else None),
        journal=location,
        seq=event.seq,
    )

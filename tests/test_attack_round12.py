"""Attack round 12: the operator's surfaces and what they decide.

The console (two operators at once, bodies no form needs), notifications (commands that hang
or leave a child behind, URLs that redirect, a journal URL's password) and the trace's reader
given hostile files. Real processes: ``python -m effectlog`` for the CLI and the console,
real HTTP servers on 127.0.0.1, real SQLite files and PostgreSQL through ``pg_url``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest

from console_kit import TOKENS, Setup, console, digest_on_page, held_plan, login
from effectlog.notify import HookFailed, Notification, command_hook, url_hook
from hardening_kit import SAFETY_TIMEOUT_S, cli_env, wait_until_gone_or_effect

pytest_plugins = ["pg_fixture"]

SECRET = "pw-Sekr1t-in-the-url"
NOTE = Notification(kind="suspended", run_id="r", step_id="s", reason="held", command="effectlog approve", seq=3)


def _with_password(url: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{parts.username}:{SECRET}@{parts.hostname}:{parts.port}"))


def _run_held(setup: Setup, run_id: str, *extra: str) -> subprocess.Popen[str]:
    """``effectlog run`` of a plan held for approval, as a real process, with ``extra`` arguments."""
    (setup.dir / f"{run_id}.json").write_text(json.dumps(held_plan(run_id)))
    return subprocess.Popen(
        [sys.executable, "-m", "effectlog", "run", f"{run_id}.json", "--journal", setup.journal,
         "--effects", setup.effects, *extra],
        cwd=setup.dir, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


# -- notifications ------------------------------------------------------------------------------------------


def test_a_notification_of_a_postgresql_run_never_carries_the_journal_urls_password(
    tmp_path: Path, pg_url: str
) -> None:
    """``effectlog run --journal postgresql://user:PASSWORD@... --notify-command CMD`` handed CMD (and so
    a chat channel, a pager) the journal URL with its password, in ``journal`` and in the approve
    ``command``, while the fleet runner already masked it. Proves: the JSON on the command's stdin and
    its ``EFFECTLOG_NOTIFY_COMMAND`` hold no password, and the command still names the journal."""
    setup = Setup(tmp_path, journal=_with_password(pg_url))
    hook = 'cat > note.json; printf %s "$EFFECTLOG_NOTIFY_COMMAND" > cmd'
    proc = _run_held(setup, "refund-pw", "--notify-command", hook)
    proc.communicate(timeout=SAFETY_TIMEOUT_S)
    note = (tmp_path / "note.json").read_text()
    command = (tmp_path / "cmd").read_text()

    assert (4, False, False) == (proc.returncode, SECRET in note, SECRET in command)
    assert (True, True) == (":***@" in json.loads(note)["journal"], ":***@" in command)


def test_the_console_on_a_postgresql_journal_never_shows_its_password_to_a_viewer(tmp_path: Path, pg_url: str) -> None:
    """``effectlog console --journal postgresql://user:PASSWORD@...`` printed the URL, password and all,
    in every page's header (to viewers too) and in its start-up line. Proves: a viewer's pages (Needs
    attention, the held run) hold no password, and still name the journal."""
    setup = Setup(tmp_path, journal=_with_password(pg_url))
    setup.held("refund-pw-page")
    with console(setup) as base:
        client, _ = login(base, "vik")
        pages = client.get("/").text + client.get("/runs/refund-pw-page").text
        client.close()

    assert (False, True) == (SECRET in pages, ":***@" in pages)


def test_a_slow_notify_command_does_not_keep_the_journal_from_the_person_it_notified(tmp_path: Path) -> None:
    """``run --notify-command`` called its hooks while the run still held the journal's writer lock: the
    person it told could not approve (exit 6, journal locked) until the command ended or its 30 s ran
    out. Proves: while a notify command that sleeps after telling is still running, the very approve
    command it was given, pasted into a shell, is journaled (exit 0)."""
    setup = Setup(tmp_path)
    # It goes on running until the test has tried the approve (at most 25 s: inside the hook's 30).
    hook = (
        'printf %s "$EFFECTLOG_NOTIFY_COMMAND" > cmd.tmp; mv cmd.tmp cmd; '
        "i=0; while [ ! -e release ] && [ $i -lt 250 ]; do sleep 0.1; i=$((i+1)); done"
    )
    proc = _run_held(setup, "refund-slow", "--notify-command", hook)
    deadline = time.monotonic() + SAFETY_TIMEOUT_S
    while not (tmp_path / "cmd").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    command = (tmp_path / "cmd").read_text().replace("NAME", "olga", 1)
    assert command.startswith("effectlog approve ")
    done = subprocess.run(
        f"{sys.executable} -m {command}", shell=True, cwd=tmp_path, env=cli_env(),
        capture_output=True, text=True, timeout=SAFETY_TIMEOUT_S,
    )  # fmt: skip
    hook_still_running = proc.poll() is None
    (tmp_path / "release").touch()
    proc.communicate(timeout=SAFETY_TIMEOUT_S)

    assert (0, True, 4) == (done.returncode, hook_still_running, proc.returncode), done.stderr


def test_a_notify_command_that_leaves_a_child_behind_is_delivered_when_the_command_exits(tmp_path: Path) -> None:
    """A notify command ran with its stderr on a pipe and was waited for until that pipe closed: a command
    that starts something in the background (``notify-send ... &``, ``curl ... &``) and exits 0 held the
    run for the whole timeout and was then reported as not delivered. Proves: the hook returns as soon
    as the command exits 0, while its background child still runs."""
    hook = command_hook(f"touch {tmp_path / 'told'}; sleep 15 &", timeout_s=10.0)
    hook(NOTE)  # raised subprocess.TimeoutExpired after 10 s
    assert (tmp_path / "told").exists()


def test_a_notify_command_that_runs_past_its_timeout_leaves_nothing_running(tmp_path: Path) -> None:
    """On the timeout only the shell was killed: what it had started (a subshell, a pipeline's other
    parts) went on running, unwatched, after the notification was reported as not delivered. Proves:
    after the timeout, nothing the command started acts any more (its late marker never appears)."""
    pidfile = tmp_path / "pid"  # the subshell's own pid ($$ in a subshell is its parent's)
    subshell = f"read -r pid _ < /proc/self/stat; echo $pid > {pidfile}; sleep 1.5; touch {tmp_path / 'late'}"
    hook = command_hook(f"({subshell}); true", timeout_s=0.5)
    with pytest.raises(Exception):  # noqa: B017, PT011 - a timeout is reported; which type is deliver()'s concern
        hook(NOTE)
    wait_until_gone_or_effect(pidfile, tmp_path / "late", 2.5)  # a subshell left running touches late first
    assert not (tmp_path / "late").exists()


class _Redirecting:
    """A receiver on 127.0.0.1 whose ``/`` answers ``302 Location: /moved``; it records every request."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, bytes]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _record(self) -> None:
                size = int(self.headers.get("Content-Length") or 0)
                outer.seen.append((self.command, self.path, self.rfile.read(size)))
                if self.path == "/":
                    self.send_response(302)
                    self.send_header("Location", "/moved")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_POST = _record

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def redirecting() -> Iterator[_Redirecting]:
    r = _Redirecting()
    yield r
    r.server.shutdown()
    r.server.server_close()


def test_a_notify_url_that_redirects_is_not_counted_as_delivered(redirecting: _Redirecting) -> None:
    """urllib follows a 302 to a POST with a GET that has no body: the notification reached nobody, yet the
    hook returned as delivered, and nothing on stderr told anyone. Proves: a redirect is reported as not
    delivered (``HookFailed`` naming it), and no bodiless request is sent on in the notification's place."""
    hook = url_hook(redirecting.url, timeout_s=5.0)
    with pytest.raises(HookFailed, match="redirect"):
        hook(NOTE)
    assert [("POST", "/")] == [(method, path) for method, path, _ in redirecting.seen]


# -- the console ---------------------------------------------------------------------------------------------


def test_a_login_post_larger_than_any_form_is_refused_before_it_is_read(tmp_path: Path) -> None:
    """``POST /login`` needs no session, and Starlette reads a urlencoded form whole into memory: anyone who
    could reach the console could make it buffer a body of any size (Content-Length 1 GB, sent slowly).
    Proves: a body announced above the console's limit is answered 413 after its first MiB, without
    waiting for the rest, and the console still serves a login page afterwards."""
    setup = Setup(tmp_path)
    setup.held("refund-big")
    with console(setup) as base:
        port = int(base.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(
                b"POST /login HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-www-form-urlencoded\r\n"
                b"Content-Length: 1000000000\r\n\r\n" + b"a" * (1 << 20)
            )
            try:
                status_line = s.recv(64).split(b"\r\n", 1)[0]
            except TimeoutError:
                status_line = b"(no answer: the console was still reading the body)"
        after = httpx.get(f"{base}/login", timeout=10).status_code

    assert (b"HTTP/1.1 413 Request Entity Too Large", 200) == (status_line, after)


def test_two_operators_approving_one_held_step_at_once_journal_one_approval(tmp_path: Path) -> None:
    """The page (olga's session) and the JSON API (olga's token) approve the same held call at the same
    moment, each with the digest it saw. Proves: exactly one ``step.approved`` is journaled; the other
    decision is refused (409 conflict, or 400 wrong_state once the step reads approved), never a second
    approval and never a 500."""
    setup = Setup(tmp_path)
    run_id = setup.held("refund-race")
    with console(setup) as base:
        client, token = login(base, "olga")
        digest = digest_on_page(client.get(f"/runs/{run_id}").text)
        api = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {TOKENS['olga']}"}, timeout=60)
        gate = threading.Barrier(2)
        answers: dict[str, int] = {}

        def by_page() -> None:
            gate.wait()
            url = f"/runs/{run_id}/steps/refund/approve"
            answers["page"] = client.post(url, data={"csrf": token, "digest": digest, "attempt": "1"}).status_code

        def by_api() -> None:
            gate.wait()
            url = f"/api/runs/{run_id}/steps/refund/approve"
            answers["api"] = api.post(url, json={"digest": digest, "attempt": "1"}).status_code

        threads = [threading.Thread(target=by_page), threading.Thread(target=by_api)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        client.close()
        api.close()

    approved = [e for e in setup.timeline(run_id) if e["type"] == "step.approved"]
    won = [answers["page"] == 303, answers["api"] == 200]
    lost = [code for code in answers.values() if code not in (200, 303)]
    # The loser is 409 when it met the winner's append, 400 (wrong_state) when it read the step approved.
    assert (1, 1, True) == (len(approved), won.count(True), lost[0] in (400, 409)), answers


# -- the trace's reader --------------------------------------------------------------------------------------


def test_verify_trace_given_a_fifo_refuses_it_instead_of_waiting_for_a_writer(tmp_path: Path) -> None:
    """``verify_trace`` opened whatever it was given and read it: a FIFO nobody writes to blocked it for
    ever (``/dev/zero``, one endless line, would exhaust memory). ``load_plan`` refuses such files before
    reading. Proves: a FIFO is refused with ``BadInput`` naming it, at once."""
    fifo = tmp_path / "trace.jsonl"
    os.mkfifo(fifo)
    code = (
        "from effectlog.errors import BadInput\nfrom effectlog.trace import verify_trace\n"
        f"try:\n    verify_trace({str(fifo)!r})\nexcept BadInput as exc:\n    print('refused:', exc)\n"
    )
    try:
        done = subprocess.run([sys.executable, "-c", code], env=cli_env(), capture_output=True, text=True, timeout=15)
        out = done.stdout
    except subprocess.TimeoutExpired:
        out = "(still waiting for a writer after 15 s)"
    assert out.startswith(f"refused: {fifo}"), out


def test_verify_trace_names_a_line_nested_deeper_than_the_parser_goes(tmp_path: Path) -> None:
    """A line of JSON nested deeper than the parser's recursion limit raised RecursionError out of
    ``verify_trace`` (only ValueError was caught). Proves: such a line after a good record is named as
    ``(1, 2, "not a trace record")``."""
    from effectlog import events as ev
    from effectlog.trace import Trace, verify_trace

    path = tmp_path / "t.jsonl"
    trace = Trace(path)
    trace.record(ev.RunStarted(run_id="r", seq=1, ts=1, plan_digest="d"))
    trace.close()
    with path.open("a") as fh:
        fh.write("[" * 200_000 + "]" * 200_000 + "\n")
    assert (1, 2, "not a trace record") == verify_trace(path)


# -- the command a notification carries, and where it points -------------------------------------------------


def test_the_approve_command_a_notification_carries_works_from_another_directory(tmp_path: Path) -> None:
    """``effectlog run --journal journal.db --notify-command CMD``: the command CMD was given named the
    journal as typed, relative to the run's directory; the person who got it (a pager, a chat channel)
    pastes it elsewhere and gets "no journal file there". Proves: pasted in another directory, the
    notified approve command journals the approval (exit 0)."""
    setup = Setup(tmp_path, journal="journal.db")
    hook = 'printf %s "$EFFECTLOG_NOTIFY_COMMAND" > cmd'
    proc = _run_held(setup, "refund-rel", "--notify-command", hook)
    proc.communicate(timeout=SAFETY_TIMEOUT_S)
    command = (tmp_path / "cmd").read_text().replace("NAME", "olga", 1)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = subprocess.run(
        f"{sys.executable} -m {command}", shell=True, cwd=elsewhere, env=cli_env(),
        capture_output=True, text=True, timeout=SAFETY_TIMEOUT_S,
    )  # fmt: skip
    assert (4, 0) == (proc.returncode, done.returncode), done.stderr


@pytest.mark.parametrize("run_id", ["team/42", "-refund", "refund 7"])
def test_the_approve_command_of_a_session_run_held_for_approval_is_accepted_by_the_cli(
    tmp_path: Path, run_id: str
) -> None:
    """A session run (``Session(run_id, ...)``, as ``durable.run`` makes them) held for approval hands out
    ``ApprovalStep.command``, the line a person pastes. Proves: for run ids a session accepts (a slash, a
    leading dash, a space), that line pasted into a shell journals the approval (exit 0)."""
    import asyncio

    from effectlog.session import ApprovalStep, Session, SqliteCheckpointer
    from session_kit import drive, scripted

    def hold(call: Any) -> str:
        return "require_approval"

    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        session = Session(run_id, scripted(tmp_path / "calls.log"), store, policy=hold)
        steps = asyncio.run(drive(session))
    approval = next(s for s in steps if isinstance(s, ApprovalStep))
    command = approval.command.replace("NAME", "olga", 1)
    done = subprocess.run(
        f"{sys.executable} -m {command}", shell=True, cwd=tmp_path, env=cli_env(),
        capture_output=True, text=True, timeout=SAFETY_TIMEOUT_S,
    )  # fmt: skip
    assert 0 == done.returncode, (command, done.stderr)


def test_a_decision_posted_after_the_journal_was_moved_away_creates_no_journal(tmp_path: Path) -> None:
    """The console opens the journal for each decision as a writer, and a writer's open creates a missing
    SQLite file: a decision posted from a page loaded before the journal was moved away (rotated, restored
    elsewhere) left a fresh empty journal at the old path. ``effectlog approve`` refuses a missing journal
    file. Proves: the decision is refused naming the missing journal, and no file appears at its path."""
    setup = Setup(tmp_path)
    run_id = setup.held("refund-moved")
    with console(setup) as base:
        client, token = login(base, "olga")
        digest = digest_on_page(client.get(f"/runs/{run_id}").text)
        os.rename(setup.journal, tmp_path / "moved.db")
        done = client.post(f"/runs/{run_id}/steps/refund/approve", data={"csrf": token, "digest": digest})
        client.close()

    assert (True, False) == (done.status_code in (400, 404, 409), Path(setup.journal).exists()), done.status_code
    assert "no journal file there" in done.text


def _session_held(journal: Path, run_id: str) -> None:
    """A session run ``run_id`` in ``journal`` whose one tool call (step-1) is held for approval."""
    import asyncio

    from effectlog.session import Session, SqliteCheckpointer
    from session_kit import drive, scripted

    def hold(call: Any) -> str:
        return "require_approval"

    with SqliteCheckpointer(journal) as store:
        asyncio.run(drive(Session(run_id, scripted(journal.parent / "calls.log"), store, policy=hold)))


@pytest.mark.parametrize("run_id", ["refund?x", "refund#x", "refund%3Fx"])
def test_after_a_decision_the_console_shows_the_run_decided_not_another(tmp_path: Path, run_id: str) -> None:
    """A session run's id may hold ``?``, ``#`` or ``%``; the page links to it encoded, but the redirect
    after a decision put the id into ``Location`` raw: approving run ``refund?x`` sent the browser to the
    page of run ``refund`` (``%3F`` to the run ``?``), under a "decided" banner. Proves: the redirect's
    path, decoded, is the decided run's own page."""
    from urllib.parse import quote, unquote

    setup = Setup(tmp_path)
    _session_held(Path(setup.journal), run_id)
    with console(setup) as base:
        client, token = login(base, "olga")
        page = f"/runs/{quote(run_id, safe='')}"
        digest = digest_on_page(client.get(page).text)
        done = client.post(f"{page}/steps/step-1/approve", data={"csrf": token, "digest": digest})
        client.close()

    assert (303, f"/runs/{run_id}") == (done.status_code, unquote(urlsplit(done.headers["location"]).path))


def test_a_notify_url_that_answers_a_byte_at_a_time_is_given_up_after_its_timeout() -> None:
    """``url_hook``'s timeout was urllib's, a limit on each socket read: a receiver that answers one byte
    every 0.3 s (a stuck proxy, a tarpit) held the caller (``run``'s exit, a fleet runner's loop) for as
    long as it kept dribbling. Proves: with ``timeout_s=1`` and an answer that takes about 5 s, the hook
    reports the notification as not delivered instead of waiting for the end."""
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def dribble() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            for i in range(len(answer)):
                try:
                    conn.sendall(answer[i : i + 1])
                except OSError:
                    return
                time.sleep(0.12)

    server = threading.Thread(target=dribble, daemon=True)
    server.start()
    try:
        with pytest.raises(HookFailed, match="1s"):
            url_hook(f"http://127.0.0.1:{port}/", timeout_s=1.0)(NOTE)
    finally:
        server.join(timeout=10)
        listener.close()


def test_a_csrf_token_of_another_session_of_the_same_user_is_refused(tmp_path: Path) -> None:
    """Two logins of one operator: the token of one session posted with the other's cookie (a form saved
    from another browser, a token leaked from one session). Proves: 403, and nothing is journaled."""
    setup = Setup(tmp_path)
    run_id = setup.held("refund-csrf")
    with console(setup) as base:
        first, first_token = login(base, "olga")
        second, _ = login(base, "olga")
        digest = digest_on_page(second.get(f"/runs/{run_id}").text)
        done = second.post(f"/runs/{run_id}/steps/refund/approve", data={"csrf": first_token, "digest": digest})
        first.close()
        second.close()

    approved = [e for e in setup.timeline(run_id) if e["type"] == "step.approved"]
    assert (403, []) == (done.status_code, approved)


# -- observability -------------------------------------------------------------------------------------------

_SPANS_OF_A_LEAKY_TOOL = """
import json, sys
import msgspec
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from effectlog.plan import parse_plan
from effectlog.runtime import Runtime

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)

class Leaky:  # a payment client whose error message echoes the request, card number and all
    def invoke(self, request):
        raise ConnectionError(f"reset while charging card {request.args['card']}")

plan = parse_plan(msgspec.json.encode({
    "run_id": "leak-1",
    "adapters": {"psp": {"type": "leaky", "version": "1", "idempotent": False}},
    "steps": [{"id": "charge", "adapter": "psp", "args": {"card": sys.argv[2]}, "secret": ["card"]}],
}))
with Runtime(sys.argv[1], adapters={"leaky": lambda decl, ctx: Leaky()}) as rt:
    rt.run(plan)
print(json.dumps([json.loads(s.to_json()) for s in exporter.get_finished_spans()]))
"""


def test_a_secret_arg_a_tool_echoes_in_its_error_reaches_no_span(tmp_path: Path) -> None:
    """The journal's reason for a step whose tool raised is redacted (``plan.redact``: a tool may echo its
    args), but the ``effectlog.tool`` span recorded the raw exception: its status description and its
    ``exception`` event held the secret arg the tool echoed, for every trace backend to keep. Proves: no
    exported span (status, attributes, events) holds the card number, and the tool span is still an error."""
    card = "4111111111111111"
    done = subprocess.run(
        [sys.executable, "-c", _SPANS_OF_A_LEAKY_TOOL, str(tmp_path / "j.db"), card],
        env=cli_env(), capture_output=True, text=True, timeout=SAFETY_TIMEOUT_S,
    )  # fmt: skip
    assert 0 == done.returncode, done.stderr
    spans = json.loads(done.stdout)
    tool = next(s for s in spans if s["name"] == "effectlog.tool")
    assert (False, "ERROR") == (card in done.stdout, tool["status"]["status_code"])


def test_verify_trace_reads_no_line_longer_than_any_record_into_memory(tmp_path: Path) -> None:
    """``verify_trace`` read line by line, and a line is as long as the file makes it: a trace file of
    1 GiB without a newline (here sparse: NUL bytes that take no disk) was read whole into memory, a
    MemoryError under a process limit. Proves: under a 600 MiB address-space limit, a good record then
    such a line is named as ``(1, 2, "not a trace record")``."""
    from effectlog import events as ev
    from effectlog.trace import Trace

    path = tmp_path / "t.jsonl"
    trace = Trace(path)
    trace.record(ev.RunStarted(run_id="r", seq=1, ts=1, plan_digest="d"))
    trace.close()
    with path.open("r+b") as fh:
        fh.truncate(path.stat().st_size + (1 << 30))
    code = (
        "import resource\nresource.setrlimit(resource.RLIMIT_AS, (600 << 20, 600 << 20))\n"
        f"from effectlog.trace import verify_trace\nprint(verify_trace({str(path)!r}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=cli_env(), capture_output=True, text=True, timeout=SAFETY_TIMEOUT_S
    )
    assert "(1, 2, 'not a trace record')" == done.stdout.strip(), done.stderr[-300:]


def test_a_notify_url_with_credentials_in_it_is_delivered_with_them_as_basic_auth() -> None:
    """``--notify-url https://user:token@hooks.example/path`` (how many webhooks are handed out): urllib took
    ``user:token@host`` for the host name, so every notification failed "Name or service not known", and
    the receiver never saw it. Proves: the receiver gets the POST, its JSON body, and the credentials as
    ``Authorization: Basic``, as curl sends them; the URL's password is in no error message."""
    import base64

    seen: list[tuple[str | None, dict[str, Any]]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen.append((self.headers.get("Authorization"), json.loads(body)))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url_hook(f"http://ops:{SECRET}@127.0.0.1:{server.server_address[1]}/hook", timeout_s=5.0)(NOTE)
    finally:
        server.shutdown()
        server.server_close()
    basic = "Basic " + base64.b64encode(f"ops:{SECRET}".encode()).decode()
    assert [(basic, "r")] == [(auth, body["run_id"]) for auth, body in seen]


HANGING_LOOKUP = """
import time


class LostReplyHangingLookup:  # the send's answer is lost; asked later, the provider never answers either
    def invoke(self, request):
        raise ConnectionError("connection reset after the effect")

    def lookup(self, request):
        time.sleep(20)


ADAPTERS = {"test.hanging-lookup": lambda decl, ctx: LostReplyHangingLookup()}
"""


def test_a_lookup_that_never_answers_gives_the_operator_an_answer_within_the_steps_timeout(tmp_path: Path) -> None:
    """*Ask the step's own adapter* (reconcile-by-lookup) called the adapter's ``lookup`` with no time limit,
    on one of the console's worker threads: a provider that never answers held the operator's page (and a
    worker) for ever, and a few clicks more left the console no worker to serve anyone. The send itself
    is bounded by the step's ``timeout_s``. Proves: with ``timeout_s: 1``, the decision is refused within
    the client's 15 s, saying the lookup did not answer, the step stays uncertain and nothing is written."""
    (tmp_path / "hang_tools.py").write_text(HANGING_LOOKUP)
    setup = Setup(tmp_path)
    plan = {
        "run_id": "charge-hang",
        "adapters": {"psp": {"type": "test.hanging-lookup", "version": "1", "idempotent": False}},
        "steps": [{"id": "charge", "adapter": "psp", "args": {"amount_cents": 1}, "timeout_s": 1}],
    }
    (tmp_path / "charge-hang.json").write_text(json.dumps(plan))
    made = subprocess.run(
        [sys.executable, "-m", "effectlog", "run", "charge-hang.json", "--journal", setup.journal,
         "--adapters", "hang_tools:ADAPTERS"],
        cwd=tmp_path, env=cli_env({"PYTHONPATH": str(tmp_path)}), capture_output=True, text=True,
        timeout=SAFETY_TIMEOUT_S,
    )  # fmt: skip
    assert 3 == made.returncode, made.stderr
    before = setup.timeline("charge-hang")
    with console(setup, "--adapters", "hang_tools:ADAPTERS") as base:
        client, token = login(base, "olga")
        url = "/runs/charge-hang/steps/charge/reconcile-by-lookup"
        try:
            done = client.post(url, data={"csrf": token, "attempt": "1"}, timeout=15)
            answer = (done.status_code, "did not answer" in done.text)
        except httpx.TimeoutException:
            answer = (0, False)
        client.close()

    assert ((400, True), before) == (answer, setup.timeline("charge-hang"))


def test_a_session_notification_names_its_journal_so_the_command_works_from_anywhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Session(..., notify=hook)`` (``durable.run(..., notify=)``) on ``SqliteCheckpointer("runs.db")``: the
    notification's command named the journal relative to the program's directory, and the person it
    reached pasted it elsewhere ("no journal file there"). Proves: the notified approve command, pasted
    in another directory, journals the approval (exit 0)."""
    import asyncio

    from effectlog.session import Session, SqliteCheckpointer
    from session_kit import drive, scripted

    told: list[Notification] = []

    def hold(call: Any) -> str:
        return "require_approval"

    monkeypatch.chdir(tmp_path)
    with SqliteCheckpointer("runs.db") as store:
        asyncio.run(drive(Session("wire-1", scripted(tmp_path / "calls.log"), store, policy=hold, notify=told.append)))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    command = told[0].command.replace("NAME", "olga", 1)
    done = subprocess.run(
        f"{sys.executable} -m {command}", shell=True, cwd=elsewhere, env=cli_env(),
        capture_output=True, text=True, timeout=SAFETY_TIMEOUT_S,
    )  # fmt: skip
    assert 0 == done.returncode, (command, done.stderr)


def test_a_notify_command_that_closes_its_stdin_at_once_is_delivered(tmp_path: Path) -> None:
    """A command that closes its stdin before reading the notification (``exec <&-``) and exits 0: nothing
    breaks on a pipe nobody reads. Proves: the hook returns, the command ran."""
    command_hook(f"exec <&-; touch {tmp_path / 'ran'}", timeout_s=10.0)(
        Notification(kind="stopped", run_id="r", reason="x" * 300_000)  # larger than a pipe's buffer
    )
    assert (tmp_path / "ran").exists()


@pytest.mark.parametrize(
    "url", ["http+unix://%2Ftmp%2Fhook.sock/notify", "unix:///tmp/hook.sock", "file:///etc/passwd"]
)
def test_a_notify_url_that_is_no_http_url_is_refused_before_the_run(url: str) -> None:
    """``--notify-url`` takes http:// and https:// only: a unix socket or a file URL is refused when the hook
    is made (before any run), not found out at the first notification. Proves: ``BadInput`` naming it."""
    from effectlog.errors import BadInput

    with pytest.raises(BadInput, match="expected an http:// or https:// URL"):
        url_hook(url)


def test_a_chunked_login_body_that_streams_past_the_limit_is_cut_off(tmp_path: Path) -> None:
    """A body sent chunked announces no length: it is counted as it arrives. Proves: 2 MiB of chunks to
    ``POST /login`` are answered 413, and the console still serves a login page afterwards."""
    setup = Setup(tmp_path)
    setup.held("refund-chunked")
    chunk = b"a" * 65536
    with console(setup) as base:
        port = int(base.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(
                b"POST /login HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-www-form-urlencoded\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n"
            )
            try:
                for _ in range(32):
                    s.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
                s.sendall(b"0\r\n\r\n")
            except OSError:
                pass  # the console may close the connection once it has answered
            status_line = s.recv(64).split(b"\r\n", 1)[0]
        after = httpx.get(f"{base}/login", timeout=10).status_code

    assert (b"HTTP/1.1 413 Request Entity Too Large", 200) == (status_line, after)


@pytest.mark.parametrize("run_id", ["team/42", "team/42/steps/step-1"])
def test_a_session_run_whose_id_holds_a_slash_can_be_opened_and_decided_from_the_console(
    tmp_path: Path, run_id: str
) -> None:
    """A session run whose id holds ``/`` (``team/42``; one that looks like a decision's path, too) held for
    approval is listed under Needs attention with a link to its page. Jinja's urlencode kept the ``/`` and
    the routes matched one segment: the page and its decisions were 404. Proves: the link shows the run's
    page with its approve form, approving there journals one ``step.approved`` in that run, and the
    redirect comes back to its page."""
    import re
    from urllib.parse import unquote

    setup = Setup(tmp_path)
    _session_held(Path(setup.journal), run_id)
    with console(setup) as base:
        client, token = login(base, "olga")
        attention = client.get("/").text
        link = re.search(r'href="(/runs/team[^"]*)"', attention)
        assert link is not None, attention
        page = client.get(link.group(1))
        form = re.search(r'action="([^"]+/approve)"', page.text)
        assert form is not None, page.text
        done = client.post(form.group(1), data={"csrf": token, "digest": digest_on_page(page.text), "attempt": "1"})
        client.close()

    from effectlog import events as ev
    from effectlog.journal import open_journal

    journal = open_journal(setup.journal, writer=False)  # the CLI takes no such id (the xfail test above)
    try:
        events = [ev.decode(r.body) for r in journal.read(run_id)]
    finally:
        journal.close()
    approved = [e.run_id for e in events if isinstance(e, ev.StepApproved)]
    assert (200, 303, [run_id]) == (page.status_code, done.status_code, approved)
    assert f"/runs/{run_id}" == unquote(urlsplit(done.headers["location"]).path)


# -- fleet decisions -----------------------------------------------------------------------------------------

BROKEN_FACTORY = """
def _explode(decl, context):
    raise RuntimeError("factory bug")


BROKEN = {"broken": _explode}
"""


def test_two_operators_deciding_one_request_at_once_make_one_decision(tmp_path: Path) -> None:
    """A request that needs an operator; two real ``effectlog operator`` processes, one ``requeue``, one
    ``fail`` and another ``requeue``, all about attempt 1, started together. Proves: exactly one decision is
    recorded (one exits 0, the others 2 ``wrong_state`` or 5 stale, nothing written), and the request is in
    the state that one decision gives it."""
    from effectlog.fleet import open_store

    (tmp_path / "broken_tools.py").write_text(BROKEN_FACTORY)
    store = str(tmp_path / "fleet.db")
    (tmp_path / "broken.json").write_text(
        json.dumps({"run_id": "b-1", "adapters": {"b": {"type": "broken"}}, "steps": [{"id": "s", "adapter": "b"}]})
    )
    env = cli_env({"PYTHONPATH": str(tmp_path)})

    def cli(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "effectlog", *argv], cwd=tmp_path, env=env, capture_output=True, text=True,
            timeout=SAFETY_TIMEOUT_S,
        )  # fmt: skip

    assert 0 == cli("submit", "broken.json", "--store", store, "--scope", "s", "--key", "k").returncode
    ran = cli("runner", "--store", store, "--adapters", "broken_tools:BROKEN", "--exit-when-idle", "--poll-s", "0.01")
    assert 0 == ran.returncode, ran.stderr
    with open_store(store) as s:
        (request,) = s.requests()
    assert "needs_operator" == request.state

    def decide(action: str, who: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "effectlog", "operator", action, "--store", store, "--request",
             str(request.request_id), "--attempt", "1", "--by", who, "--reason", "decided"],
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip

    procs = [decide(action, who) for action, who in (("requeue", "olga"), ("fail", "vik"), ("requeue", "ivan"))]
    codes = [p.wait(timeout=SAFETY_TIMEOUT_S) for p in procs]
    for p in procs:
        p.communicate()
    with open_store(store) as s:
        history = [h for h in s.history(request.request_id) if h.actor == "operator"]
        after = s.request(request.request_id)
    winner = ("requeue", "fail", "requeue")[codes.index(0)] if 0 in codes else ""
    assert (1, True) == (codes.count(0), all(c in (2, 5) for c in codes if c != 0)), codes  # wrong_state or stale
    assert (1, {"requeue": "queued", "fail": "failed"}[winner]) == (len(history), after.state)

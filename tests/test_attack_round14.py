"""Round-14 attacks on the fleet (``submit``, ``runner``, ``operator``, leases, both stores): the classes of
earlier rounds (second actors, keys that ignore the body, columns outside the chain, hostile values) with
cases nobody had tried. Each test is one suspicion: a failing reproduction first where it found a defect,
kept as a regression test where it found none. Real SQLite files, real PostgreSQL (``pg_url``), real
processes (``python -m effectlog``)."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from effectlog import events as ev
from effectlog.errors import ExitStatus, JournalUnreadable
from effectlog.journal import open_journal
from hardening_kit import effectlog, one_line

pytest_plugins = ["pg_fixture"]


def _shell_plan(path: Path, run_id: str, effects: Path, *, gate: Path | None = None, steps: int = 1) -> Path:
    """A plan of ``steps`` non-idempotent shell steps, each appending its id to ``effects`` (the first
    only once ``gate`` exists, or after two minutes, so it stays in flight for as long as the test needs
    on however slow a machine): a step sent twice shows as a line twice."""
    wait = f"t=0; while [ ! -e '{gate}' ] && [ $t -lt 2400 ]; do sleep 0.05; t=$((t+1)); done; " if gate else ""
    plan = {
        "run_id": run_id,
        "adapters": {"sh": {"type": "shell", "idempotent": False}},
        "steps": [
            {"id": f"s{i}", "adapter": "sh",
             "args": {"argv": ["sh", "-c", f"{wait if i == 1 else ''}echo s{i} >> '{effects}'"]}}
            for i in range(1, steps + 1)
        ],
    }  # fmt: skip
    path.write_text(json.dumps(plan))
    return path


def _request(store: str, cwd: Path) -> dict[str, Any]:
    """``requests --request 1 --json``: request 1's attempts and history."""
    shown: dict[str, Any] = json.loads(
        effectlog("requests", "--store", store, "--request", "1", "--json", cwd=cwd).stdout
    )
    return shown


def _lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def _first_event(location: str, run_id: str) -> ev.AnyEvent:
    journal = open_journal(location, writer=False)
    try:
        return ev.decode(next(iter(journal.read(run_id))).body)
    finally:
        journal.close()


# -- 4. columns outside the chain: the request a run serves ------------------------------------------


def test_a_fleet_runs_first_event_names_the_request_it_serves_and_verify_passes(tmp_path: Path) -> None:
    """The request a run serves was only in the fleet's tables (outside the chain), so a request re-pointed
    at a new run id by hand ran its steps again unseen (round 10's xfail, now passing). Proves: the
    ``run.started`` a runner writes names its request (``request``), a plain run's names none, and a store
    holding both verifies ok."""
    effects = tmp_path / "fx.txt"
    store = str(tmp_path / "st.db")
    for n, run_id in enumerate(("f1", "f2"), start=1):
        _shell_plan(tmp_path / f"{run_id}.json", run_id, effects)
        assert 0 == effectlog("submit", "--store", store, "--scope", "s", "--key", f"k{n}", f"{run_id}.json",
                              cwd=tmp_path).returncode  # fmt: skip
    assert 0 == effectlog("runner", "--store", store, "--exit-when-idle", "-q", cwd=tmp_path).returncode
    _shell_plan(tmp_path / "plain.json", "plain", effects)
    assert 0 == effectlog("run", "--journal", store, "plain.json", cwd=tmp_path).returncode
    started = {run_id: _first_event(store, run_id) for run_id in ("f1", "f2", "plain")}
    assert {"f1": 1, "f2": 2, "plain": 0} == {
        run_id: event.request for run_id, event in started.items() if isinstance(event, ev.RunStarted)
    }
    verify = effectlog("verify", "--journal", store, cwd=tmp_path)
    assert (0, "ok: 3 run(s)") == (verify.returncode, verify.stdout[:12]), verify.stderr


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_two_runs_naming_one_request_fail_verify_in_one_line_naming_both(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    """The same check on both backends, with the journal written directly: two runs whose ``run.started``
    name request 7 (each chain intact). Proves: ``verify`` exits 7 (``request_served_twice``) in one line
    naming both runs; ``verify --run-id`` of either alone still passes (each run holds together)."""
    location = str(tmp_path / "j.db") if backend == "sqlite" else str(request.getfixturevalue("pg_url"))
    journal = open_journal(location)
    try:
        for run_id in ("a", "b"):
            journal.append([ev.RunStarted(run_id=run_id, seq=1, ts=1, plan={"run_id": run_id, "steps": []},
                                          plan_digest="d", request=7)])  # fmt: skip
    finally:
        journal.close()
    verify = effectlog("verify", "--journal", location, cwd=tmp_path)
    line = one_line(verify.stderr)
    assert (int(ExitStatus.INTEGRITY), True, True) == (
        verify.returncode, "request_served_twice" in line, "'a'" in line and "'b'" in line
    ), line  # fmt: skip
    assert 0 == effectlog("verify", "--journal", location, "--run-id", "b", cwd=tmp_path).returncode


# -- 3. keys that ignore the body, at the fleet level -------------------------------------------------


def test_the_same_key_in_another_scope_cannot_take_a_requests_run_id(tmp_path: Path) -> None:
    """``submit`` of the same plan and key in another scope is another request (the key is scoped), but the
    plan's run id is the first request's. Proves: refused (exit 5, one line naming request 1), one request
    stays, and the runner sends the step once."""
    effects = tmp_path / "fx.txt"
    _shell_plan(tmp_path / "p.json", "f1", effects)
    store = str(tmp_path / "st.db")
    assert 0 == effectlog("submit", "--store", store, "--scope", "a", "--key", "k", "p.json", cwd=tmp_path).returncode
    other = effectlog("submit", "--store", store, "--scope", "b", "--key", "k", "p.json", cwd=tmp_path)
    assert (int(ExitStatus.CONFLICT), True) == (other.returncode, "request 1" in one_line(other.stderr))
    assert 0 == effectlog("runner", "--store", store, "--exit-when-idle", "-q", cwd=tmp_path).returncode
    listed = effectlog("requests", "--store", store, "--json", cwd=tmp_path)
    assert 1 == len(json.loads(listed.stdout)), listed.stdout
    assert ["s1"] == _lines(effects)


def test_the_same_key_with_another_secret_value_is_an_idempotency_conflict(tmp_path: Path) -> None:
    """A plan's secret args are stored as digests; a resubmission with the same key and another card must
    not return the first request (whose runner would charge the first card). Proves: exit 5."""
    store = str(tmp_path / "st.db")
    for n, card in enumerate(("4111111111111111", "5500005555555559")):
        plan = {
            "run_id": "pay-1",
            "adapters": {"sh": {"type": "shell", "idempotent": False}},
            "steps": [{"id": "s1", "adapter": "sh", "args": {"argv": ["true"], "card": card}, "secret": ["card"]}],
        }
        (tmp_path / f"p{n}.json").write_text(json.dumps(plan))
    assert 0 == effectlog("submit", "--store", store, "--scope", "s", "--key", "k", "p0.json", cwd=tmp_path).returncode
    again = effectlog("submit", "--store", store, "--scope", "s", "--key", "k", "p1.json", cwd=tmp_path)
    assert (int(ExitStatus.CONFLICT), True) == (again.returncode, "idempotency_conflict" in one_line(again.stderr))


# -- 5. hostile values through submit -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("flag", "text"),
    [("--key", "k\u2028x"), ("--key", "k\u2029x"), ("--key", "k\x85x"), ("--key", "k\x9b31mx"), ("--key", "k\x7fx"),
     ("--key", "k\u202ex"), ("--key", "k\u200bx"), ("--scope", "s\u2028x")],
    ids=["line-separator", "paragraph-separator", "next-line", "c1-csi", "delete", "rtl-override", "zero-width",
         "scope-line-separator"],
)  # fmt: skip
def test_a_scope_or_key_that_is_not_one_printable_line_is_refused(tmp_path: Path, flag: str, text: str) -> None:
    """``submit`` said "a non-empty single line" but refused only characters below 32: a key with U+2028
    (which ``str.splitlines`` and many viewers break at), NEL, a C1 CSI (a terminal escape), DEL, an RTL
    override or a zero-width space was stored, and ``requests``, messages and logs printed it raw: one key
    shown as two lines, or as another key. Proves: each is refused (exit 2, one line naming the flag)
    and no request is stored."""
    _shell_plan(tmp_path / "p.json", "f1", tmp_path / "fx.txt")
    argv = {"--scope": "s", "--key": "k"} | {flag: text}
    done = effectlog("submit", "--store", "st.db", "--scope", argv["--scope"], "--key", argv["--key"], "p.json",
                     cwd=tmp_path)  # fmt: skip
    assert (int(ExitStatus.BAD_INPUT), True) == (done.returncode, flag in one_line(done.stderr)), done.stderr
    listed = effectlog("requests", "--store", "st.db", "--json", cwd=tmp_path)
    assert [] == json.loads(listed.stdout), listed.stderr


def test_a_journal_given_as_a_store_adopts_its_finished_run_and_sends_nothing_again(tmp_path: Path) -> None:
    """A plain journal file whose run f1 completed is given to ``submit --store`` with the same plan (the
    store is a journal too), and a runner serves the request. Proves: the runner adopts the finished run
    (request succeeded) without sending its step again, the run's first event names no request (it was
    not the fleet's), and ``verify`` passes."""
    effects = tmp_path / "fx.txt"
    _shell_plan(tmp_path / "p.json", "f1", effects)
    journal = str(tmp_path / "j.db")
    assert 0 == effectlog("run", "--journal", journal, "p.json", cwd=tmp_path).returncode
    assert 0 == effectlog("submit", "--store", journal, "--scope", "s", "--key", "k", "p.json", cwd=tmp_path).returncode
    assert 0 == effectlog("runner", "--store", journal, "--exit-when-idle", "-q", cwd=tmp_path).returncode
    started = _first_event(journal, "f1")
    assert isinstance(started, ev.RunStarted)
    assert ("succeeded", ["s1"], 0) == (_request(journal, tmp_path)["attempts"][-1]["state"], _lines(effects),
                                        started.request)  # fmt: skip
    assert 0 == effectlog("verify", "--journal", journal, cwd=tmp_path).returncode


# -- 2. second actors on one run -----------------------------------------------------------------------


def test_a_plain_run_of_a_queued_requests_run_id_is_refused_and_the_runner_sends_each_step_once(
    tmp_path: Path,
) -> None:
    """``effectlog run --journal STORE`` on the run id of a request still queued (no lease yet). Proves:
    refused (exit 5, ``run_bound``, one line), nothing written; the runner then sends the step once."""
    effects = tmp_path / "fx.txt"
    _shell_plan(tmp_path / "p.json", "f1", effects)
    store = str(tmp_path / "st.db")
    assert 0 == effectlog("submit", "--store", store, "--scope", "s", "--key", "k", "p.json", cwd=tmp_path).returncode
    plain = effectlog("run", "--journal", store, "p.json", cwd=tmp_path)
    assert (int(ExitStatus.CONFLICT), True) == (plain.returncode, "run_bound" in one_line(plain.stderr))
    assert [] == _lines(effects)
    assert 0 == effectlog("runner", "--store", store, "--exit-when-idle", "-q", cwd=tmp_path).returncode
    assert ["s1"] == _lines(effects)


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_runner_does_not_take_over_a_run_a_live_plain_process_drives(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    """A plain ``effectlog run --journal STORE`` drives run f1 (its first step in flight, 3 s) when the same
    plan is submitted to the fleet (the request names a run that exists but has no request: accepted, as
    a finished plain run is adopted) and a runner claims it. The runner resumed the run at once: it wrote
    ``step.uncertain`` "requested before a crash" for the step the live process was running and stopped
    the run for an operator; the live process's confirmation was then refused (``event_conflict``), its
    second step never ran. Proves: the runner writes nothing into a run a live process owns (the attempt
    goes to an operator, naming that process), the plain run completes with each step once, and a requeue
    once it has ended adopts the finished run without sending anything again."""
    effects = tmp_path / "fx.txt"
    gate = tmp_path / "gate"
    _shell_plan(tmp_path / "p.json", "f1", effects, gate=gate, steps=2)
    store = str(tmp_path / "st.db") if backend == "sqlite" else str(request.getfixturevalue("pg_url"))
    plain = subprocess.Popen([sys.executable, "-m", "effectlog", "run", "--journal", store, "p.json"], cwd=tmp_path,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while _head(store, "f1") < 2:  # s1 requested, in flight
            assert time.monotonic() < deadline
            assert plain.poll() is None, plain.communicate()
            time.sleep(0.05)
        assert 0 == effectlog("submit", "--store", store, "--scope", "s", "--key", "k", "p.json",
                              cwd=tmp_path).returncode  # fmt: skip
        effectlog("runner", "--store", store, "--exit-when-idle", "-q", "--lease-s", "2", cwd=tmp_path)
        gate.touch()  # the live process's step returns only after the runner has come and gone
        _, stderr = plain.communicate(timeout=60)
    finally:
        if plain.poll() is None:
            plain.kill()
            plain.wait()
    assert (0, ["s1", "s2"]) == (plain.returncode, _lines(effects)), stderr
    shown = _request(store, tmp_path)
    last = shown["history"][-1]
    assert ("needs_operator", True) == (last["to_state"], "outside the fleet" in last["reason"]), last
    requeue = effectlog("operator", "requeue", "--store", store, "--request", "1", "--by", "t", "--reason", "done",
                        cwd=tmp_path)  # fmt: skip
    assert 0 == requeue.returncode, requeue.stderr
    assert 0 == effectlog("runner", "--store", store, "--exit-when-idle", "-q", cwd=tmp_path).returncode
    listed = json.loads(effectlog("requests", "--store", store, "--json", cwd=tmp_path).stdout)
    assert ("succeeded", ["s1", "s2"]) == (listed[0]["state"], _lines(effects))


def _head(location: str, run_id: str) -> int:
    """The run's last seq (0 while the journal or the run does not exist yet)."""
    try:
        journal = open_journal(location, writer=False)
    except JournalUnreadable:
        return 0
    try:
        return journal.head(run_id)[0] if run_id in journal.runs() else 0
    finally:
        journal.close()


# -- 1. commit outcome unknown at the storage layer (PostgreSQL) ----------------------------------------


def _drop_every_other_session(url: str) -> int:
    """``pg_terminate_backend`` of every session of the database but this one: the runner's pooled
    connections (appends, heartbeats, claims) and its watcher's all die at once, as in a failover."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
    return len(rows)


@pytest.mark.postgres
@pytest.mark.parametrize("point", ["after_request", "before_append:step.effected"])
def test_connections_dropped_mid_step_are_outlived_with_each_effect_once(
    tmp_path: Path, pg_url: str, point: str
) -> None:
    """A runner on PostgreSQL pauses at ``point`` of step s1 (its request durable; its tool's effect done,
    its effected batch about to be sent) while every one of its connections is terminated by the server,
    then goes on: its next append, heartbeat and report meet dead connections. It used to give the
    attempt up ("error", the lease left to run out and recovery to send it to an operator, s1 then
    uncertain for a person to settle though its batch had simply not been written). Proves: the runner
    sends the unanswered batch once more on a new connection (idempotent by its batch key) and completes
    the run: request succeeded, s1 and s2 sent once each, ``verify`` ok."""
    from fleet_kit import RunnerProcess

    effects = tmp_path / "fx.txt"
    _shell_plan(tmp_path / "p.json", "f1", effects, steps=2)
    assert 0 == effectlog("submit", "--store", pg_url, "--scope", "s", "--key", "k", "p.json", cwd=tmp_path).returncode
    fast = ("--lease-s", "2", "--heartbeat-s", "0.2", "--poll-s", "0.05", "--max-attempts", "1")
    runner = RunnerProcess(pg_url, tmp_path, "A", arm=point, resumable=True, extra=fast)
    try:
        assert f"{point} s1" == runner.reached()
        assert _drop_every_other_session(pg_url) >= 1
        runner.resume()
        assert 0 == runner.wait(), runner.log()
    finally:
        runner.stop()
    assert ("succeeded", ["s1", "s2"]) == (_request(pg_url, tmp_path)["attempts"][-1]["state"], _lines(effects))
    verify = effectlog("verify", "--journal", pg_url, cwd=tmp_path)
    assert 0 == verify.returncode, verify.stderr


def test_recover_over_a_store_leaves_a_killed_runners_run_to_the_fleet(tmp_path: Path) -> None:
    """A runner is SIGKILLed after step s1's effect; its lease runs out; someone runs ``effectlog recover
    --journal STORE`` ("resume every interrupted run nobody drives") before any recovery pass. Proves: the
    fleet's run is refused there (exit 5, the row names the request), nothing is sent, and the fleet's own
    recovery sends the attempt to an operator with s1 sent once."""
    from fleet_kit import RunnerProcess

    effects = tmp_path / "fx.txt"
    _shell_plan(tmp_path / "p.json", "f1", effects, steps=2)
    store = str(tmp_path / "st.db")
    assert 0 == effectlog("submit", "--store", store, "--scope", "s", "--key", "k", "p.json", cwd=tmp_path).returncode
    killed = RunnerProcess(store, tmp_path, "A", arm="after_effect", extra=("--lease-s", "1", "--heartbeat-s", "0.2"))
    try:
        assert "after_effect s1" == killed.reached()
        killed.signal(signal.SIGKILL)
        killed.wait()
    finally:
        killed.stop()
    time.sleep(1.2)  # past the lease
    recover = effectlog("recover", "--journal", store, cwd=tmp_path)
    assert (int(ExitStatus.CONFLICT), True) == (recover.returncode, "fleet request 1" in recover.stdout), recover
    assert ["s1"] == _lines(effects)
    assert 0 == effectlog("runner", "--store", store, "--exit-when-idle", "-q", cwd=tmp_path).returncode
    assert ("needs_operator", ["s1"]) == (_request(store, tmp_path)["attempts"][-1]["state"], _lines(effects))


# -- 2. a runner stopped inside a step, past its lease ---------------------------------------------------


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_runner_stopped_between_a_steps_request_and_its_call_is_fenced_and_nobody_sends_the_step_twice(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    """Runner Z has recorded step s1's request (non-idempotent shell) and is about to call the tool when it is
    SIGSTOPped past its lease; the recovery service and runner B act meanwhile; then Z continues (SIGCONT)
    and makes its call. Proves: B does not send s1 (a requested step of an expired lease is a person's
    decision, not a requeue), Z's later writes are refused, s1's effect happens at most once, and s2 is
    never sent while s1's outcome is unrecorded."""
    from fleet_kit import RunnerProcess

    effects = tmp_path / "fx.txt"
    _shell_plan(tmp_path / "p.json", "f1", effects, steps=2)
    store = str(tmp_path / "st.db") if backend == "sqlite" else str(request.getfixturevalue("pg_url"))
    assert 0 == effectlog("submit", "--store", store, "--scope", "s", "--key", "k", "p.json", cwd=tmp_path).returncode
    fast = ("--lease-s", "1", "--heartbeat-s", "0.2", "--poll-s", "0.05", "--max-attempts", "1")
    zombie = RunnerProcess(store, tmp_path, "Z", arm="after_request", resumable=True, extra=fast)
    try:
        assert "after_request s1" == zombie.reached()
        zombie.signal(signal.SIGSTOP)
        deadline = time.monotonic() + 60
        while True:  # the lease runs out; the recovery pass (in B) decides the attempt
            assert time.monotonic() < deadline
            time.sleep(0.3)
            effectlog("runner", "--store", store, "--runner-id", "B", "--exit-when-idle", "-q", *fast[:-2],
                      cwd=tmp_path)  # fmt: skip
            shown = _request(store, tmp_path)
            if shown["attempts"][-1]["state"] not in ("leased", "preparing", "running"):
                break
        assert "needs_operator" == shown["attempts"][-1]["state"], shown
        assert [] == _lines(effects)  # B sent nothing
        before = _bodies(store, "f1")
        zombie.signal(signal.SIGCONT)
        zombie.resume()
        assert 0 == zombie.wait(), zombie.log()
    finally:
        zombie.stop()
    assert _lines(effects) in ([], ["s1"]), zombie.log()
    assert "needs_operator" == _request(store, tmp_path)["attempts"][-1]["state"]
    assert before == _bodies(store, "f1"), zombie.log()  # Z wrote nothing once it woke
    assert "step.uncertain" in [ev.tag_of(ev.decode(body)) for body in before]  # the recovery's decision
    verify = effectlog("verify", "--journal", store, cwd=tmp_path)
    assert 0 == verify.returncode, verify.stderr


def _bodies(location: str, run_id: str) -> list[bytes]:
    journal = open_journal(location, writer=False)
    try:
        return [record.body for record in journal.read(run_id)]
    finally:
        journal.close()


# -- 5. a PostgreSQL database where another application uses the fleet's schema name -------------------


@pytest.mark.postgres
def test_another_applications_effectlog_fleet_schema_is_refused_by_name_and_left_alone(
    tmp_path: Path, pg_url: str
) -> None:
    """The database holds a schema ``effectlog_fleet`` of another application (a ``requests`` table, no
    ``meta``). It was taken for a fresh fleet schema: the DDL ran into the other table and ``submit`` said
    only ``relation "requests" already exists``. Proves: ``submit`` and ``requests`` are refused in one
    line saying the schema is not an effectlog fleet, and the other application's schema is unchanged."""
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA effectlog_fleet")
        conn.execute("CREATE TABLE effectlog_fleet.requests (id int, note text)")
        conn.execute("INSERT INTO effectlog_fleet.requests VALUES (1, 'theirs')")
    _shell_plan(tmp_path / "p.json", "f1", tmp_path / "fx.txt")
    submit = ["submit", "--store", pg_url, "--scope", "s", "--key", "k", "p.json"]
    for argv in (submit, ["requests", "--store", pg_url]):
        done = effectlog(*argv, cwd=tmp_path)
        line = one_line(done.stderr)
        assert (int(ExitStatus.BAD_INPUT), True) == (done.returncode, "is not an effectlog fleet" in line), line
    with psycopg.connect(pg_url, autocommit=True) as conn:
        tables = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'effectlog_fleet'"
        ).fetchall()
        rows = conn.execute("SELECT * FROM effectlog_fleet.requests").fetchall()
    assert ([("requests",)], [(1, "theirs")]) == (tables, rows)


class _AckDropper:
    """A TCP proxy in front of the PostgreSQL server that, once ``arm``ed, lets the next ``COMMIT`` through
    to the server and then cuts that connection before the server's answer reaches the client: a commit
    that landed, whose acknowledgement was lost (the case ``pg_terminate_backend`` cannot time)."""

    COMMIT = b"Q\x00\x00\x00\x0bCOMMIT\x00"  # a simple-protocol Query message of "COMMIT"
    COMMITTED = b"C\x00\x00\x00\x0bCOMMIT\x00"  # the server's CommandComplete for it: the commit is made

    def __init__(self, port: int) -> None:
        self.server_port = port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.armed = threading.Event()
        self.fired = threading.Event()
        self.landed = threading.Event()  # the server answered that COMMIT (the answer dropped): it is made
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.server_port))
            cut, answered = threading.Event(), threading.Event()
            threading.Thread(target=self._pump, args=(client, upstream, cut, answered, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, cut, answered, False), daemon=True).start()

    def _pump(
        self, src: socket.socket, dst: socket.socket, cut: threading.Event, answered: threading.Event, from_client: bool
    ) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if from_client and self.COMMIT in data and self.armed.is_set() and not self.fired.is_set():
                    self.fired.set()
                    cut.set()  # set before the COMMIT goes out: its answer is never relayed
                    dst.sendall(data)
                    answered.wait(60)  # the server has committed once it answers (its answer is dropped)
                    break
                if cut.is_set() and not from_client:
                    if self.COMMITTED in data:
                        answered.set()
                        self.landed.set()
                    continue  # the answer to the COMMIT: dropped
                dst.sendall(data)
        except OSError:
            pass
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def close(self) -> None:
        self.closed = True
        self.listener.close()


def _wait_for_a_later_renewal(pg_url: str) -> None:
    """Wait until the attempt's lease has been renewed again after the renewal whose acknowledgement was
    dropped (its expiry in the store moved on), two minutes at most."""
    import psycopg

    query = "SELECT max(lease_expires_at) FROM effectlog_fleet.attempts"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        first = conn.execute(query).fetchone()
        deadline = time.monotonic() + 120
        while conn.execute(query).fetchone() == first:
            assert time.monotonic() < deadline, "no renewal landed after the unacknowledged one in 120 s"
            time.sleep(0.05)


@pytest.mark.postgres
@pytest.mark.parametrize("point", ["before_append:step.requested", "after_effect", "heartbeat", "after_confirm"])
def test_a_commit_that_landed_but_whose_acknowledgement_was_lost_sends_no_step_again(
    tmp_path: Path, pg_url: str, point: str
) -> None:
    """A runner on PostgreSQL (through a proxy) commits the batch after ``point`` of step s1 (the run's first
    batch: the held ``run.started``, s1's request and the attempt's carried transitions; or s1's effected
    batch), or a lease renewal while it holds s1 (``heartbeat``), the commit lands, and the connection is
    cut before the acknowledgement arrives.
    Proves: the runner neither takes the landed commit for a failed one (sending s1 again) nor gives the
    attempt up: it sends the unanswered batch once more (found, by its batch key) and the first attempt
    completes the run, s1 and s2 sent once each; ``verify`` passes. (Before, a lost acknowledgement of the
    run's first batch sent the attempt to an operator, and the requeue found s1 "uncertain" though its
    tool had never been called.)"""
    from urllib.parse import urlsplit, urlunsplit

    from fleet_kit import RunnerProcess

    effects = tmp_path / "fx.txt"
    steps = 1 if point == "after_confirm" else 2  # one step: the next commit is run.completed's, with the success
    _shell_plan(tmp_path / "p.json", "f1", effects, steps=steps)
    assert 0 == effectlog("submit", "--store", pg_url, "--scope", "s", "--key", "k", "p.json", cwd=tmp_path).returncode
    parts = urlsplit(pg_url)
    proxy = _AckDropper(int(parts.port or 5432))
    through = urlunsplit(parts._replace(netloc=f"{parts.username}@127.0.0.1:{proxy.port}"))
    beat = "0.3" if point == "heartbeat" else "10"  # else no renewal commits in the window
    slow = ("--lease-s", "30", "--heartbeat-s", beat, "--poll-s", "0.05", "--max-attempts", "1")
    arm = "after_request" if point == "heartbeat" else point
    runner = RunnerProcess(through, tmp_path, "A", arm=arm, resumable=True, extra=slow)
    try:
        assert f"{arm} s1" == runner.reached()
        proxy.armed.set()
        if point == "heartbeat":
            assert proxy.fired.wait(30)  # a renewal's commit: landed, unacknowledged
            assert proxy.landed.wait(120), "the server never answered the renewal's COMMIT"
            _wait_for_a_later_renewal(pg_url)  # the next renewals, on other connections
        runner.resume()
        assert 0 == runner.wait(), runner.log()
    finally:
        runner.stop()
        proxy.close()
    assert proxy.fired.is_set()
    attempts = _request(pg_url, tmp_path)["attempts"]
    sent = ["s1", "s2"][:steps]
    assert (["succeeded"], sent) == ([a["state"] for a in attempts], _lines(effects)), runner.log()
    verify = effectlog("verify", "--journal", pg_url, cwd=tmp_path)
    assert 0 == verify.returncode, verify.stderr

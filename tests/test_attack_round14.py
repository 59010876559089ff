"""Round-14 attacks on the fleet (``submit``, ``runner``, ``operator``, leases, both stores): the classes of
earlier rounds (second actors, keys that ignore the body, columns outside the chain, hostile values) with
cases nobody had tried. Each test is one suspicion: a failing reproduction first where it found a defect,
kept as a regression test where it found none. Real SQLite files, real PostgreSQL (``pg_url``), real
processes (``python -m effectlog``)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from effectlog import events as ev
from effectlog.errors import ExitStatus, JournalUnreadable
from effectlog.journal import open_journal
from hardening_kit import effectlog, one_line

pytest_plugins = ["pg_fixture"]


def _shell_plan(path: Path, run_id: str, effects: Path, *, sleep_s: float = 0.0, steps: int = 1) -> Path:
    """A plan of ``steps`` non-idempotent shell steps, each appending its id to ``effects`` (after
    ``sleep_s`` seconds for the first): a step sent twice shows as a line twice."""
    wait = f"sleep {sleep_s}; " if sleep_s else ""
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
    "text",
    ["k\u2028x", "k\u2029x", "k\x85x", "k\x9b31mx", "k\x7fx", "k\u202ex", "k\u200bx"],
    ids=["line-separator", "paragraph-separator", "next-line", "c1-csi", "delete", "rtl-override", "zero-width"],
)
@pytest.mark.parametrize("flag", ["--scope", "--key"])
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
    _shell_plan(tmp_path / "p.json", "f1", effects, sleep_s=3, steps=2)
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
        _, stderr = plain.communicate(timeout=60)
    finally:
        if plain.poll() is None:
            plain.kill()
            plain.wait()
    assert (0, ["s1", "s2"]) == (plain.returncode, _lines(effects)), stderr
    shown = json.loads(effectlog("requests", "--store", store, "--request", "1", "--json", cwd=tmp_path).stdout)
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

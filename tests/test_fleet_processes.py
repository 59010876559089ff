"""The fleet with real runner processes on SQLite and on PostgreSQL: kill the runner, a zombie, a race.

Each test starts `effectlog runner` children, kills or stops them with real signals
(SIGKILL, SIGSTOP/SIGCONT), and proves its claim from the store's records, the runs'
journal and the effect ledger. Leases are short (two seconds) and configurable;
nothing asserts on wall time.
"""

from __future__ import annotations

import json
import signal
from collections import Counter
from pathlib import Path

import pytest

from effectlog import events as ev
from effectlog.adapters.effects import EffectStore
from effectlog.fleet import FleetStore
from effectlog.fleet import attempts as am
from effectlog.journal import load_run
from fleet_kit import RunnerProcess, effectlog, snapshot, wait_until, write_plan

pytest_plugins = ["pg_fixture", "fleet_kit"]
pytestmark = pytest.mark.crash

FAST = ("--lease-s", "2.0", "--heartbeat-s", "0.2", "--poll-s", "0.05")


def effect_rows(path: Path) -> list[tuple[str, str, int]]:
    """(run, step, attempt) of every effect in the ledger, in the order they happened."""
    ledger = EffectStore(path)
    try:
        return [(r.run_id, r.step_id, r.attempt) for r in ledger.rows()]
    finally:
        ledger.close()


def tags(store: FleetStore, run_id: str) -> list[str]:
    return [ev.tag_of(ev.decode(r.body)) for r in store.journal().read(run_id)]


@pytest.mark.parametrize(
    "case",
    [("after_request", 0), ("after_effect", 1)],
    ids=["in-flight-before-the-tool", "tool-applied-receipt-lost"],
)
def test_killing_the_runner_midway_needs_an_operator_and_the_retry_charges_once(
    store_url: str, store: FleetStore, runners: list[RunnerProcess], tmp_path: Path, case: tuple[str, int]
) -> None:
    """SIGKILL the runner holding the lease while its non-idempotent step is in flight.

    Proves: the attempt is not lost (needs_operator, with an audit record), the other
    runner launches nothing, and after `reconcile --from-ledger` and the operator's
    requeue the retry finishes with the charge applied exactly once.
    """
    point, charged_before_retry = case
    plan = write_plan(tmp_path / "pay.json", "pay-1", [("charge", "control"), ("notify", "idem")])
    effectlog("submit", str(plan), "--store", store_url, "--scope", "shop", "--key", "order-1", "--requires", "pay")
    holder = RunnerProcess(store_url, tmp_path, "A", arm=point, extra=(*FAST, "--capabilities", "pay"))
    runners.append(holder)
    assert f"{point} charge" == holder.reached()
    other = RunnerProcess(store_url, tmp_path, "B", extra=(*FAST, "--capabilities", "pay", "--max-attempts", "1"))
    runners.append(other)
    holder.signal(signal.SIGKILL)
    holder.wait()

    waiting = wait_until(lambda: store.requests(["needs_operator"]) or None, "the request to need an operator")
    request_id = waiting[0].request_id
    assert [("needs_operator", "A", 1)] == [(a.state, a.runner_id, a.token) for a in store.attempts()]
    audit = store.history(request_id)[-1]
    assert ("expire", "recovery_service", ["charge"]) == (audit.transition, audit.actor, audit.detail["requested"])
    assert [("pay-1", "charge", 1)] * charged_before_retry == effect_rows(tmp_path / "effects.db")
    assert 1 == tags(store, "pay-1").count("step.requested")  # no second launch while the operator decides
    # The recovery pass commits needs_operator, then records step.uncertain in a second transaction
    # (recovery.recover_once): wait for the second rather than look between the two.
    wait_until(  # fails the test if the step is never recorded uncertain
        lambda: load_run(store.journal(), "pay-1").steps["charge"].state == "uncertain" or None,
        "the recovery pass to record the step uncertain",
    )

    effectlog(
        "reconcile", "--journal", store_url, "--run-id", "pay-1", "--step", "charge",
        "--from-ledger", str(tmp_path / "effects.db"),
    )  # fmt: skip
    assert other.proc.poll() is None  # B is still there, waiting for work it may take
    effectlog("operator", "requeue", "--store", store_url, "--request", str(request_id),
              "--reason", "reconciled from the ledger", "--by", "alice")  # fmt: skip
    assert 0 == other.wait()

    effects = Counter(step for _, step, _ in effect_rows(tmp_path / "effects.db"))
    assert {"charge": 1, "notify": 1} == dict(effects)
    assert [(1, "lost", "A", 1), (2, "succeeded", "B", 2)] == [
        (a.attempt_no, a.state, a.runner_id, a.token) for a in store.attempts()
    ]
    assert "succeeded" == store.request(request_id).state
    assert "completed" == load_run(store.journal(), "pay-1").state
    requeue = [h for h in store.history(request_id) if h.transition == "requeue"]
    assert [("operator", "alice", "reconciled from the ledger")] == [(h.actor, h.actor_name, h.reason) for h in requeue]
    effectlog("verify", "--journal", store_url, "--run-id", "pay-1")


def test_a_zombie_runner_is_fenced_off_and_changes_nothing(
    store_url: str, store: FleetStore, runners: list[RunnerProcess], tmp_path: Path
) -> None:
    """SIGSTOP a runner past its lease expiry, let another take and finish the request, SIGCONT the first.

    Proves: the store refuses the zombie's writes (journal append and heartbeat, by
    fencing token), and every record (requests, attempts, history, journal, effect
    ledger) is byte for byte what it was before the zombie woke up.
    """
    plan = write_plan(tmp_path / "job.json", "job-1", [("build", "idem"), ("push", "control")])
    effectlog("submit", str(plan), "--store", store_url, "--scope", "ci", "--key", "job-1")
    zombie = RunnerProcess(
        store_url, tmp_path, "Z", arm="before_append:run.started", resumable=True, extra=(*FAST, "--max-attempts", "1")
    )
    runners.append(zombie)
    assert "before_append:run.started -" == zombie.reached()
    zombie.signal(signal.SIGSTOP)

    healthy = RunnerProcess(store_url, tmp_path, "H", extra=(*FAST, "--max-attempts", "1"))
    runners.append(healthy)
    assert 0 == healthy.wait()
    assert [("lost", "Z", 1), ("succeeded", "H", 2)] == [(a.state, a.runner_id, a.token) for a in store.attempts()]
    before = snapshot(store, "job-1", tmp_path / "effects.db")

    zombie.signal(signal.SIGCONT)
    zombie.resume()
    assert 0 == zombie.wait()

    assert before == snapshot(store, "job-1", tmp_path / "effects.db")
    log = zombie.log()
    assert "write refused, stopping: stale_lease" in log, log
    assert "newest fencing token is 2" in log, log
    assert {"build": 1, "push": 1} == dict(Counter(step for _, step, _ in effect_rows(tmp_path / "effects.db")))


def test_racing_runners_keep_one_live_attempt_per_request_and_end_each_once(
    store_url: str, store: FleetStore, runners: list[RunnerProcess], tmp_path: Path
) -> None:
    """Four runner processes (capacity 2 each) race for 24 requests.

    Proves: at every sampled moment, and at every step of the append-only history,
    each request has at most one live attempt; every request ends exactly once
    (succeeded, one run.completed); every step's non-idempotent effect happened once.
    """
    requests = 24
    for i in range(requests):
        plan = write_plan(tmp_path / f"p{i}.json", f"run-{i}", [("a", "control"), ("b", "control")])
        effectlog("submit", str(plan), "--store", store_url, "--scope", "race", "--key", f"k{i}")
    extra = ("--lease-s", "5", "--heartbeat-s", "0.5", "--poll-s", "0.02", "--capacity", "2", "--exit-when-idle")
    for name in "ABCD":
        runners.append(RunnerProcess(store_url, tmp_path, name, extra=extra))

    samples = 0
    while any(r.proc.poll() is None for r in runners):
        live = Counter(a.request_id for a in store.attempts() if a.state in am.LIVE)
        assert [] == [rid for rid, n in live.items() if n > 1]
        samples += 1
    assert [0, 0, 0, 0] == [r.wait() for r in runners]
    assert samples > 0

    live_now: dict[int, set[int]] = {}
    for row in store.history():  # replay the history: never two live attempts of one request
        held = live_now.setdefault(row.request_id, set())
        if row.to_state in am.LIVE:
            held.add(row.attempt_id)
        else:
            held.discard(row.attempt_id)
        assert len(held) <= 1, row
    ends = Counter(h.request_id for h in store.history() if h.to_state in am.FINAL - {"lost"})
    assert dict.fromkeys(range(1, requests + 1), 1) == dict(ends)
    assert ["succeeded"] * requests == [v.state for v in store.requests()]
    assert [1] * requests == [tags(store, f"run-{i}").count("run.completed") for i in range(requests)]
    effects = Counter(effect_rows(tmp_path / "effects.db"))
    assert 2 * requests == len(effects)
    assert {1} == set(effects.values())


def test_a_cancelled_request_stops_after_the_current_steps_commit(
    store_url: str, store: FleetStore, runners: list[RunnerProcess], tmp_path: Path
) -> None:
    """An operator cancels while step a runs; the runner sees it at a heartbeat and stops after a's commit.

    Proves: step a is confirmed, step b never starts (no request, no effect), the run
    is closed as cancelled in the journal, and the attempt and request are cancelled.
    """
    plan = write_plan(tmp_path / "p.json", "run-c", [("a", "control"), ("b", "control")])
    effectlog("submit", str(plan), "--store", store_url, "--scope", "s", "--key", "c")
    runner = RunnerProcess(
        store_url, tmp_path, "A", arm="after_effect", resumable=True, extra=(*FAST, "--max-attempts", "1")
    )
    runners.append(runner)
    assert "after_effect a" == runner.reached()
    effectlog("operator", "cancel", "--store", store_url, "--request", "1", "--reason", "wrong order", "--by", "bob")
    wait_until(lambda: "cancellation observed" in runner.log(), "a heartbeat to carry the cancellation")
    runner.resume()
    assert 0 == runner.wait()

    state = load_run(store.journal(), "run-c")
    assert ("cancelled", "confirmed", None) == (state.state, state.steps["a"].state, state.step("b"))
    assert [("run-c", "a", 1)] == effect_rows(tmp_path / "effects.db")
    assert [("cancelled", "cancelled")] == [(a.state, store.request(a.request_id).state) for a in store.attempts()]


def test_a_run_waiting_for_approval_holds_its_lease_until_a_person_decides(
    store_url: str, store: FleetStore, runners: list[RunnerProcess], tmp_path: Path
) -> None:
    """A step that needs approval: the attempt waits (waiting_decision, lease renewed), then resumes and succeeds."""
    raw = json.loads(write_plan(tmp_path / "p.json", "run-w", [("deploy", "idem")]).read_text())
    raw["steps"][0]["approval"] = "required"
    (tmp_path / "p.json").write_text(json.dumps(raw))
    effectlog("submit", str(tmp_path / "p.json"), "--store", store_url, "--scope", "s", "--key", "w")
    runner = RunnerProcess(store_url, tmp_path, "A", extra=(*FAST, "--max-attempts", "1"))
    runners.append(runner)
    waiting = wait_until(lambda: store.requests(["waiting_decision"]) or None, "the run to wait for approval")
    first = store.attempts()[0].lease_expires_at
    assert first is not None
    wait_until(lambda: (store.attempts()[0].lease_expires_at or 0) > first + 0.5, "the lease to be renewed")
    effectlog("approve", "--journal", store_url, "--run-id", "run-w", "--step", "deploy", "--by", "alice")
    assert 0 == runner.wait()
    assert "succeeded" == store.request(waiting[0].request_id).state
    assert ["lease", "prepare", "start", "await_decision", "resume", "succeed"] == [
        h.transition for h in store.history()
    ]
    assert [("run-w", "deploy", 1)] == effect_rows(tmp_path / "effects.db")


POISON_TOOLS = '''
import os
import signal


def _die(decl, context):
    """An adapter whose construction kills the runner process, before any step is requested."""
    os.kill(os.getpid(), signal.SIGKILL)


ADAPTERS = {"test.poison": _die}
'''


def test_a_poison_request_is_requeued_up_to_its_limit_then_needs_an_operator(
    store_url: str, store: FleetStore, tmp_path: Path
) -> None:
    """Runner processes die (SIGKILL from the adapter) on one request before its first step, one after another.

    Proves: the request is re-queued automatically exactly --max-requeues times (2), each
    time after a backoff, and the next loss sends it to needs_operator instead of killing
    another runner; `requests` shows the attempts, the runners that died and why.
    """
    import os
    import subprocess
    import sys

    (tmp_path / "poison_tools.py").write_text(POISON_TOOLS)
    plan = tmp_path / "poison.json"
    plan.write_text(
        json.dumps(
            {"run_id": "poison-1", "adapters": {"p": {"type": "test.poison"}}, "steps": [{"id": "s", "adapter": "p"}]}
        )
    )
    effectlog("submit", str(plan), "--store", store_url, "--scope", "s", "--key", "k",
              "--max-requeues", "2", "--requeue-backoff-s", "0.1")  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
    exits: list[int] = []
    for i in range(5):  # one more runner than should ever die
        argv = [sys.executable, "-m", "effectlog", "runner", "--store", store_url, "--runner-id", f"R{i}",
                "--adapters", "poison_tools:ADAPTERS", "--max-attempts", "1", "--lease-s", "1", "--heartbeat-s", "0.2",
                "--poll-s", "0.05"]  # fmt: skip
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_until(
                lambda p=proc: p.poll() is not None or store.request(1).state == "needs_operator" or None,
                f"runner R{i} to die or the request to need an operator",
            )
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            exits.append(proc.wait(timeout=60))
        if store.request(1).state == "needs_operator":
            break
    assert [-signal.SIGKILL] * 3 + [0] == exits
    view = store.request(1)
    assert ("needs_operator", 3, 2, 2) == (view.state, view.attempt_no, view.requeues, view.max_requeues)
    assert [(1, "lost", "R0"), (2, "lost", "R1"), (3, "needs_operator", "R2")] == [
        (a.attempt_no, a.state, a.runner_id) for a in store.attempts(1)
    ]
    loses = [h.detail for h in store.history(1) if h.transition == "lose"]
    assert [(1, 0.1), (2, 0.2)] == [(d["requeue"], d["backoff_s"]) for d in loses]
    listed = effectlog("requests", "--store", store_url, "--request", "1").stdout
    assert "automatic requeues 2 of 2" in listed
    assert "--max-requeues 2" in listed

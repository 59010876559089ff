"""Attacker's pass, round 24: the fleet and the operator console.

Real runner processes (SIGKILL), real SQLite files and real PostgreSQL; each test says what it proves.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from effectlog import events as ev
from effectlog.fleet import FleetStore
from fleet_kit import RunnerProcess, effectlog, together, wait_until, write_plan

pytest_plugins = ["pg_fixture", "fleet_kit"]
pytestmark = pytest.mark.crash

FAST = ("--lease-s", "2.0", "--heartbeat-s", "0.2", "--poll-s", "0.05")


def tags(store: FleetStore, run_id: str) -> list[str]:
    return [ev.tag_of(ev.decode(r.body)) for r in store.journal().read(run_id)]


@pytest.mark.parametrize("ending", ["cancel", "fail"])
def test_a_decision_on_a_held_step_of_a_fleet_request_that_has_ended_is_refused(
    store_url: str, store: FleetStore, runners: list[RunnerProcess], tmp_path: Path, ending: str
) -> None:
    """A fleet run holds its step for approval; its runner is SIGKILLed while it waits; the recovery
    service sends the request round (``--max-requeues 1``: queued again) or to an operator
    (``--max-requeues 0``), and an operator ends it (``cancel`` of the queued request, ``fail`` of the
    one that needs an operator). Then a person types the approve (or deny) command the held step shows.

    Proves: the decision is refused with exit 5 naming the request and its end, and nothing is written
    to the run's journal. Before the fix it was recorded ("resume the run to execute it once"), on a
    run no runner would ever resume: the person was told an effect would happen that never could."""
    raw = json.loads(write_plan(tmp_path / "p.json", "run-h", [("deploy", "idem")]).read_text())
    raw["steps"][0]["approval"] = "required"
    (tmp_path / "p.json").write_text(json.dumps(raw))
    limit = "1" if ending == "cancel" else "0"
    effectlog(
        "submit", str(tmp_path / "p.json"), "--store", store_url, "--scope", "s", "--key", "h",
        "--max-requeues", limit, "--requeue-backoff-s", "0",
    )  # fmt: skip
    holder = RunnerProcess(store_url, tmp_path, "A", extra=(*FAST, "--max-attempts", "1"))
    runners.append(holder)
    (waiting,) = wait_until(lambda: store.requests(["waiting_decision"]) or None, "the run to wait for approval")
    holder.signal(signal.SIGKILL)
    holder.wait()
    after = "queued" if ending == "cancel" else "needs_operator"

    def recovered() -> bool | None:
        effectlog("recovery", "--store", store_url, "--once")
        return store.request(waiting.request_id).state == after or None

    wait_until(recovered, f"the recovery service to make the request {after}")
    effectlog(
        "operator", ending, "--store", store_url, "--request", str(waiting.request_id), "--by", "bob",
        "--reason", "not any more",
    )  # fmt: skip
    ended = store.request(waiting.request_id).state
    assert {"cancel": "cancelled", "fail": "failed"}[ending] == ended
    before = tags(store, "run-h")
    for verb in ("approve", "deny"):
        done = effectlog(
            verb, "--journal", store_url, "--run-id", "run-h", "--step", "deploy", "--by", "alice", check=False
        )
        message = done.stderr.strip()
        assert (5, 1, True, True) == (
            done.returncode,
            len(message.splitlines()),
            f"request {waiting.request_id}" in message,
            ended in message,
        ), (verb, done.returncode, done.stdout, message)
    assert before == tags(store, "run-h")


RACER = """
import contextlib, io, json, sys
from effectlog.cli import main
print("ready", flush=True)
sys.stdin.readline()
err = io.StringIO()
with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
    code = main({argv!r})
print(json.dumps({{"code": code, "err": err.getvalue()}}))
"""


def test_two_processes_submitting_one_key_at_once_make_one_request_and_a_different_plan_conflicts(
    store_url: str, store: FleetStore, tmp_path: Path
) -> None:
    """Rounds of three real processes released together, each ``effectlog submit`` of one --scope/--key:
    two with the same plan, one with another plan (another step). Proves: each round makes exactly one
    request, holding one of the two plans; every process whose plan is the winner's exits 0 (the same
    request), every other exits 5 naming the key, so a different plan under one key is never a second
    run and never silently the first one."""
    same = write_plan(tmp_path / "same.json", "run-same", [("a", "idem")])
    other = write_plan(tmp_path / "other.json", "run-same", [("a", "idem"), ("b", "idem")])
    for round_no in range(4):
        key = f"k{round_no}"
        argv = [
            ["submit", str(plan), "--store", store_url, "--scope", "race", "--key", key] for plan in (same, other, same)
        ]
        for plan in (same, other):  # a fresh run id each round: only the key is shared with earlier rounds
            raw = json.loads(plan.read_text())
            raw["run_id"] = f"run-{round_no}"
            plan.write_text(json.dumps(raw))
        out = together([[RACER.format(argv=a)] for a in argv])
        rows = [r for r in store.requests() if r.key == key]
        assert 1 == len(rows), rows
        codes = [o["code"] for o in out]
        assert sorted(codes) in ([0, 0, 5], [0, 5, 5]), out
        if sorted(codes) == [0, 5, 5]:
            assert 0 == codes[1], out  # the other plan won: both same-plan submits conflict
        else:
            assert 5 == codes[1], out
        assert all(key in o["err"] for o in out if o["code"] == 5), out


def test_a_stale_console_page_approving_a_held_step_of_an_ended_fleet_request_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The console serves a fleet store (SQLite): olga opens the held step's page while its runner waits
    for her; the runner is SIGKILLed, the recovery service queues the request again, an operator cancels
    it from the CLI. Then olga posts the approve form of the page she had open. Proves: the console
    answers 409 naming the ended request, and the run's journal is unchanged (the same refusal whichever
    door the decision comes in by)."""
    from console_kit import CARD, Setup, console, csrf_of, digest_on_page, held_plan, login

    monkeypatch.setenv("EFFECTLOG_SECRET_CARD", CARD)  # the runner's value for the plan's secret arg
    store_path = str(tmp_path / "fleet.db")
    setup = Setup(tmp_path, journal=store_path)
    (tmp_path / "held.json").write_text(json.dumps(held_plan("fleet-held")))
    effectlog(
        "submit", str(tmp_path / "held.json"), "--store", store_path, "--scope", "s", "--key", "k",
        "--max-requeues", "1", "--requeue-backoff-s", "0",
    )  # fmt: skip
    from effectlog.fleet import open_store

    with open_store(store_path) as store:
        holder = RunnerProcess(store_path, tmp_path, "A", extra=(*FAST, "--max-attempts", "1"))
        try:
            (waiting,) = wait_until(lambda: store.requests(["waiting_decision"]) or None, "the run to wait")
            with console(setup, "--store", store_path) as base:
                client, _ = login(base, "olga")
                page = client.get("/runs/fleet-held").text
                digest, token = digest_on_page(page), csrf_of(page)
                holder.signal(signal.SIGKILL)
                holder.wait()

                def requeued() -> bool | None:
                    effectlog("recovery", "--store", store_path, "--once")
                    return store.request(waiting.request_id).state == "queued" or None

                wait_until(requeued, "the recovery service to queue the request again")
                effectlog(
                    "operator", "cancel", "--store", store_path, "--request", str(waiting.request_id),
                    "--by", "bob", "--reason", "not any more",
                )  # fmt: skip
                before = tags(store, "fleet-held")
                done = client.post("/runs/fleet-held/steps/refund/approve", data={"csrf": token, "digest": digest})
            assert (409, True) == (done.status_code, f"request {waiting.request_id}" in done.text), done.text
            assert before == tags(store, "fleet-held")
        finally:
            holder.stop()


RECOVERER = """
import json, sys
from effectlog.fleet import open_store
from effectlog.fleet.recovery import recover_once
store = open_store({url!r})
print("ready", flush=True)
sys.stdin.readline()
done = recover_once(store)
store.close()
print(json.dumps([d.attempt_id for d in done]))
"""


def test_three_recovery_passes_racing_over_the_same_expired_leases_decide_each_once(
    store_url: str, store: FleetStore
) -> None:
    """Twelve requests leased for a moment (then expired, nobody heartbeating); three real processes
    each run one recovery pass (the recovery service's and a runner's own pass are this same
    ``recover_once``) released together. Proves: every expired attempt is decided by exactly one of
    them (the attempts they report are disjoint and cover all twelve), each has exactly one recovery
    transition in its history, and each request has exactly one attempt open again (queued)."""
    from effectlog.fleet.contract import noop_plan

    leases = []
    for i in range(12):
        request = store.submit("rec", f"k{i}", noop_plan(f"run-rec-{i}"), requeue_backoff_s=0.0).request
        lease = store.claim(request.request_id, "gone", 0.2)
        assert lease is not None
        leases.append(lease)
    wait_until(lambda: len(store.expired(100)) == 12 or None, "the twelve leases to expire")
    out = together([[RECOVERER.format(url=store_url)] for _ in range(3)])
    decided = [a for one in out for a in one]
    assert sorted(lease.attempt_id for lease in leases) == sorted(decided), out
    for lease in leases:
        recovery = [h for h in store.history(lease.request_id) if h.actor == "recovery_service"]
        assert (1, "queued") == (len(recovery), store.request(lease.request_id).state), recovery


def test_a_runner_paused_past_its_lease_after_the_request_does_not_send_the_call_when_resumed(
    store_url: str, store: FleetStore, runners: list[RunnerProcess], tmp_path: Path
) -> None:
    """A runner records ``step.requested`` for a non-idempotent charge and is SIGSTOPped before it sends
    the call; its lease expires and the recovery service sends the request to an operator (who would
    read an empty ledger: nothing was sent, so a reconcile "not applied" and a requeue would charge
    again); the SIGCONT'd runner goes on at once. Proves: the resumed runner does not send the call
    (its lease is gone: it asks the store before the send, not only its heartbeat thread, which had
    not run yet), so the ledger holds no charge from the zombie attempt."""
    plan = write_plan(tmp_path / "pay.json", "pay-z", [("charge", "control")])
    effectlog("submit", str(plan), "--store", store_url, "--scope", "shop", "--key", "z")
    zombie = RunnerProcess(
        store_url, tmp_path, "Z", arm="after_request", resumable=True, extra=(*FAST, "--max-attempts", "1")
    )
    runners.append(zombie)
    assert "after_request charge" == zombie.reached()
    zombie.signal(signal.SIGSTOP)
    request_id = store.requests()[0].request_id

    def sent_to_operator() -> bool | None:
        effectlog("recovery", "--store", store_url, "--once")
        return store.request(request_id).state == "needs_operator" or None

    wait_until(sent_to_operator, "the recovery service to send the request to an operator")
    zombie.signal(signal.SIGCONT)
    zombie.resume()
    zombie.wait()
    assert [] == effect_rows(tmp_path / "effects.db"), zombie.log()


def effect_rows(path: Path) -> list[tuple[str, str, int]]:
    """(run, step, attempt) of every effect in the ledger."""
    from effectlog.adapters.effects import EffectStore

    if not path.exists():
        return []
    ledger = EffectStore(path)
    try:
        return [(r.run_id, r.step_id, r.attempt) for r in ledger.rows()]
    finally:
        ledger.close()

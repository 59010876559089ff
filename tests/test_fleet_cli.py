"""The fleet's command line: exit statuses, idempotent submit, operator rules, the runner on a tiny plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from effectlog.cli import main
from effectlog.fleet import open_store
from effectlog.fleet.contract import started, wait_past
from fleet_kit import write_plan


@pytest.fixture
def store(tmp_path: Path) -> str:
    return str(tmp_path / "fleet.db")


@pytest.fixture
def plan(tmp_path: Path) -> Path:
    return write_plan(tmp_path / "plan.json", "run-1", [("a", "idem")])


def submit(store: str, plan: Path, key: str = "k", requires: str = "") -> int:
    return main(["submit", str(plan), "--store", store, "--scope", "s", "--key", key, "--requires", requires])


def test_submit_twice_is_one_request_and_a_changed_body_exits_5(
    store: str, plan: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Same key and body: exit 0 both times, one request. Same key, other plan: idempotency_conflict, exit 5."""
    assert [0, 0] == [submit(store, plan), submit(store, plan)]
    assert "already submitted" in capsys.readouterr().out
    other = write_plan(tmp_path / "other.json", "run-1", [("a", "idem"), ("b", "idem")])
    assert 5 == submit(store, other)
    assert "idempotency_conflict" in capsys.readouterr().err
    assert 5 == submit(store, plan, requires="gpu")
    with open_store(store) as s:
        assert 1 == len(s.requests())


def test_submit_validates_the_plan_before_touching_the_store(store: str, tmp_path: Path) -> None:
    """A broken plan is exit 2 and creates no store file."""
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert 2 == submit(store, bad)
    assert not Path(store).exists()


@pytest.mark.parametrize("action", ["requeue", "fail"])
def test_operator_decisions_outside_needs_operator_exit_2(
    store: str, plan: Path, action: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """requeue|fail on a queued request: wrong_state, exit 2, nothing written."""
    submit(store, plan)
    argv = ["operator", action, "--store", store, "--request", "1", "--reason", "why", "--by", "alice"]
    assert 2 == main(argv)
    assert "wrong_state" in capsys.readouterr().err
    with open_store(store) as s:
        assert [] == s.history()


def test_operator_cancel_withdraws_a_queued_request(store: str, plan: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """cancel on a queued request ends it at once; `requests --json` shows it with the audit row."""
    submit(store, plan)
    assert 0 == main(["operator", "cancel", "--store", store, "--request", "1", "--reason", "dup", "--by", "bob"])
    capsys.readouterr()
    assert 0 == main(["requests", "--store", store, "--request", "1", "--json"])
    shown = json.loads(capsys.readouterr().out)
    assert "cancelled" == shown["request"]["state"]
    assert [("withdraw", "operator", "bob", "dup")] == [
        (h["transition"], h["actor"], h["actor_name"], h["reason"]) for h in shown["history"]
    ]


def test_a_runner_runs_what_fits_and_leaves_the_rest(
    store: str, plan: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A runner without `gpu` runs the request that needs nothing and never claims the one that needs a GPU."""
    submit(store, plan)
    gpu = write_plan(tmp_path / "gpu.json", "run-gpu", [("a", "idem")])
    submit(store, gpu, key="g", requires="gpu")
    argv = ["runner", "--store", store, "--effects", str(tmp_path / "e.db"), "--exit-when-idle", "--poll-s", "0.01"]
    assert 0 == main(argv)
    capsys.readouterr()
    assert 0 == main(["requests", "--store", store, "--json"])
    assert ["succeeded", "queued"] == [r["state"] for r in json.loads(capsys.readouterr().out)]


def test_recovery_once_decides_expired_leases(store: str, plan: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`effectlog recovery --once` re-queues an expired lease whose run requested nothing."""
    submit(store, plan)
    with open_store(store) as s:
        lease = s.claim(1, "gone", 0.5)  # outlives a loaded disk's fsync, then waited out
        assert lease is not None
        s.leased_journal(lease).append([started("run-1")])
        wait_past(s, lease.expires_at)
    capsys.readouterr()
    assert 0 == main(["recovery", "--store", store, "--once"])
    assert "request 1 attempt 1: lost" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        ["--capacity", "0"],
        ["--max-attempts", "0"],
        ["--arm", "after_request"],
        ["--lease-s", "0"],
    ],
)
def test_runner_arguments_are_checked(store: str, argv: list[str]) -> None:
    """Impossible runner settings are bad input (exit 2) before any work is claimed."""
    assert 2 == main(["runner", "--store", store, *argv])


def _explode(decl: object, context: object) -> object:
    raise RuntimeError("factory bug")


BROKEN = {"broken": _explode}


def test_an_adapter_bug_sends_the_request_to_an_operator(
    store: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An adapter that raises instead of answering is neither re-queued for ever nor guessed: needs_operator."""
    plan = tmp_path / "broken.json"
    plan.write_text(
        json.dumps({"run_id": "b-1", "adapters": {"b": {"type": "broken"}}, "steps": [{"id": "s", "adapter": "b"}]})
    )
    assert 0 == submit(store, plan)
    argv = ["runner", "--store", store, "--adapters", "test_fleet_cli:BROKEN", "--exit-when-idle", "--poll-s", "0.01"]
    assert 0 == main(argv)
    with open_store(store) as s:
        assert ["needs_operator"] == [r.state for r in s.requests()]
        assert "RuntimeError: factory bug" in s.history()[-1].reason


def test_messages_name_an_attempt_by_its_number_within_the_request(
    store: str, plan: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Request 2's first attempt (store-wide attempt id 2) is "request 2 attempt 1" in recovery's output and in
    a refused write, as `requests` lists it; never "attempt 2"."""
    from effectlog.errors import StaleLease

    submit(store, plan)
    submit(store, write_plan(tmp_path / "two.json", "run-2", [("a", "idem")]), key="k2")
    with open_store(store) as s:
        lease = s.claim(2, "gone", 0.5)
        assert lease is not None
        assert (2, 1) == (lease.attempt_id, lease.attempt_no)
        s.leased_journal(lease).append([started("run-2")])
        wait_past(s, lease.expires_at)
        capsys.readouterr()
        assert 0 == main(["recovery", "--store", store, "--once"])
        out = capsys.readouterr().out
        assert out.startswith("request 2 attempt 1: lost"), out
        with pytest.raises(StaleLease) as refused:
            s.heartbeat(lease, 30.0)
    assert "request 2 attempt 1 is lost" in str(refused.value)
    assert 0 == main(["requests", "--store", store, "--request", "2"])
    assert [1, 2] == [int(line.split()[0]) for line in capsys.readouterr().out.splitlines()[3:5]]

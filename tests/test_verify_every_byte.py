"""`verify` covers every stored byte: index columns of events, every column of seals, cut sealed tails.

The attacker (or a careless hand) drops the append-only triggers and edits rows with
plain SQL. Every command runs as a real ``effectlog`` process. Issue 12 items 4 and 5.
"""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import journal_tamper
from effectlog.chain import Chain
from hardening_kit import KEY, effectlog, one_line, run_good_plan
from strategies import legal_histories

pytest_plugins = ["pg_fixture"]

RUN = "good-run"
KEYED = {"EFFECTLOG_JOURNAL_KEY": KEY.decode()}
TRIGGERS = (
    "events_append_only_update",
    "events_append_only_delete",
    "seals_append_only_update",
    "seals_append_only_delete",
)


def tamper(journal: Path, *sql: str) -> None:
    db = journal_tamper.connect(journal, isolation_level=None)
    try:
        for trigger in TRIGGERS:
            db.execute(f"DROP TRIGGER {trigger}")
        for statement in sql:
            before = db.total_changes  # (a view's rowcount is 0: journal_tamper's ``ev`` changes rows by trigger)
            db.execute(statement)
            assert db.total_changes > before, statement
    finally:
        db.close()


def verify_json(journal: Path, env: dict[str, str] | None = None) -> tuple[int, dict[str, object]]:
    done = effectlog("verify", "--journal", str(journal), "--json", cwd=journal.parent, env=env)
    return done.returncode, json.loads(done.stdout)


# seq 1 run.started, 2-4 charge requested/effected/confirmed, 5-7 email, 8 run.completed
COLUMN_EDITS = {
    "step_id": (f"UPDATE ev SET step_id = 's9' WHERE run_id = '{RUN}' AND step_id = 'charge'", 2, "step_id"),
    "phase": (f"UPDATE ev SET phase = 'step.forged' WHERE run_id = '{RUN}' AND seq = 3", 3, "phase"),
    "attempt": (f"UPDATE ev SET attempt = 2 WHERE run_id = '{RUN}' AND seq = 6", 6, "attempt"),
    "seq": (f"UPDATE ev SET seq = 108 WHERE run_id = '{RUN}' AND seq = 8", 108, "seq"),
    "run_id": (f"UPDATE ev SET run_id = 'a-{RUN}' WHERE run_id = '{RUN}' AND seq = 8", 8, "run_id"),
}


@pytest.mark.parametrize("keyed", [False, True], ids=["sha256", "hmac"])
@pytest.mark.parametrize("name", sorted(COLUMN_EDITS))
def test_an_edited_index_column_exits_7_naming_run_seq_and_column(tmp_path: Path, name: str, keyed: bool) -> None:
    """A column outside the hashed body (step_id, phase, attempt back the dedup constraint;
    run_id, seq the order) is compared with what the body says: exit 7, corrupt_event, naming
    the run, the row's seq and the column, with or without a key."""
    journal = tmp_path / "journal.db"
    run_good_plan(journal, Chain(KEY) if keyed else None)
    sql, seq, column = COLUMN_EDITS[name]
    tamper(journal, sql)

    status, report = verify_json(journal, KEYED if keyed else None)

    error = report["error"]
    assert isinstance(error, dict)
    expected_run = f"a-{RUN}" if name == "run_id" else RUN
    assert (7, "corrupt_event", expected_run, seq, column) == (
        status,
        error["code"],
        error["run_id"],
        error["seq"],
        error["column"],
    )


def test_the_human_message_names_the_column(tmp_path: Path) -> None:
    """Without --json: one line on stderr naming run, seq and the column and both values."""
    journal = tmp_path / "journal.db"
    run_good_plan(journal)
    tamper(journal, COLUMN_EDITS["step_id"][0])

    done = effectlog("verify", "--journal", str(journal), cwd=tmp_path)

    expected = (
        f"effectlog: corrupt_event: run '{RUN}', seq 2, step 'charge': "
        "stored column step_id disagrees with the event body: the row says 's9', the body 'charge'"
    )
    assert (7, "", expected) == (done.returncode, done.stdout, one_line(done.stderr))


SEAL_EDITS = {
    "seals.hash": f"UPDATE seals SET hash = zeroblob(32) WHERE run_id = '{RUN}'",
    "seals.body": f"UPDATE seals SET body = x'00' WHERE run_id = '{RUN}'",
    "seals.seq": f"UPDATE seals SET seq = 7 WHERE run_id = '{RUN}'",
}


@pytest.mark.parametrize("name", sorted(SEAL_EDITS))
def test_an_edited_seal_column_exits_7(tmp_path: Path, name: str) -> None:
    """Every column of a seals row is checked: its seq must be the run's last, its hash must
    link to the last event, its body must decode and agree with the full replay."""
    journal = tmp_path / "journal.db"
    run_good_plan(journal)
    tamper(journal, SEAL_EDITS[name])

    status, report = verify_json(journal)

    error = report["error"]
    assert isinstance(error, dict)
    expected_code = {"seals.hash": "chain_broken", "seals.body": "chain_broken", "seals.seq": "truncated"}[name]
    assert (7, expected_code, RUN) == (status, error["code"], error["run_id"])


def test_a_seal_that_disagrees_with_the_replay_exits_7(tmp_path: Path) -> None:
    """A seal body rewritten and re-linked (no key: anyone can re-link) still has to say what the
    events say: a seal claiming another state is corrupt_event on seals.body."""
    import hashlib
    import zlib

    journal = tmp_path / "journal.db"
    run_good_plan(journal)
    db = journal_tamper.connect(journal)
    (body,) = db.execute("SELECT body FROM seals").fetchone()
    (head,) = db.execute(f"SELECT hash FROM ev WHERE run_id = '{RUN}' ORDER BY seq DESC LIMIT 1").fetchone()
    db.close()
    forged = zlib.compress(zlib.decompress(body).replace(b'"completed"', b'"cancelled"'))
    link = hashlib.sha256(bytes(head) + forged).hexdigest()
    tamper(journal, f"UPDATE seals SET body = x'{forged.hex()}', hash = x'{link}'")

    status, report = verify_json(journal)

    error = report["error"]
    assert isinstance(error, dict)
    assert (7, "corrupt_event", "seals.body") == (status, error["code"], error["column"])


@pytest.mark.parametrize("keyed", [False, True], ids=["sha256", "hmac"])
def test_a_cut_tail_of_a_sealed_run_is_truncated(tmp_path: Path, keyed: bool) -> None:
    """The last three events of a closed run deleted, its seal left in place: the seal names
    seq 8, the journal ends at 5, so verify exits 7 ``truncated`` naming the run. With a checkpoint
    segment on every batch (``EFFECTLOG_CHECKPOINT_EVERY=1``, as the soak runs) the segment written at
    seq 7 is the first piece of evidence read that outlives the cut, and verify names it instead."""
    journal = tmp_path / "journal.db"
    run_good_plan(journal, Chain(KEY) if keyed else None)
    tamper(journal, f"DELETE FROM ev WHERE run_id = '{RUN}' AND seq > 5")

    done = effectlog("verify", "--journal", str(journal), cwd=tmp_path, env=KEYED if keyed else None)

    assert (7, "") == (done.returncode, done.stdout)
    either = rf"effectlog: truncated: run '{RUN}', seq (5: the run's seal says|7: the run's checkpoint was written)"
    assert re.match(either, one_line(done.stderr)), done.stderr


def test_a_sealed_run_with_every_event_deleted_is_truncated(tmp_path: Path) -> None:
    """All of a closed run's events deleted: the seal is left without a run; verify of the
    journal, and of that run id, exits 7 ``truncated`` (not "no such run")."""
    journal = tmp_path / "journal.db"
    run_good_plan(journal)
    tamper(journal, f"DELETE FROM ev WHERE run_id = '{RUN}'")

    whole = effectlog("verify", "--journal", str(journal), cwd=tmp_path)
    one = effectlog("verify", "--journal", str(journal), "--run-id", RUN, cwd=tmp_path)

    assert (7, 7) == (whole.returncode, one.returncode)
    assert f"effectlog: truncated: run '{RUN}'" in one_line(whole.stderr)


CONTROL_PLAN = {
    "run_id": "pay",
    "adapters": {"ledger": {"type": "effects.control", "version": "1", "idempotent": False}},
    "steps": [{"id": f"send-{i}", "adapter": "ledger", "args": {"n": i}} for i in range(3)],
}


def test_run_refuses_a_sealed_run_whose_tail_was_cut_and_sends_nothing_again(tmp_path: Path) -> None:
    """The reproduction: three non-idempotent sends completed and sealed; the tail is cut back to
    after the first send. Re-running the plan used to send the two cut ones again. Now ``run``
    exits 7 ``truncated``, the effect store still holds 3 effects and the journal is unchanged."""
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(CONTROL_PLAN))
    journal, effects = tmp_path / "journal.db", tmp_path / "effects.db"
    args = ("run", str(plan), "--journal", str(journal), "--effects", str(effects))
    assert 0 == effectlog(*args, cwd=tmp_path).returncode
    tamper(journal, "DELETE FROM ev WHERE run_id = 'pay' AND seq > 4")
    before = journal_tamper.connect(journal).execute("SELECT COUNT(*) FROM ev").fetchone()[0]

    again = effectlog(*args, cwd=tmp_path)

    after = journal_tamper.connect(journal).execute("SELECT COUNT(*) FROM ev").fetchone()[0]
    sent = sqlite3.connect(effects).execute("SELECT COUNT(*) FROM effects").fetchone()[0]
    assert (7, 3, before) == (again.returncode, sent, after)
    assert one_line(again.stderr).startswith("effectlog: truncated: run 'pay', seq 4: the run's seal says")


@pytest.mark.postgres
@pytest.mark.parametrize("name", ["step_id", "phase", "attempt"])
def test_an_edited_index_column_on_postgres_exits_7(pg_url: str, tmp_path: Path, name: str) -> None:
    """The same check on the PostgreSQL journal (one replay path for both backends): the
    trigger dropped by the database owner, one index column edited, verify exits 7 naming it."""
    import psycopg

    from effectlog.journal import open_journal
    from effectlog.plan import load_plan
    from effectlog.runtime import Runtime
    from hardening_kit import GOOD_PLAN

    with Runtime(open_journal(pg_url)) as runtime:
        assert "completed" == runtime.run(load_plan(GOOD_PLAN)).state
    sql, seq, column = COLUMN_EDITS[name]
    with psycopg.connect(pg_url, autocommit=True) as db:
        db.execute("SET search_path TO effectlog")
        db.execute("DROP TRIGGER events_append_only ON effectlog.events")
        assert 1 <= db.execute(sql.replace("UPDATE ev ", "UPDATE events ")).rowcount  # (PostgreSQL's own table)

    done = effectlog("verify", "--journal", pg_url, "--json", cwd=tmp_path)

    error = json.loads(done.stdout)["error"]
    assert (7, "corrupt_event", RUN, seq, column) == (
        done.returncode,
        error["code"],
        error["run_id"],
        error["seq"],
        error["column"],
    )


@pytest.mark.parametrize(
    ("column", "value"), [("step_id", "s9"), ("phase", "step.forged"), ("attempt", 2), ("run_id", "x"), ("seq", 9)]
)
def test_replay_records_compares_every_column_a_journal_reads_back(column: str, value: object) -> None:
    """The pure replay: a record whose column differs from its (correctly chained) body is
    CorruptEvent naming that column; the same records with the true columns replay."""
    import msgspec

    from effectlog import events as ev
    from effectlog.errors import CorruptEvent
    from effectlog.fold import Record, replay_records
    from effectlog.testing import sample_run

    chain, head, records = Chain(), bytes(32), []
    for event in sample_run("run-1"):
        body = ev.encode(event)
        head = chain.link(head, body)
        records.append(Record("run-1", event.seq, body, head, event.step_key, event.phase, event.attempt_no))
    assert len(records) == replay_records(records, chain, run_id="run-1").seq
    records[2] = msgspec.structs.replace(records[2], **{column: value})

    with pytest.raises(CorruptEvent) as caught:
        replay_records(records, chain, run_id="run-1")

    assert (column, "run-1") == (caught.value.fields["column"], caught.value.run_id)


def test_an_operator_decision_on_a_cut_sealed_run_exits_7_and_writes_nothing(tmp_path: Path) -> None:
    """A closed run cut back to where a step waited for approval looks held again; approving it
    would append to a history that was cut. ``approve`` exits 7 ``truncated`` and the journal
    keeps its rows."""
    from hardening_kit import ROOT

    run = ("run", str(ROOT / "examples" / "approval.json"), "--journal", "j.db", "--effects", "e.db")
    decide = ("--journal", "j.db", "--run-id", "refund-042", "--step", "refund", "--by", "alice")
    assert 4 == effectlog(*run, cwd=tmp_path).returncode
    assert 0 == effectlog("approve", *decide, cwd=tmp_path).returncode
    assert 0 == effectlog(*run, cwd=tmp_path).returncode
    journal = tmp_path / "j.db"
    rows = journal_tamper.connect(journal)
    held_at = rows.execute("SELECT seq FROM ev WHERE phase LIKE 'run.suspended%'").fetchone()[0]
    tamper(journal, f"DELETE FROM ev WHERE run_id = 'refund-042' AND seq > {held_at}")
    before = journal_tamper.connect(journal).execute("SELECT COUNT(*) FROM ev").fetchone()[0]

    again = effectlog("approve", *decide, cwd=tmp_path)

    after = journal_tamper.connect(journal).execute("SELECT COUNT(*) FROM ev").fetchone()[0]
    assert (7, before) == (again.returncode, after)
    assert one_line(again.stderr).startswith("effectlog: truncated: run 'refund-042'")


@settings(max_examples=60, deadline=None)
@given(history=legal_histories(max_events=30), data=st.data())
def test_the_fast_column_check_agrees_with_the_events_own_columns(history: list[Any], data: st.DataObject) -> None:
    """Over legal histories of every event type (repeatable ones, resends, run events):
    records carrying the columns a journal writes replay, and one column changed on any
    record is CorruptEvent naming that column."""
    import msgspec

    from effectlog import events as ev
    from effectlog.errors import CorruptEvent
    from effectlog.fold import Record, replay_records

    chain, head, records = Chain(), bytes(32), []
    for event in history:
        body = ev.encode(event)
        head = chain.link(head, body)
        records.append(Record(event.run_id, event.seq, body, head, event.step_key, event.phase, event.attempt_no))
    run_id = history[0].run_id
    assert len(history) == replay_records(records, chain, run_id=run_id).seq
    at = data.draw(st.integers(0, len(records) - 1))
    column, value = data.draw(
        st.sampled_from([("step_id", records[at].step_id + "x"), ("phase", records[at].phase + "x"),
                         ("attempt", (records[at].attempt or 0) + 1)])
    )  # fmt: skip
    records[at] = msgspec.structs.replace(records[at], **{column: value})

    with pytest.raises(CorruptEvent) as caught:
        replay_records(records, chain, run_id=run_id)

    assert (column, records[at].seq) == (caught.value.fields["column"], caught.value.seq)


@pytest.mark.parametrize("argv", [(), ("--run-id", RUN)], ids=["list", "one run"])
def test_status_of_a_cut_sealed_run_is_truncated_not_a_state(tmp_path: Path, argv: tuple[str, ...]) -> None:
    """status (the list, from summaries, and one run, from the full replay) never reports a
    closed run whose tail was cut as the open run that is left: exit 7, truncated."""
    journal = tmp_path / "journal.db"
    run_good_plan(journal)
    tamper(journal, f"DELETE FROM ev WHERE run_id = '{RUN}' AND seq > 5")

    done = effectlog("status", "--journal", str(journal), *argv, cwd=tmp_path)

    assert (7, "") == (done.returncode, done.stdout)
    assert one_line(done.stderr).startswith(f"effectlog: truncated: run '{RUN}'")

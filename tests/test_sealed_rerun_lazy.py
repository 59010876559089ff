"""A sealed run's re-run does not grow with the run: the seal's rows stay compressed until read.

The outcome of a re-run of a closed run carries ``StepRows``, built from the seal bytes it
holds when first read; it equals, field by field, the outcome eagerly built from the full
replay; ``run --json`` prints exactly the bytes the eager outcome gives; the seal's rows are
covered by its hash before the re-run answers; and a seal written before the rows were kept
apart (one zlib stream) is read as before.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import sqlite3
import subprocess
import sys
import zlib
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import journal_tamper
from effectlog.chain import Chain
from effectlog.cli.run_cmds import run_json
from effectlog.errors import ChainBroken, CorruptEvent
from effectlog.fold import replay
from effectlog.journal import load_run
from effectlog.outcome import RunOutcome, StepRows, StepSummary, enc_hook, outcome_of
from effectlog.plan import AdapterDecl, Plan, StepDecl
from effectlog.runtime import Runtime
from effectlog.seal import RunSeal, SealedStep, check_seal, closed_summary, seal_row, sealed_view, state_from_seal
from effectlog.testing import sample_run

RUN = "lazy"


def noop_plan(steps: int, *, approval_last: bool = False, run_id: str = RUN) -> Plan:
    return Plan(
        run_id=run_id,
        adapters={"noop": AdapterDecl(type="noop", idempotent=True)},
        steps=tuple(
            StepDecl(id=f"s{i}", adapter="noop", approval="required" if approval_last and i == steps - 1 else None)
            for i in range(steps)
        ),
    )


def eager_rows(state: object) -> list[StepSummary]:
    """The rows as ``outcome_of`` builds them from a state with its steps (the eager construction)."""
    return list(outcome_of(state).steps)  # type: ignore[arg-type]


def v1_body(state: object) -> bytes:
    """A seal as written before the rows were kept apart: one zlib stream, ``steps`` the list of rows."""
    seal = seal_row(state)  # type: ignore[arg-type]
    head = msgspec.json.decode(zlib.decompressobj().decompress(seal[2]))
    rows = [SealedStep(s.step_id, s.state, s.attempt) for s in state.ordered_steps()]  # type: ignore[attr-defined]
    whole = msgspec.json.decode(msgspec.json.encode({**head, "steps": rows}), type=RunSeal)
    return zlib.compress(msgspec.json.Encoder(order="sorted").encode(whole), 6)


def replace_seal_body(path: Path, body: bytes, *, relink: bool) -> None:
    """An attacker edits the seal body (dropping the append-only trigger); with ``relink`` also its hash."""
    db = journal_tamper.connect(path)
    with db:
        db.execute("DROP TRIGGER seals_append_only_update")
        (head,) = db.execute("SELECT hash FROM ev ORDER BY seq DESC LIMIT 1").fetchone()
        if relink:
            db.execute("UPDATE seals SET body = ?, hash = ?", (body, hashlib.sha256(bytes(head) + body).digest()))
        else:
            db.execute("UPDATE seals SET body = ?", (body,))
    db.close()


def stored_body(path: Path) -> bytes:
    db = sqlite3.connect(path)
    try:
        (body,) = db.execute("SELECT body FROM seals").fetchone()
    finally:
        db.close()
    return bytes(body)


# -- the outcome -------------------------------------------------------------------------------


@pytest.mark.parametrize("steps", [1, 2, 17, 300])
def test_a_sealed_reruns_lazy_outcome_equals_the_eager_one_field_for_field(tmp_path: Path, steps: int) -> None:
    """The re-run's outcome holds unbuilt ``StepRows``; every field equals the outcome built eagerly from
    the full replay (``outcome_of(load_run(...))``), and the rows are built only by reading them."""
    plan = noop_plan(steps)
    with Runtime(tmp_path / "j.db") as rt:
        rt.run(plan)
        eager = outcome_of(load_run(rt.journal, RUN))
        lazy = rt.run(plan)
    assert isinstance(lazy.steps, StepRows)
    assert (False, steps) == (lazy.steps.loaded, len(lazy.steps))  # len from the seal's count: nothing built
    assert isinstance(eager.steps, list)
    assert {f: getattr(eager, f) for f in RunOutcome.__struct_fields__} == {
        f: getattr(lazy, f) for f in RunOutcome.__struct_fields__
    }
    assert lazy.steps.loaded
    assert eager == lazy
    assert lazy == eager


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 8), st.data())
def test_a_seals_summary_equals_the_sealed_view_and_the_eager_rows(steps: int, data: st.DataObject) -> None:
    """For every prefix of a legal history: ``closed_summary`` gives the sealed view's run-level fields and,
    when read, the rows ``outcome_of`` builds from the full state; ``state_from_seal`` the sealed view."""
    history = sample_run("r", steps)
    state = replay(history[: data.draw(st.integers(1, len(history)))])
    _, _, body = seal_row(state)
    summary, rows = closed_summary(body, state.head)
    assert not rows.loaded
    assert msgspec.structs.replace(sealed_view(state), steps=summary.steps) == summary
    assert eager_rows(state) == rows
    assert sealed_view(state) == state_from_seal(body, state.head)


def test_the_rows_are_read_after_the_runtime_is_closed_and_the_journal_is_gone(tmp_path: Path) -> None:
    """Laziness never goes back to the journal: the rows are built from the bytes the outcome holds, so a
    caller reading ``outcome.steps`` after ``with Runtime(...)`` has exited (the journal's files even
    deleted) gets every row."""
    plan = noop_plan(40)
    path = tmp_path / "j.db"
    with Runtime(path) as rt:
        rt.run(plan)
        expected = eager_rows(load_run(rt.journal, RUN))
    with Runtime(path) as rt:
        outcome = rt.run(plan)
    assert isinstance(outcome.steps, StepRows)
    assert not outcome.steps.loaded
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    assert expected == list(outcome.steps)
    assert ("s39", "confirmed", 1) == (outcome.steps[-1].id, outcome.steps[-1].state, outcome.steps[-1].attempt)


def test_step_rows_behave_as_a_read_only_list_of_the_same_rows() -> None:
    """``StepRows`` is indexable, sliceable, iterable, sized, compares equal to the list of its rows
    (and unequal to other rows), prints, pickles and copies as that list, and cannot be appended to."""
    rows = [StepSummary(id=f"s{i}", state="confirmed", attempt=1) for i in range(5)]
    lazy = StepRows(lambda: list(rows), len(rows))
    assert 5 == len(lazy)
    assert not lazy.loaded
    assert (rows[2], rows[1:3], rows[::-1]) == (lazy[2], lazy[1:3], lazy[::-1])
    assert (rows, list(reversed(rows))) == (list(lazy), list(reversed(lazy)))
    assert (True, False) == (rows[3] in lazy, StepSummary(id="x", state="confirmed", attempt=1) in lazy)
    assert (3, 1) == (lazy.index(rows[3]), lazy.count(rows[3]))
    assert (True, True, False) == (lazy == rows, rows == lazy, lazy != rows)
    assert (True, True) == (lazy != rows[:4], lazy != tuple(rows))
    assert lazy == StepRows(lambda: list(rows))
    assert repr(rows) == repr(lazy)
    assert rows == pickle.loads(pickle.dumps(lazy))
    with pytest.raises(TypeError):
        hash(lazy)
    with pytest.raises(AttributeError):
        lazy.append(rows[0])  # type: ignore[attr-defined]


@pytest.mark.parametrize("codec", ["json", "msgpack", "to_builtins"])
def test_an_outcome_with_step_rows_encodes_as_the_same_outcome_with_a_list(codec: str) -> None:
    """With ``outcome.enc_hook`` an outcome holding ``StepRows`` encodes byte for byte as the one holding
    the list; without it msgspec refuses it loudly rather than writing something else."""
    rows = [StepSummary(id=f"s{i}", state="confirmed", attempt=i) for i in range(4)]
    fields = {"run_id": "r", "state": "completed", "exit_status": 0, "message": "run r completed"}
    lazy, eager = RunOutcome(**fields, steps=StepRows(lambda: list(rows))), RunOutcome(**fields, steps=rows)
    encode = {
        "json": msgspec.json.encode,
        "msgpack": msgspec.msgpack.encode,
        "to_builtins": msgspec.to_builtins,
    }[codec]
    assert encode(eager) == encode(lazy, enc_hook=enc_hook)
    with pytest.raises(TypeError):
        encode(RunOutcome(**fields, steps=StepRows(lambda: list(rows))))


def test_rows_that_do_not_decode_raise_corrupt_event_when_read() -> None:
    """A seal whose rows stream was replaced (and the seal re-linked: possible without a key) yields run-level
    fields at once and ``CorruptEvent`` on seals.body when the rows are read; nothing is cached, so every
    read raises; a row count other than the seal's count is corrupt too."""
    state = replay(sample_run("r", 3))
    _, _, body = seal_row(state)
    first = zlib.decompressobj()
    first.decompress(body)
    header = body[: len(body) - len(first.unused_data)]
    for rows_stream in (zlib.compress(b"not json"), zlib.compress(b'[["s0","confirmed",1]]'), b"\x00junk"):
        _, rows = closed_summary(header + rows_stream, state.head)
        for _ in range(2):
            with pytest.raises(CorruptEvent) as caught:
                list(rows)
            error = caught.value
            assert ("r", state.seq, "seals.body") == (error.run_id, error.seq, error.fields["column"])


# -- the seal's format ---------------------------------------------------------------------------


def test_a_seal_written_before_rows_were_kept_apart_is_read_as_before(tmp_path: Path) -> None:
    """A one-stream seal (``steps`` the list of rows) still gives the sealed view, the same re-run outcome
    (its rows unbuilt until read) and passes ``check_seal``."""
    plan = noop_plan(5)
    path = tmp_path / "j.db"
    with Runtime(path) as rt:
        rt.run(plan)
        state = load_run(rt.journal, RUN)
    old = v1_body(state)
    replace_seal_body(path, old, relink=True)
    assert sealed_view(state) == state_from_seal(old, state.head)
    chain = Chain()
    check_seal((RUN, state.seq, old, chain.link(state.head, old)), state, chain)
    with Runtime(path) as rt:
        outcome = rt.run(plan)
    assert isinstance(outcome.steps, StepRows)
    assert not outcome.steps.loaded
    assert outcome_of(state) == outcome


@pytest.mark.parametrize("steps", [1, 3])
def test_an_older_reader_refuses_a_two_stream_seal_instead_of_misreading_it(steps: int) -> None:
    """An effectlog from before reads ``RunSeal`` from ``zlib.decompress(body)`` (which stops at the first
    stream): ``steps`` is a number there, so it refuses the seal (and replays in full) rather than
    report a run without its steps."""
    _, _, body = seal_row(replay(sample_run("r", steps)))
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(zlib.decompress(body), type=RunSeal)


@pytest.mark.parametrize("edit", ["rows one fewer", "junk after the rows", "rows stream cut"])
def test_verify_refuses_a_forged_two_stream_seal(edit: str) -> None:
    """``check_seal`` (verify) decodes both streams: rows fewer than the count, bytes after the rows
    stream, or a rows stream cut short are corrupt_event on seals.body even when re-linked."""
    state = replay(sample_run("r", 3))
    _, seq, body = seal_row(state)
    first = zlib.decompressobj()
    first.decompress(body)
    header, rows_stream = body[: len(body) - len(first.unused_data)], first.unused_data
    forged = {
        "rows one fewer": header + zlib.compress(b'[["s0","confirmed",1],["s1","confirmed",1]]'),
        "junk after the rows": body + b"x",
        "rows stream cut": header + rows_stream[:-3],
    }[edit]
    chain = Chain()
    with pytest.raises(CorruptEvent) as caught:
        check_seal(("r", seq, forged, chain.link(state.head, forged)), state, chain)
    assert "seals.body" == caught.value.fields["column"]


def test_an_edited_rows_stream_refuses_the_rerun_before_it_answers(tmp_path: Path) -> None:
    """The seal's hash covers its rows stream too: a byte of the rows changed (not re-linked) and the
    re-run raises ChainBroken at once, as for any other edit of the seal, and writes nothing."""
    plan = noop_plan(4)
    path = tmp_path / "j.db"
    with Runtime(path) as rt:
        rt.run(plan)
    body = bytearray(stored_body(path))
    body[-5] ^= 0xFF  # inside the rows stream (the header stream comes first)
    replace_seal_body(path, bytes(body), relink=False)
    with Runtime(path) as rt:
        before = rt.journal.head(RUN)
        with pytest.raises(ChainBroken):
            rt.run(plan)
        assert before == rt.journal.head(RUN)


# -- run --json ------------------------------------------------------------------------------------


def cli_run_json(path: Path, plan_file: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "effectlog", "run", str(plan_file), "--journal", str(path), "--json", "--quiet"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={k: v for k, v in os.environ.items() if k != "EFFECTLOG_JOURNAL_KEY"},
    )


def eager_json(outcome: RunOutcome, journal: str) -> str:
    """``run --json`` as it printed before: the outcome with a list of rows, a hookless sorted encoder."""
    assert isinstance(outcome.steps, list)
    data = run_json(outcome, journal)
    return msgspec.json.format(msgspec.json.Encoder(order="sorted").encode(data), indent=2).decode() + "\n"


def write_plan(path: Path, plan: Plan) -> Path:
    path.write_text(json.dumps(msgspec.to_builtins(plan)))
    return path


def test_run_json_of_a_sealed_rerun_is_byte_identical_to_the_eager_outcome(tmp_path: Path) -> None:
    """``run --json`` of a closed run (its rows lazy in the process) prints exactly the bytes of the
    outcome built eagerly from the full replay."""
    plan = noop_plan(25)
    plan_file = write_plan(tmp_path / "plan.json", plan)
    journal = tmp_path / "j.db"
    first = cli_run_json(journal, plan_file)
    assert (0, "") == (first.returncode, first.stderr)
    with Runtime(journal) as rt:
        eager = outcome_of(load_run(rt.journal, RUN))
        assert isinstance(rt.run(plan).steps, StepRows)  # what the CLI's re-run holds
    again = cli_run_json(journal, plan_file)
    assert (0, "") == (again.returncode, again.stderr)
    assert eager_json(eager, str(journal)) == again.stdout


def test_run_json_of_an_unsealed_run_is_byte_identical_to_the_eager_outcome(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run that suspends for approval is open (no seal, its rows a list): ``run --json`` prints the bytes
    of the same outcome from an in-process run of the same plan, encoded as before. (Each uses a journal
    named ``j.db`` in its own directory: the outcome's message names the journal.)"""
    plan = noop_plan(3, approval_last=True)
    plan_file = write_plan(tmp_path / "plan.json", plan)
    (tmp_path / "cli").mkdir()
    (tmp_path / "api").mkdir()
    monkeypatch.chdir(tmp_path / "cli")
    done = cli_run_json(Path("j.db"), plan_file)
    assert 4 == done.returncode
    monkeypatch.chdir(tmp_path / "api")
    with Runtime("j.db") as rt:
        outcome = rt.run(plan)
    assert "suspended" == outcome.state
    assert eager_json(outcome, "j.db") == done.stdout


def test_run_table_of_a_sealed_rerun_lists_every_row(tmp_path: Path) -> None:
    """The text output of a re-run reads the lazy rows after the runtime has closed: every step is listed."""
    plan = noop_plan(12)
    plan_file = write_plan(tmp_path / "plan.json", plan)
    argv = [sys.executable, "-m", "effectlog", "run", str(plan_file), "--journal", str(tmp_path / "j.db"), "--quiet"]
    subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True)
    again = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert 0 == again.returncode
    lines = again.stdout.splitlines()
    listed = [line.split()[0] for line in lines if line.startswith("s") and not line.startswith("step")]
    assert [f"s{i}" for i in range(12)] == listed


@pytest.mark.parametrize("json_flag", [False, True])
def test_run_of_a_seal_relinked_over_rows_that_do_not_decode_exits_7_in_one_line(
    tmp_path: Path, json_flag: bool
) -> None:
    """Without a key anyone can re-link a seal: rows that do not decode surface when ``run`` prints them,
    as ``corrupt_event`` (exit 7) in one line naming the run, no traceback, nothing written."""
    plan = noop_plan(6)
    plan_file = write_plan(tmp_path / "plan.json", plan)
    path = tmp_path / "j.db"
    with Runtime(path) as rt:
        rt.run(plan)
    body = stored_body(path)
    first = zlib.decompressobj()
    first.decompress(body)
    replace_seal_body(path, body[: len(body) - len(first.unused_data)] + zlib.compress(b"[1,2]"), relink=True)
    db = journal_tamper.connect(path)
    before = db.execute("SELECT COUNT(*), MAX(seq) FROM ev").fetchone()
    db.close()
    argv = [sys.executable, "-m", "effectlog", "run", str(plan_file), "--journal", str(path), "--quiet"]
    done = subprocess.run(argv + (["--json"] if json_flag else []), capture_output=True, text=True, timeout=120)
    assert "Traceback" not in done.stderr
    assert (7, 1, "") == (done.returncode, len(done.stderr.splitlines()), done.stdout)
    assert done.stderr.startswith(f"effectlog: corrupt_event: run '{RUN}', seq 20: the run's seal's step rows do not")
    db = journal_tamper.connect(path)
    assert before == db.execute("SELECT COUNT(*), MAX(seq) FROM ev").fetchone()
    db.close()

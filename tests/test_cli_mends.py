"""Small edges of the command line an operator meets when tired (round 2, session 14).

- ``effects --run-id R`` for a run the store holds no effect of, while it holds other runs' effects,
  says so on stderr (an empty table is not "nothing happened"); the same id in another Unicode
  spelling is refused, exit 2.
- ``approve --expect-digest D`` with a D that is no digest at all is bad input (exit 2), not a
  mismatch with the held call (exit 5), and writes nothing.
- ``--json`` output is the result only: a command that ends on bad input writes nothing to stdout
  and one line to stderr (``verify --json`` prints its report on an integrity failure, exit 3).

Every command runs as a real ``effectlog`` process on real SQLite files.
"""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

from effectlog.adapters.effects import EffectStore
from effectlog.adapters.protocol import Request
from effectlog.errors import ExitStatus
from test_cli_run import EXAMPLES, Cli, one_line_error


def _paid(tmp_path: Path) -> Cli:
    cli = Cli(tmp_path)
    done = cli.run(EXAMPLES / "payment.json")
    assert 0 == done.returncode, done.stderr
    return cli


def test_effects_of_a_run_the_store_has_none_of_says_which_runs_it_holds(tmp_path: Path) -> None:
    """An id the store has no effect of: the (empty) ledger on stdout, exit 0 (a run may have no
    effect yet), and one stderr line saying the store holds effects of other runs."""
    cli = _paid(tmp_path)

    done = cli("effects", "--effects", cli.effects, "--run-id", "payment-01", "--json")

    assert (0, []) == (done.returncode, json.loads(done.stdout))
    line = one_line_error(done)
    assert (True, True) == ("no effects of run 'payment-01'" in line, "1 other run(s)" in line), line


def test_effects_of_a_run_it_holds_prints_them_and_nothing_on_stderr(tmp_path: Path) -> None:
    """The run's own id: its rows, and stderr stays empty (the note is only for an empty answer)."""
    cli = _paid(tmp_path)

    done = cli("effects", "--effects", cli.effects, "--run-id", "payment-001", "--json")

    rows = json.loads(done.stdout)
    assert (0, "") == (done.returncode, done.stderr)
    assert (True, {"payment-001"}) == (bool(rows), {r["run_id"] for r in rows})


def test_effects_of_a_run_id_in_another_unicode_spelling_is_refused(tmp_path: Path) -> None:
    """A store whose run is ``café-1`` composed (a durable or session run's id; plans are ASCII), asked
    for ``café-1`` decomposed: exit 2, naming the recorded spelling; the store's bytes are unchanged."""
    cli = Cli(tmp_path)
    composed = unicodedata.normalize("NFC", "café-1")
    store = EffectStore(cli.effects)
    try:
        store.apply_idempotent(Request(run_id=composed, step_id="pay", attempt=1, idempotency_key="k1", args={}))
    finally:
        store.close()
    before = Path(cli.effects).read_bytes()

    decomposed = unicodedata.normalize("NFD", composed)
    done = cli("effects", "--effects", cli.effects, "--run-id", decomposed)

    assert (int(ExitStatus.BAD_INPUT), "") == (done.returncode, done.stdout)
    line = one_line_error(done)
    assert (True, True) == (line.startswith("effectlog: bad_input: --run-id"), ascii(composed) in line), line
    assert before == Path(cli.effects).read_bytes()


def test_verify_json_on_a_missing_run_writes_nothing_to_stdout_and_one_line_to_stderr(tmp_path: Path) -> None:
    """Bad input under ``--json``: stdout is empty (a pipe into a JSON reader sees no half answer), the
    reason is one line on stderr, exit 2."""
    cli = _paid(tmp_path)

    done = cli("verify", "--journal", cli.journal, "--run-id", "nope", "--json")

    assert (int(ExitStatus.BAD_INPUT), "") == (done.returncode, done.stdout)
    assert "no run 'nope'" in one_line_error(done)


def test_reconcile_with_an_empty_evidence_names_it_instead_of_asking_for_what_was_given(tmp_path: Path) -> None:
    """``--outcome applied --evidence "" --operator ann`` (an unset shell variable) was told to "give
    --outcome, --evidence and --operator", all three given: the line names the empty one; exit 2."""
    cli = _paid(tmp_path)
    argv = ["reconcile", "--journal", cli.journal, "--run-id", "payment-001", "--step", "charge"]

    done = cli(*argv, "--outcome", "applied", "--evidence", "", "--operator", "ann")

    assert (int(ExitStatus.BAD_INPUT), "") == (done.returncode, done.stdout)
    assert "--evidence given empty" in one_line_error(done)

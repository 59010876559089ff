"""Tamper evidence: what the hash chain catches with a key, and what the head kept outside adds.

The attacker here has the journal file but not the key. They copy the database, drop the
append-only triggers in the copy (nothing stops them: the triggers protect against
mistakes, not against someone who owns the file), rewrite rows, recompute the chain with
plain SHA-256 from the first changed row on, and put the copy in place of the original.
Every command runs as a real ``effectlog`` process.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import pytest

import journal_tamper
from effectlog.chain import GENESIS, Chain
from hardening_kit import KEY, effectlog, one_line, run_good_plan

RUN = "good-run"
KEYED = {"EFFECTLOG_JOURNAL_KEY": KEY.decode()}


def rewrite(
    journal: Path,
    edit: Callable[[int, bytes], bytes | None],
    *,
    claim_unkeyed: bool = False,
    seal: Literal["forge", "keep"] = "forge",
) -> int:
    """The attacker: rewrite (or, when ``edit`` returns None, drop) events of RUN in a copy of
    the database, re-link the chain with plain SHA-256 from the first change on (from the
    very first event when also claiming the journal was never keyed), and swap the copy in.
    The run is closed, so it has a seal: with ``seal="forge"`` the attacker re-links it to the
    new last event, or deletes it when the tail is gone; ``"keep"`` leaves it as it was.
    Returns the seq of the first changed event."""
    copy = journal.with_name("attacker-copy.db")
    shutil.copyfile(journal, copy)
    db = journal_tamper.connect(copy, isolation_level=None)
    try:
        for trigger in ("events_append_only_update", "events_append_only_delete", "seals_append_only_update"):
            db.execute(f"DROP TRIGGER {trigger}")
        db.execute("DROP TRIGGER seals_append_only_delete")
        rows = db.execute("SELECT seq, body, hash FROM ev WHERE run_id = ? ORDER BY seq", (RUN,)).fetchall()
        first_changed = 0
        prev = GENESIS
        for seq, body, stored in rows:
            new = edit(seq, bytes(body))
            if new is None:
                db.execute("DELETE FROM ev WHERE run_id = ? AND seq = ?", (RUN, seq))
                first_changed = first_changed or seq
                continue
            if new != bytes(body):
                first_changed = first_changed or seq
            relink = first_changed or claim_unkeyed
            link = hashlib.sha256(prev + new).digest() if relink else bytes(stored)
            db.execute("UPDATE ev SET body = ?, hash = ? WHERE run_id = ? AND seq = ?", (new, link, RUN, seq))
            prev = link
        if seal == "forge" and (first_changed or claim_unkeyed):
            last = db.execute("SELECT MAX(seq) FROM ev WHERE run_id = ?", (RUN,)).fetchone()[0]
            sealed = db.execute("SELECT seq, body FROM seals WHERE run_id = ?", (RUN,)).fetchone()
            if sealed is not None and sealed[0] == last:
                relinked = hashlib.sha256(prev + sealed[1]).digest()
                db.execute("UPDATE seals SET hash = ? WHERE run_id = ?", (relinked, RUN))
            elif sealed is not None:
                db.execute("DELETE FROM seals WHERE run_id = ?", (RUN,))
        if claim_unkeyed:
            db.execute("UPDATE meta SET value = 'sha256' WHERE key = 'chain'")
    finally:
        db.close()
    copy.replace(journal)
    assert first_changed, "the attacker changed nothing"
    return first_changed


def forge_receipt(seq: int, body: bytes) -> bytes:
    """Rewrite the receipt of the first step.effected: its idempotency key, as if another effect was meant."""
    return body.replace(b'"key":"el1-', b'"key":"el9-') if seq == 3 else body


def drop_tail(last_kept: int) -> Callable[[int, bytes], bytes | None]:
    return lambda seq, body: None if seq > last_kept else body


@pytest.fixture
def journal(tmp_path: Path) -> Path:
    return tmp_path / "journal.db"


def verify(journal: Path, *extra: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    done = effectlog("verify", "--journal", str(journal), *extra, cwd=journal.parent, env=env)
    return done.returncode, done.stdout, done.stderr


def head(journal: Path, env: dict[str, str] | None = None) -> tuple[str, int, str]:
    done = effectlog("head", "--journal", str(journal), "--run-id", RUN, cwd=journal.parent, env=env)
    assert (0, "") == (done.returncode, done.stderr)
    run_id, seq, digest = done.stdout.split()
    return run_id, int(seq), digest


def test_with_a_key_a_plain_sha256_rewrite_is_detected_at_the_first_rewritten_event(journal: Path) -> None:
    """Keyed journal (EFFECTLOG_JOURNAL_KEY): the attacker rewrites seq 3 and re-links every
    later event with plain SHA-256. ``verify`` with the key exits 7, chain_broken, naming the
    run and seq 3, and prints no "ok"."""
    run_good_plan(journal, Chain(KEY))
    first = rewrite(journal, forge_receipt)

    status, out, err = verify(journal, env=KEYED)

    assert (7, "", f"effectlog: chain_broken: run '{RUN}', seq {first}: ") == (status, out, one_line(err)[:48])


def test_with_a_key_file_the_same_rewrite_is_detected(journal: Path, tmp_path: Path) -> None:
    """The key may come from ``--key-file`` instead of the environment: same detection, exit 7."""
    run_good_plan(journal, Chain(KEY))
    key_file = tmp_path / "journal.key"
    key_file.write_bytes(KEY + b"\n")
    rewrite(journal, forge_receipt)

    status, _, err = verify(journal, "--key-file", str(key_file))

    assert (7, "chain_broken") == (status, one_line(err).split(":")[1].strip())


def test_without_a_key_the_same_rewrite_verifies_which_is_why_the_key_matters(journal: Path) -> None:
    """The limit, shown: on a journal without a key, the same recomputed rewrite passes
    ``verify`` (exit 0). A keyless chain detects accidents, not someone who recomputes it."""
    run_good_plan(journal)
    rewrite(journal, forge_receipt)

    status, out, err = verify(journal)

    assert (0, "ok: 1 run(s), 8 event(s) verified\n", "") == (status, out, err)


def test_claiming_the_journal_was_never_keyed_is_refused_by_a_verifier_that_holds_the_key(journal: Path) -> None:
    """The attacker also flips the journal's recorded chain kind to sha256. A verifier with the
    key refuses the journal (exit 2, naming the mismatch); only a verifier without the key
    would accept it, so a keyed journal must always be verified with its key."""
    run_good_plan(journal, Chain(KEY))
    rewrite(journal, forge_receipt, claim_unkeyed=True)

    with_key = verify(journal, env=KEYED)
    without_key = verify(journal)

    assert 2 == with_key[0]
    assert "journal chain is sha256, opened as hmac-sha256" in one_line(with_key[2])
    assert (0, "") == (without_key[0], without_key[2])


def test_head_kept_outside_detects_a_truncated_tail_that_verify_alone_accepts(journal: Path) -> None:
    """``head`` prints ``RUN SEQ HEX``. The attacker drops the last three events (a prefix of a
    valid chain is a valid chain, so plain ``verify`` still exits 0); ``verify --expect-head``
    with the head kept outside exits 7 naming the run and the head it found."""
    run_good_plan(journal)
    run_id, seq, kept = head(journal)
    rewrite(journal, drop_tail(seq - 3))

    plain = verify(journal)
    status, _, err = verify(journal, "--run-id", RUN, "--expect-head", kept)

    assert (RUN, 8) == (run_id, seq)
    assert (0, "") == (plain[0], plain[2])
    assert 7 == status
    line = one_line(err)
    assert (True, True) == (f"run '{RUN}', seq {seq - 3}" in line, f"expected {kept}" in line)


def test_head_kept_outside_detects_a_rewritten_and_relinked_tail(journal: Path) -> None:
    """Without a key the attacker rewrites the last event and re-links it: ``verify`` passes,
    ``verify --expect-head`` exits 7 because the head moved."""
    run_good_plan(journal)
    _, seq, kept = head(journal)
    rewrite(journal, lambda s, body: body.replace(b'"run.completed"', b'"run.completed" ') if s == seq else body)

    assert 0 == verify(journal)[0]
    assert 7 == verify(journal, "--run-id", RUN, "--expect-head", kept)[0]


def test_with_a_key_truncation_still_needs_the_head_kept_outside(journal: Path) -> None:
    """HMAC stops forged links, not deletions from the end: a keyed journal cut after seq 5
    verifies with the key (exit 0); ``--expect-head`` with the kept head exits 7."""
    run_good_plan(journal, Chain(KEY))
    _, _, kept = head(journal, env=KEYED)
    rewrite(journal, drop_tail(5))

    checked = verify(journal, "--run-id", RUN, "--expect-head", kept, env=KEYED)

    assert (0, 7) == (verify(journal, env=KEYED)[0], checked[0])


def test_the_head_matches_what_verify_reports_and_passes_expect_head(journal: Path) -> None:
    """On an untouched keyed journal, ``head`` and ``verify --json`` agree on the head, and
    ``verify --expect-head`` with it exits 0 (upper-case hex accepted)."""
    run_good_plan(journal, Chain(KEY))
    _, _, kept = head(journal, env=KEYED)

    done = effectlog("verify", "--journal", str(journal), "--json", cwd=journal.parent, env=KEYED)
    status, _, err = verify(journal, "--run-id", RUN, "--expect-head", kept.upper(), env=KEYED)

    assert f'"head": "{kept}"' in done.stdout
    assert (0, "") == (status, err)

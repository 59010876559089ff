"""A location's password never reaches a message, a notification or the console, however it is written.

effectlog printed a PostgreSQL URL's password masked only when it sat in the userinfo as
``user:PASSWORD@host``, and had three maskers that disagreed. libpq also takes the password as a query
parameter (``postgresql://h/db?password=...``, the key percent-encodable, and ``sslpassword`` for a
client key), and a hand-written URL may hold a raw ``/`` in it; those were printed as given: by the CLI's
storage error, the refusal of a URL-form location, the console's log and a notification's command. A
notification's location of an IPv6 host lost its brackets when its password was masked, so the command it
carried named no host the CLI can reach. One mask (``journal.sidecars.masked``) serves every place.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from effectlog.errors import StorageError
from effectlog.journal.sidecars import masked, url_refusal
from effectlog.notify import shown_location
from effectlog.pgcluster import free_port
from hardening_kit import effectlog

SECRET = "s3cret"

# (written, shown): what a reader may see of each location
CASES = [
    ("postgresql://u:s3cret@h:5/d", "postgresql://u:***@h:5/d"),
    ("postgresql://u@h/d", "postgresql://u@h/d"),
    ("postgresql://h/d?password=s3cret", "postgresql://h/d?password=***"),
    (
        "postgresql://h/d?sslmode=require&password=s3cret&application_name=x",
        "postgresql://h/d?sslmode=require&password=***&application_name=x",
    ),
    ("postgresql://h/d?pass%77ord=s3cret", "postgresql://h/d?pass%77ord=***"),
    ("postgresql://h/d?sslpassword=s3cret", "postgresql://h/d?sslpassword=***"),
    ("postgresql://u:s3cret/x@h/d", "postgresql://u:***@h/d"),
    ("postgresql://u:s3cret@[::1]:5432/d", "postgresql://u:***@[::1]:5432/d"),
    ("postgres://:s3cret@h/d", "postgres://:***@h/d"),
]


@pytest.mark.parametrize(("written", "shown"), CASES)
def test_every_masker_shows_a_location_the_same_way_and_never_its_password(written: str, shown: str) -> None:
    """Proves: the one mask (a PostgreSQL journal's and fleet store's ``location``), a notification's
    location and a URL refusal's message show the same text, with the password nowhere in it."""
    refusal = url_refusal(written, "journal")
    assert (shown, shown) == (masked(written), shown_location(written))
    assert (True, False) == (repr(shown) in refusal, "s3cret" in refusal.replace(shown, "")), refusal


@pytest.mark.parametrize("written", [w for w, _ in CASES if SECRET in w])
def test_the_cli_never_prints_a_journal_urls_password(tmp_path: Path, written: str) -> None:
    """Proves: ``effectlog status --journal URL`` on a server that is not there fails as a storage error
    in one line that names the journal and holds no password."""
    url = written.replace("@h:5/", f"@127.0.0.1:{free_port()}/").replace("//h/", f"//127.0.0.1:{free_port()}/")
    url = url.replace("@h/", f"@127.0.0.1:{free_port()}/").replace("[::1]:5432", f"[::1]:{free_port()}")
    done = effectlog("status", "--journal", url, cwd=tmp_path)
    lines = done.stderr.strip().splitlines()
    assert (StorageError.exit_status, 1) == (done.returncode, len(lines)), done.stderr
    assert (False, True) == (SECRET in done.stderr, "***" in lines[0]), lines[0]


@pytest.mark.parametrize(
    ("written", "shown"),
    [
        ("host=h password='s3 cret' dbname=d", "host=h password=*** dbname=d"),
        ("host=h sslpassword=s3cret", "host=h sslpassword=***"),
        ("/tmp/password=s3cret.db", "/tmp/password=s3cret.db"),
        ("runs/u:s3cret@h.db", "runs/u:s3cret@h.db"),
    ],
)
def test_a_keyword_connection_string_is_masked_and_a_files_path_is_left_as_given(written: str, shown: str) -> None:
    """Proves: ``password=`` in a keyword connection string is masked (the refusal of one shows it so),
    and a file's path that merely looks like one is shown as it is (a notification's command must name
    that file)."""
    assert shown == masked(written)

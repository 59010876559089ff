"""Reads through a PostgreSQL journal inherited across ``fork()``: the child's copy of the journal holds
the parent's pooled connections, so the child's queries went down the parent's sockets, interleaved
with the parent's own protocol stream. Claims and appends already refused in the child; reads did not.
Real PostgreSQL (the ``pg_url`` fixture), ``os.fork`` only in a child interpreter, never in pytest's."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

pytest_plugins = ["pg_fixture"]

# The parent opens the journal (one pooled connection, so the child's copy is certainly that one),
# writes run r and forks. The child calls every reading method through the inherited journal many
# times while the parent reads r and appends runs through the same journal; each says what it saw.
_SCRIPT = """
    import json, os, select, signal, sys
    from effectlog.errors import EffectlogError
    from effectlog.journal.postgres import PostgresJournal
    from effectlog.testing import sample_run

    def hung(*_):
        raise TimeoutError("no answer within 20 s")

    url = sys.argv[1]
    journal = PostgresJournal(url, pool_size=1)
    journal.append(sample_run("r", steps=10))
    expected = [(rec.seq, rec.body) for rec in journal.read("r")]
    ready, child_said = os.pipe()
    go_child, go = os.pipe()
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGALRM, hung)
        signal.alarm(20)
        os.read(go_child, 1)
        reads = {
            "read": lambda: list(journal.read("r")),
            "head": lambda: journal.head("r"),
            "owner": lambda: journal.owner("r"),
            "runs": journal.runs,
            "checkpoints": lambda: journal.checkpoint_rows("r"),
        }
        said = {}
        for name, call in reads.items():
            try:
                for _ in range(100):
                    call()
                said[name] = "read"
            except EffectlogError as exc:
                said[name] = exc.code
            except BaseException as exc:
                said[name] = type(exc).__name__
        os.write(child_said, json.dumps(said).encode() + b"\\n")
        os._exit(0)
    signal.signal(signal.SIGALRM, hung)
    signal.alarm(20)
    os.write(go, b"x")
    parent = {"same": 0, "other": 0, "errors": []}
    for i in range(300):
        try:
            got = [(rec.seq, rec.body) for rec in journal.read("r")]
            parent["same" if got == expected else "other"] += 1
            if i % 30 == 0:
                journal.append(sample_run(f"q{i}", steps=1))
        except BaseException as exc:
            parent["errors"].append(type(exc).__name__)
            if isinstance(exc, TimeoutError):
                break
    signal.alarm(0)
    if select.select([ready], [], [], 30)[0]:
        child = json.loads(os.read(ready, 1000))
    else:  # waiting for an answer the parent took, or for a connection only the parent's pool threads make
        child = "hung"
        os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    written = sorted(r for r in journal.runs() if r.startswith("q"))
    print(json.dumps({"child": child, "parent": parent, "written": len(written)}))
"""


def test_reads_through_a_postgres_journal_inherited_across_fork_are_refused_in_the_child(pg_url: str) -> None:
    """A child of ``fork()`` reading through the journal its parent opened (a pre-forking server, a
    multiprocessing pool) sent its queries down the parent's pooled sockets while the parent used them:
    answers crossed between the processes, the parent saw protocol errors or another query's rows.
    Proves: every reading method refuses in the child (``journal_inherited``, exit 6, nothing sent on
    the parent's sessions), and the parent's 300 reads all return run r as written and its 10 appends
    all land."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_SCRIPT), pg_url], capture_output=True, text=True, timeout=120
    )
    assert proc.stdout, proc.stderr
    said = json.loads(proc.stdout)
    refused = "journal_inherited"
    expected = {
        "child": {"read": refused, "head": refused, "owner": refused, "runs": refused, "checkpoints": refused},
        "parent": {"same": 300, "other": 0, "errors": []},
        "written": 10,
    }
    assert expected == said, proc.stderr[-2000:]
    assert "" == proc.stderr  # no connection of the parent's pool was broken or discarded

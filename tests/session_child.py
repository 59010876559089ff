"""A child process for the session crash tests: runs one pass, and SIGKILLs itself at a crash point.

Usage: python tests/session_child.py JOURNAL RUN_ID CALLS_FILE POINT STEP_ID IDEMPOTENT [PROVIDER_URL]
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from effectlog.session import Session, SqliteCheckpointer
from session_kit import drive, kill_at, scripted, toolbox


def main(argv: list[str]) -> int:
    journal, run_id, calls, point, step_id, idempotent = argv[:6]
    url = argv[6] if len(argv) > 6 else None
    calls_file = Path(calls)
    if url is None:
        gateway = scripted(calls_file, idempotent=idempotent == "1")
    else:
        from effectlog.session.http import OpenAIGateway

        gateway = OpenAIGateway(url, model="stand-in", tools=toolbox(calls_file, idempotent=idempotent == "1"))
    store = SqliteCheckpointer(journal)
    session = Session(run_id, gateway, store, crash_hook=kill_at(point, step_id))
    asyncio.run(drive(session))
    store.close()
    return 0  # the tests expect a SIGKILL before this point


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Write the table of a crash-matrix report into docs/crash-matrix.md (between its markers).

    python experiments/crash_matrix_docs.py experiments/results/crash-matrix.json

The report must verify first: the docs only ever show a table recomputed from evidence.
"""

from __future__ import annotations

import sys
from pathlib import Path

from effectlog.crashmatrix.report import load_report, render_table, verify

START, END = "<!-- crash-matrix-table:start -->", "<!-- crash-matrix-table:end -->"
DOC = Path(__file__).resolve().parents[1] / "docs" / "crash-matrix.md"


def table_block(report_path: str) -> str:
    report = load_report(report_path)
    problems = verify(report)
    if problems:
        raise SystemExit("the report does not verify:\n" + "\n".join(problems))
    env = report.environment
    assert env is not None
    about = (
        f"Run {report.created_at} at revision `{env.revision[:12]}`: Python {env.python}, SQLite {env.sqlite}, "
        f"{env.platform}, {env.cpu}, {env.memory}; runtime sources sha256 `{env.runtime_sha256[:16]}…`."
    )
    return f"{START}\n{about}\n\n{render_table(report)}{END}"


def main() -> None:
    report_path = sys.argv[1] if len(sys.argv) > 1 else "experiments/results/crash-matrix.json"
    text = DOC.read_text()
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    DOC.write_text(head + table_block(report_path) + tail)


if __name__ == "__main__":
    main()

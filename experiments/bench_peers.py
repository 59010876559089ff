"""The peers, each run in its own child process by ``bench.py``: DBOS Transact and LangGraph.

    python experiments/bench_peers.py dbos N WORKDIR
    python experiments/bench_peers.py langgraph N WORKDIR

Each prints one JSON object on its last line of stdout: steps, seconds, steps per second,
microseconds per step (wall clock and the process's CPU time), the library version and
the SQLite PRAGMAs the library ran with.
Start-up (imports, DBOS launch, graph compilation) is excluded from the timing; one
short warm-up run is made first, as for effectlog.
"""

from __future__ import annotations

import json
import sqlite3
import sys
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any, TypedDict


def pragmas(path: Path) -> dict[str, Any]:
    db = sqlite3.connect(path)
    try:
        return {
            "journal_mode": db.execute("PRAGMA journal_mode").fetchone()[0],
            # A fresh connection's default: the library may set its own on its connection.
            "synchronous_default": db.execute("PRAGMA synchronous").fetchone()[0],
        }
    finally:
        db.close()


def run_dbos(n: int, workdir: Path) -> dict[str, Any]:
    """A DBOS workflow of ``n`` trivial steps, its system database on SQLite."""
    from dbos import DBOS, DBOSConfig

    @DBOS.step()
    def noop(i: int) -> int:
        return i

    @DBOS.workflow()
    def workflow(steps: int) -> int:
        for i in range(steps):
            noop(i)
        return steps

    path = workdir / "dbos.sqlite"
    config: DBOSConfig = {"name": "effectlog-bench", "system_database_url": f"sqlite:///{path}"}
    DBOS(config=config)
    DBOS.launch()
    try:
        workflow(5)  # warm-up
        start, cpu = time.perf_counter(), time.process_time()
        workflow(n)
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    finally:
        DBOS.destroy()
    return {"library": f"dbos {version('dbos')}", "sqlite": pragmas(path), **rates(n, seconds, cpu)}


class _State(TypedDict):
    i: int


def run_langgraph(n: int, workdir: Path) -> dict[str, Any]:
    """A LangGraph graph of ``n`` sequential nodes, checkpointed by SqliteSaver with durability="sync"."""
    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.graph import END, START, StateGraph

    def node(state: _State) -> dict[str, int]:
        return {"i": state["i"] + 1}

    def graph(nodes: int, saver: Any) -> Any:
        builder = StateGraph(_State)
        previous = START
        for k in range(nodes):
            builder.add_node(f"n{k}", node)
            builder.add_edge(previous, f"n{k}")
            previous = f"n{k}"
        builder.add_edge(previous, END)
        return builder.compile(checkpointer=saver)

    path = workdir / "langgraph.sqlite"
    conn = sqlite3.connect(path, check_same_thread=False)
    saver = SqliteSaver(conn)
    warm, timed = graph(5, saver), graph(n, saver)
    warm.invoke({"i": 0}, {"configurable": {"thread_id": "warm-up"}}, durability="sync")
    config = {"configurable": {"thread_id": "bench"}, "recursion_limit": n + 10}
    start, cpu = time.perf_counter(), time.process_time()
    out = timed.invoke({"i": 0}, config, durability="sync")
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    if out["i"] != n:
        raise RuntimeError(f"langgraph ran {out['i']} nodes, expected {n}")
    used = {
        "journal_mode": conn.execute("PRAGMA journal_mode").fetchone()[0],
        "synchronous": conn.execute("PRAGMA synchronous").fetchone()[0],
    }
    conn.close()
    return {"library": f"langgraph {version('langgraph')}", "sqlite": used, **rates(n, seconds, cpu)}


def rates(n: int, seconds: float, cpu: float) -> dict[str, Any]:
    """Wall and CPU time per step; CPU is the whole process's (every thread the library runs)."""
    return {
        "steps": n,
        "seconds": seconds,
        "steps_per_s": n / seconds,
        "us_per_step": seconds / n * 1e6,
        "cpu_us_per_step": cpu / n * 1e6,
    }


def main(argv: list[str]) -> int:
    peer, n, workdir = argv[0], int(argv[1]), Path(argv[2])
    workdir.mkdir(parents=True, exist_ok=True)
    result = {"dbos": run_dbos, "langgraph": run_langgraph}[peer](n, workdir)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

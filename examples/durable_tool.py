"""Durable tools for plain Python: every effect happens once, across SIGKILL and resume.

Two runs, each over three passes in their own processes, with their own connection to
the journal. Pass one is killed with SIGKILL inside a tool, right after its effect:

- ``order-a`` dies in ``reserve`` (idempotent): pass two sends it again with the same
  idempotency key, the inventory API recognises the key and applies nothing new;
- ``order-b`` dies in ``charge`` (not idempotent): pass two stops with ``UncertainEffect``
  and the command that resolves it; an operator finds the charge in the bank's ledger
  and runs ``effectlog reconcile ... --outcome applied``; pass three completes without
  charging again.

Runs offline, in a temporary directory::

    python examples/durable_tool.py

The last line is one JSON object: the effects each pass really applied, and whether
every effect happened exactly once (exit status 0 only then).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from effectlog import durable
from effectlog.errors import EffectlogError


class World:
    """The outside world, as files that survive SIGKILL: what each API was sent and what it applied."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def write(self, api: str, line: str) -> None:
        with open(self.folder / f"{api}.log", "a", encoding="utf-8") as fh:
            fh.write(line + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def read(self, api: str) -> list[str]:
        path = self.folder / f"{api}.log"
        return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


def program(case: str, journal: Path, world: World, *, die: bool) -> Any:
    """The application: plain functions, each declared once, called inside a durable run."""

    @durable.tool(idempotent=True)
    def reserve(sku: str, idempotency_key: str = "") -> dict[str, Any]:
        """An inventory API that honours idempotency keys."""
        world.write("reserve-sent", idempotency_key)
        fresh = idempotency_key not in world.read("reserve-applied")
        if fresh:
            world.write("reserve-applied", idempotency_key)
        if die:
            os.kill(os.getpid(), signal.SIGKILL)  # a real crash: the result is never recorded
        return {"sku": sku, "reserved": True}

    @durable.tool(idempotent=False)
    def send_receipt(to: str) -> str:
        world.write("receipt-applied", to)
        return f"receipt sent to {to}"

    @durable.tool(idempotent=False, on_reconciled=lambda r: {"charged": "per operator", "evidence": r.evidence})
    def charge(order: str, cents: int) -> dict[str, Any]:
        """A payment API without idempotency keys."""
        world.write("charge-applied", f"{order} {cents}")
        if die:
            os.kill(os.getpid(), signal.SIGKILL)
        return {"charged": cents}

    with durable.run(case, journal=journal) as run:
        if case == "order-a":
            reserve("sku-1")
            run.finish(send_receipt("ann@example.com"))
        else:
            run.finish(charge(case, 4200))
    return run.result


def one_pass(case: str, journal: Path, world: World, *, die: bool) -> int:
    try:
        result = program(case, journal, world, die=die)
    except EffectlogError as exc:  # what the app's own CLI or worker would report
        print(json.dumps({"case": case, "error": exc.code, "command": exc.fields.get("command")}))
        return int(exc.exit_status)
    print(json.dumps({"case": case, "result": result}))
    return 0


APPLIED = ("reserve-applied", "receipt-applied", "charge-applied")


def effects(world: World) -> int:
    return sum(len(world.read(api)) for api in APPLIED)


def reconcile_from_the_ledger(journal: Path, world: World) -> None:
    """The operator's part: the bank's ledger shows the charge, so it is reconciled as applied."""
    evidence = f"bank ledger: {world.read('charge-applied')[0]}"
    argv = ["reconcile", "--journal", str(journal), "--run-id", "order-b", "--step", "step-0"]
    argv += ["--outcome", "applied", "--evidence", evidence, "--operator", "example"]
    subprocess.run([sys.executable, "-m", "effectlog", *argv], check=True, capture_output=True, text=True)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--pass"]:  # a child: one pass of one case
        case, journal, folder, die = argv[1], Path(argv[2]), Path(argv[3]), argv[4] == "die"
        return one_pass(case, journal, World(folder), die=die)
    passes: list[dict[str, int]] = []
    expected_status = {1: -signal.SIGKILL, 2: 0, 3: 0}
    with tempfile.TemporaryDirectory(prefix="effectlog-durable-tool-") as tmp:
        journal, world = Path(tmp) / "runs.db", World(Path(tmp))
        ok = True
        for n in (1, 2, 3):
            before = effects(world)
            for case in ("order-a", "order-b"):
                child = subprocess.run(
                    [sys.executable, __file__, "--pass", case, str(journal), tmp, "die" if n == 1 else "live"],
                    capture_output=True,
                    text=True,
                    check=False,
                )
                report = child.stdout.strip().splitlines()[-1:] or ["(killed)"]
                print(f"pass {n} {case}: exit {child.returncode}  {report[0]}")
                expected = 3 if (n, case) == (2, "order-b") else expected_status[n]  # 3: stopped, uncertain
                ok = ok and child.returncode == expected
            if n == 2:
                reconcile_from_the_ledger(journal, world)
                print("operator: charge found in the bank ledger, reconciled as applied")
            passes.append({"model_calls": 0, "tool_effects": effects(world) - before})
        sent = world.read("reserve-sent")
        print(f"reserve sent {len(sent)} times with {len(set(sent))} key(s)")
        ok = ok and len(sent) == 2 and len(set(sent)) == 1
        ok = ok and all(len(world.read(api)) == 1 for api in APPLIED)
    print(json.dumps({"framework": "python", "passes": passes, "ok": ok}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""What is at stake is visible: approvers and reconcilers see what they act on (issue 12 item 8).

For a step that waits for a person (held for approval, or uncertain), ``status`` and
``timeline``, human and ``--json``, show the adapter or tool, the args as recorded
(secret values only as digests), the args digest, the idempotency key, the attempt and
the exact command; that command, run as printed (with NAME/TEXT filled in), works.
``approve --expect-digest`` refuses a digest that is not the held call's, writing nothing.
Every command runs as a real ``effectlog`` process.
"""

from __future__ import annotations

import asyncio
import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from effectlog.canonical import digest
from effectlog.errors import UncertainEffect
from effectlog.session import (
    Agent,
    ApprovalStep,
    Decision,
    FinalStep,
    ScriptedModel,
    Session,
    SqliteCheckpointer,
    Toolbox,
    ToolCall,
    call,
    say,
    tool_call_hash,
)
from hardening_kit import effectlog, one_line, snapshot

RUN = "pay-1"
CARD = "4242424242424242"
ARGS = {"to": "bob", "amount": 5, "card": CARD}
REDACTED = {"to": "bob", "amount": 5, "card": {"$secret_sha256": digest(CARD)}}
HASH = tool_call_hash("step-1", "transfer", ARGS)


def gateway(calls: list[str]) -> ScriptedModel:
    tools = Toolbox()

    @tools.tool(idempotent=False, secret=["card"])
    def transfer(to: str, amount: int, card: str) -> dict[str, Any]:
        """Charge a card (the card number is secret)."""
        calls.append(to)
        return {"sent": amount, "to": to}

    return ScriptedModel([call("transfer", **ARGS), say("sent 5 to bob")], tools=tools)


def hold(c: ToolCall) -> Decision:
    return "require_approval"


def agent_pass(journal: Path, calls: list[str], *, policy: Any = None) -> list[Any]:
    async def go() -> list[Any]:
        with SqliteCheckpointer(journal) as store:
            session = Session(RUN, gateway(calls), store, policy=policy)
            return [s async for s in Agent().run("pay bob", session=session)]

    return asyncio.run(go())


def cli_json(tmp_path: Path, *argv: str) -> Any:
    done = effectlog(*argv, "--json", cwd=tmp_path)
    assert (0, "") == (done.returncode, done.stderr)
    return json.loads(done.stdout)


@pytest.fixture
def held(tmp_path: Path) -> Path:
    """A session run held for approval at its transfer (step-1), the journal closed."""
    journal = tmp_path / "runs.db"
    calls: list[str] = []
    steps = agent_pass(journal, calls, policy=hold)
    assert isinstance(steps[-1], ApprovalStep)
    assert [] == calls
    return journal


def test_status_and_timeline_json_show_the_held_call(held: Path, tmp_path: Path) -> None:
    """status --json and timeline --json carry, for the held step: the tool, the args with the
    card as its digest, the tool call hash, attempt 1, no key yet, and the approve command
    pinned to the digest and bound to the attempt. The timeline labels the held event "held for approval"."""
    status = cli_json(tmp_path, "status", "--journal", str(held), "--run-id", RUN)
    timeline = cli_json(tmp_path, "timeline", "--journal", str(held), "--run-id", RUN)

    command = (
        f"effectlog approve --journal {shlex.quote(str(held))} --run-id {RUN} --step step-1 "
        f"--attempt 1 --by NAME --expect-digest {HASH}"
    )
    expected = {
        "step_id": "step-1",
        "state": "awaiting_approval",
        "kind": "tool",
        "adapter": "transfer",
        "adapter_type": None,
        "args": REDACTED,
        "args_digest": HASH,
        "idempotency_key": "",
        "idempotent": False,
        "attempt": 1,
        "reason": "approval required by policy",
        "action": "approve",
        "command": command,
    }
    held_events = [e for e in timeline if e.get("label") == "held for approval"]
    assert [expected] == status["at_stake"]
    assert [("step.denied", "require_approval", expected)] == [
        (e["type"], e["decision"], e["at_stake"]) for e in held_events
    ]


def test_human_status_and_timeline_show_the_held_call_and_never_the_secret(held: Path, tmp_path: Path) -> None:
    """The human forms: the timeline says "held for approval" (not step.denied
    decision=require_approval), and both print the tool, redacted args, digest and the
    approve command. The card number appears in no output and in no tool step's event (the
    model's own answer, which named it, is recorded as the model gave it: docs/sessions.md)."""
    status = effectlog("status", "--journal", str(held), "--run-id", RUN, cwd=tmp_path)
    timeline = effectlog("timeline", "--journal", str(held), "--run-id", RUN, cwd=tmp_path)

    for done in (status, timeline):
        assert (0, "") == (done.returncode, done.stderr)
        assert "step step-1: held for approval: approve or deny it" in done.stdout
        assert "  tool:             transfer  (not idempotent)" in done.stdout
        assert f'"card":{{"$secret_sha256":"{digest(CARD)}"}}' in done.stdout
        assert f"  args digest:      {HASH}" in done.stdout
        assert f"--by NAME --expect-digest {HASH}" in done.stdout
    rows = [line.split() for line in timeline.stdout.splitlines() if line[:1].isdigit()]
    held_rows = [row[0] for row in rows if row[2:6] == ["held", "for", "approval", "step-1"]]
    assert 1 == len(held_rows)
    assert "decision=require_approval" not in timeline.stdout
    assert "step.denied" not in timeline.stdout
    events = cli_json(tmp_path, "timeline", "--journal", str(held), "--run-id", RUN)
    tool_events = [e for e in events if e.get("step_id") == "step-1"]
    assert ["step.denied", "run.suspended"] == [e["type"] for e in events[-2:]]
    assert (False, False) == (CARD in status.stdout + timeline.stdout, CARD in json.dumps(tool_events))


def test_approve_with_another_digest_exits_5_and_writes_nothing(held: Path, tmp_path: Path) -> None:
    """approve --expect-digest with a digest that is not the held call's: exit 5,
    digest_mismatch naming the run and step, and the journal's bytes are unchanged."""
    before = snapshot(tmp_path)
    wrong = "0" * 64

    done = effectlog(
        "approve", "--journal", str(held), "--run-id", RUN, "--step", "step-1", "--by", "ann",
        "--expect-digest", wrong, cwd=tmp_path,
    )  # fmt: skip

    after = {k: v for k, v in snapshot(tmp_path).items() if not k.endswith((".lock", "-shm"))}
    assert 5 == done.returncode
    assert one_line(done.stderr).startswith(f"effectlog: digest_mismatch: run '{RUN}', step 'step-1': ")
    assert {k: v for k, v in before.items() if not k.endswith((".lock", "-shm"))} == after


def test_approve_with_an_expect_digest_that_is_no_digest_is_bad_input_and_writes_nothing(
    held: Path, tmp_path: Path
) -> None:
    """``--expect-digest zz`` (a typo, half a digest): exit 2 naming --expect-digest, not exit 5 (a mismatch
    says the held call changed, which it did not), and the journal's bytes are unchanged."""
    before = snapshot(tmp_path)

    done = effectlog(
        "approve", "--journal", str(held), "--run-id", RUN, "--step", "step-1", "--by", "ann",
        "--expect-digest", "zz", cwd=tmp_path,
    )  # fmt: skip

    after = {k: v for k, v in snapshot(tmp_path).items() if not k.endswith((".lock", "-shm"))}
    assert 2 == done.returncode
    assert one_line(done.stderr).startswith("effectlog: bad_input: expected digest 'zz' (--expect-digest): ")
    assert {k: v for k, v in before.items() if not k.endswith((".lock", "-shm"))} == after


def test_the_printed_approve_command_works_and_the_transfer_runs_once(held: Path, tmp_path: Path) -> None:
    """The approve command exactly as status printed it, NAME filled in: exit 0; the next pass
    runs the transfer once and completes."""
    status = cli_json(tmp_path, "status", "--journal", str(held), "--run-id", RUN)
    argv = shlex.split(status["at_stake"][0]["command"].replace("NAME", "ann"))

    done = effectlog(*argv[1:], cwd=tmp_path)

    calls: list[str] = []
    steps = agent_pass(held, calls)
    assert (0, "") == (done.returncode, done.stderr)
    assert (["bob"], FinalStep(run_id=RUN, result="sent 5 to bob")) == (calls, steps[-1])


def test_the_session_records_the_tool_and_redacted_args_on_its_events(tmp_path: Path) -> None:
    """step.requested of a session tool call carries the tool name and the args, with the
    secret arg as its digest (a new defaulted field: old journals decode unchanged)."""
    journal = tmp_path / "runs.db"
    agent_pass(journal, [])
    timeline = cli_json(tmp_path, "timeline", "--journal", str(journal), "--run-id", RUN)

    requested = [e for e in timeline if e["type"] == "step.requested" and e.get("kind", "tool") == "tool"]
    assert [("transfer", REDACTED)] == [(e["adapter"], e["args"]) for e in requested]


LOST_REPLY = """
class LostReply:
    def __init__(self, store):
        self.store = store

    def invoke(self, request):
        self.store.apply_control(request)
        raise ConnectionError("connection reset after the effect")


ADAPTERS = {"test.lost-reply": lambda decl, ctx: LostReply(ctx.effect_store())}
"""

PLAN = {
    "run_id": "charge-7",
    "adapters": {"psp": {"type": "test.lost-reply", "version": "1", "idempotent": False}},
    "steps": [{"id": "charge", "adapter": "psp", "args": {"amount_cents": 1299, "card": CARD}, "secret": ["card"]}],
}


def test_an_uncertain_plan_step_shows_adapter_args_key_and_the_reconcile_command(tmp_path: Path) -> None:
    """A plan step whose reply was lost (not idempotent) is uncertain: status and timeline show
    the adapter and its type, the pinned args with the card as digest, the idempotency key that
    was sent, attempt 1, and the reconcile command; that command, filled in, exits 0."""
    (tmp_path / "lost_tools.py").write_text(LOST_REPLY)
    (tmp_path / "plan.json").write_text(json.dumps(PLAN))
    journal = str(tmp_path / "journal.db")
    env = {"PYTHONPATH": str(tmp_path)}
    first = effectlog(
        "run", "plan.json", "--journal", journal, "--effects", "effects.db", "--adapters", "lost_tools:ADAPTERS",
        cwd=tmp_path, env=env,
    )  # fmt: skip
    assert 3 == first.returncode

    status = cli_json(tmp_path, "status", "--journal", journal, "--run-id", "charge-7")
    timeline = cli_json(tmp_path, "timeline", "--journal", journal, "--run-id", "charge-7")
    human = effectlog("status", "--journal", journal, "--run-id", "charge-7", cwd=tmp_path)

    sent_key = next(e["idempotency_key"] for e in timeline if e["type"] == "step.requested")
    stake = status["at_stake"]
    assert [("charge", "uncertain", "psp", "test.lost-reply", {"amount_cents": 1299, "card": REDACTED["card"]})] == [
        (a["step_id"], a["state"], a["adapter"], a["adapter_type"], a["args"]) for a in stake
    ]
    assert (sent_key, 1, "reconcile") == (stake[0]["idempotency_key"], stake[0]["attempt"], stake[0]["action"])
    assert [stake[0]] == [e["at_stake"] for e in timeline if "at_stake" in e]
    assert f"  idempotency key:  {sent_key}" in human.stdout
    assert "  adapter:          psp (test.lost-reply)  (not idempotent)" in human.stdout
    assert CARD not in human.stdout + json.dumps(status) + json.dumps(timeline)
    command = stake[0]["command"].replace("applied|not-applied", "applied")
    argv = shlex.split(command.replace("TEXT", "ledger-row-1").replace("NAME", "ann"))
    done = effectlog(*argv[1:], cwd=tmp_path)
    assert (0, "") == (done.returncode, done.stderr)


def test_a_session_tool_error_that_echoes_a_secret_is_recorded_redacted(tmp_path: Path) -> None:
    """A non-idempotent tool that fails with a message repeating its card number: the step is
    uncertain, its recorded reason says ``<secret card>`` instead, and status shows no card."""
    tools = Toolbox()

    @tools.tool(idempotent=False, secret=["card"])
    def transfer(to: str, amount: int, card: str) -> dict[str, Any]:
        """Fails after the effect, echoing its card."""
        raise ConnectionError(f"gateway reset while charging card {card} ({card!r})")

    async def go() -> None:
        with SqliteCheckpointer(tmp_path / "runs.db") as store:
            session = Session(RUN, ScriptedModel([call("transfer", **ARGS), say("done")], tools=tools), store)
            [s async for s in Agent().run("pay bob", session=session)]

    with pytest.raises(UncertainEffect):
        asyncio.run(go())
    status = cli_json(tmp_path, "status", "--journal", str(tmp_path / "runs.db"), "--run-id", RUN)
    human = effectlog("status", "--journal", str(tmp_path / "runs.db"), "--run-id", RUN, cwd=tmp_path)

    reason = "outcome unknown: ConnectionError: gateway reset while charging card <secret card> (<secret card>)"
    assert [("uncertain", reason, REDACTED)] == [(a["state"], a["reason"], a["args"]) for a in status["at_stake"]]
    assert CARD not in json.dumps(status) + human.stdout


def test_a_held_plan_step_is_approved_by_the_command_status_prints(tmp_path: Path) -> None:
    """examples/approval.json waits for approval (exit 4); status shows the adapter, its type,
    the args and the approve command pinned to the args digest; running that command as
    printed approves; the next run executes the refund once."""
    from hardening_kit import ROOT

    run = ("run", str(ROOT / "examples" / "approval.json"), "--journal", "j.db", "--effects", "e.db")
    assert 4 == effectlog(*run, cwd=tmp_path).returncode
    status = cli_json(tmp_path, "status", "--journal", "j.db", "--run-id", "refund-042")
    (stake,) = status["at_stake"]
    argv = shlex.split(stake["command"].replace("NAME", "alice"))

    approved = effectlog(*argv[1:], cwd=tmp_path)
    second = effectlog(*run, cwd=tmp_path)

    assert ("payments", "effects.control", {"amount_cents": 50000}, "approve") == (
        stake["adapter"],
        stake["adapter_type"],
        stake["args"],
        stake["action"],
    )
    assert stake["command"].endswith(f"--by NAME --expect-digest {digest({'amount_cents': 50000})}")
    assert (0, 0) == (approved.returncode, second.returncode)
    assert 1 == len(cli_json(tmp_path, "effects", "--effects", "e.db"))

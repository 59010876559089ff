"""``@durable.tool`` and ``durable.run`` in one process: the contract of the plain-Python surface.

The crash cases (real SIGKILL, CLI approve/reconcile) are in tests/test_durable_tool_crash.py.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings

from effectlog import durable
from effectlog.errors import (
    ApprovalRequired,
    BadInput,
    NotApplied,
    NotInRun,
    ReplayDivergence,
    RunClosed,
    RunFailed,
    RunOwned,
    RunUnfinished,
    ToolDenied,
    UncertainEffect,
)
from effectlog.session import Decision, Reconciled, SqliteCheckpointer, ToolCall, fingerprint
from effectlog.session.identity import normalized
from strategies import json_objects, json_values

RUN = "run-1"


class Api:
    """Records every real call: (tool, args, key)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any, str]] = []

    def count(self, tool: str) -> int:
        return sum(1 for c in self.calls if c[0] == tool)


def tools(api: Api) -> tuple[Any, Any]:
    @durable.tool(idempotent=False)
    def send(to: str, body: str = "hi", idempotency_key: str = "") -> dict[str, Any]:
        """Send a message."""
        api.calls.append(("send", (to, body), idempotency_key))
        return {"to": to, "parts": (1, 2)}  # a tuple: JSON gives it back as a list

    @durable.tool(idempotent=True)
    async def lookup(name: str) -> str:
        api.calls.append(("lookup", name, durable.idempotency_key()))
        return f"{name} is known"

    return send, lookup


def block(journal: Path, *calls: Callable[[], Any], run_id: str = RUN, **options: Any) -> None:
    """One durable.run block making ``calls`` in order."""
    with durable.run(run_id, journal=journal, **options):
        for c in calls:
            c()


def journal_tags(path: Path, run_id: str = RUN) -> list[str]:
    with SqliteCheckpointer(path) as store:
        return [type(e).__struct_config__.tag for e in store.load(run_id).events]  # type: ignore[misc]


def recorded(path: Path, run_id: str = RUN) -> dict[str, tuple[str, str]]:
    with SqliteCheckpointer(path) as store:
        return {s.step_id: (s.state, s.idempotency_key or "") for s in store.load(run_id).steps}


def test_a_call_outside_a_run_is_not_in_run_and_wrapped_is_the_plain_function(tmp_path: Path) -> None:
    """Outside durable.run a durable tool refuses (naming itself); __wrapped__ calls the function unjournaled."""
    api = Api()
    send, _ = tools(api)
    with pytest.raises(NotInRun) as raised:
        send("bob")
    assert "durable tool 'send' was called outside a durable.run block" in str(raised.value)
    assert {"to": "bob", "parts": (1, 2)} == send.__wrapped__("bob", idempotency_key="k")
    assert [("send", ("bob", "hi"), "k")] == api.calls


def test_each_call_is_a_journaled_step_and_the_function_gets_the_steps_key(tmp_path: Path) -> None:
    """Intent before the call, result after; the key the function sees (parameter or accessor) is the step's."""
    api = Api()
    send, lookup = tools(api)
    with durable.run(RUN, journal=tmp_path / "runs.db"):
        send("bob")
        asyncio.run(lookup("bob"))
    steps = recorded(tmp_path / "runs.db")
    assert {"step-0": "confirmed", "step-1": "confirmed"} == {k: v[0] for k, v in steps.items()}
    assert [steps["step-0"][1], steps["step-1"][1]] == [c[2] for c in api.calls]
    expected = ["run.started", "step.requested", "step.effected", "step.confirmed"]
    expected += ["step.requested", "step.effected", "step.confirmed", "run.completed"]
    assert expected == journal_tags(tmp_path / "runs.db")


def test_results_round_trip_as_json_live_and_replayed(tmp_path: Path) -> None:
    """A live call returns what a replay returns (the JSON form), and a replay calls nothing."""
    api = Api()
    send, _ = tools(api)
    with durable.run(RUN, journal=tmp_path / "runs.db"):
        live = send("bob")
    with durable.run(RUN, journal=tmp_path / "runs.db") as run:
        replayed = send("bob")
        assert run.completed
    assert [{"to": "bob", "parts": [1, 2]}] * 2 == [live, replayed]
    assert 1 == api.count("send")


def test_args_that_are_not_json_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    """A non-JSON argument is BadInput; the function is not called and no step is recorded."""
    api = Api()
    send, _ = tools(api)
    with pytest.raises(BadInput, match="not JSON-encodable"), durable.run(RUN, journal=tmp_path / "runs.db"):
        send(object())
    assert [] == api.calls
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        assert 0 == store.state(RUN).seq


def test_the_caller_cannot_pass_the_key(tmp_path: Path) -> None:
    """idempotency_key is effectlog's to give; a caller passing it is told so."""
    send, _ = tools(Api())
    with (
        pytest.raises(BadInput, match="idempotency_key is given by effectlog"),
        durable.run(RUN, journal=tmp_path / "r.db"),
    ):
        send("bob", idempotency_key="mine")


def test_async_with_takes_async_and_sync_tools(tmp_path: Path) -> None:
    """`async with durable.run` journals awaited async tools and sync tools called from the event loop."""
    api = Api()
    send, lookup = tools(api)

    async def main() -> tuple[str, Any]:
        async with durable.run(RUN, journal=tmp_path / "runs.db") as run:
            found = await lookup("bob")
            sent = send("bob")
            run.finish("done")
        return found, sent

    assert ("bob is known", {"to": "bob", "parts": [1, 2]}) == asyncio.run(main())
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        assert ("completed", "done") == (store.state(RUN).state, store.state(RUN).result)


def test_leaving_the_block_completes_the_run_and_an_exception_leaves_it_open(tmp_path: Path) -> None:
    """An exception in the block leaves the run running; the next block resumes it (recorded calls are
    not made again) and, leaving normally, completes it with None."""
    api = Api()
    send, _ = tools(api)

    def bug() -> None:
        raise KeyError("the app's own bug")

    with pytest.raises(KeyError):
        block(tmp_path / "runs.db", lambda: send("bob"), bug)
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        assert "running" == store.state(RUN).state
    with durable.run(RUN, journal=tmp_path / "runs.db"):
        send("bob")
        send("eve")
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        assert ("completed", None) == (store.state(RUN).state, store.state(RUN).result)
    assert ["bob", "eve"] == [c[1][0] for c in api.calls]


def test_a_completed_run_replays_its_steps_refuses_new_ones_and_detects_changes(tmp_path: Path) -> None:
    """Running a completed block again calls nothing; a step it never recorded is RunClosed; other args
    at a recorded step are ReplayDivergence."""
    api = Api()
    send, _ = tools(api)
    with durable.run(RUN, journal=tmp_path / "runs.db") as run:
        send("bob")
        run.finish("ok")
    with pytest.raises(RunClosed):
        block(tmp_path / "runs.db", lambda: send("bob"), lambda: send("eve"))
    with pytest.raises(ReplayDivergence) as raised, durable.run(RUN, journal=tmp_path / "runs.db"):
        send("mallory")
    assert "step-0" == raised.value.step_id
    assert 1 == api.count("send")


def test_async_calls_made_together_take_turns_in_the_order_they_were_made(tmp_path: Path) -> None:
    """asyncio.gather of three async tools that really suspend: three steps, in call order, never
    overlapping; a second pass replays them to the same values without calling anything."""
    order: list[str] = []

    @durable.tool(idempotent=True)
    async def fetch(name: str) -> str:
        order.append(f"start {name}")
        await asyncio.sleep(0.01 if name == "a" else 0)
        order.append(f"end {name}")
        return name.upper()

    async def together() -> list[str]:
        async with durable.run(RUN, journal=tmp_path / "runs.db"):
            return list(await asyncio.gather(fetch("a"), fetch("b"), fetch("c")))

    assert ["A", "B", "C"] == asyncio.run(together())
    assert ["start a", "end a", "start b", "end b", "start c", "end c"] == order
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        steps = store.load(RUN).steps
    assert [fingerprint("tool", "fetch", {"name": n}) for n in "abc"] == [s.fingerprint for s in steps]
    assert ["A", "B", "C"] == asyncio.run(together())
    assert 6 == len(order)


def test_a_durable_tool_calling_another_or_a_sync_call_during_an_async_one_is_refused(tmp_path: Path) -> None:
    """Steps never overlap: a durable tool called from another's body (sync or async), or a sync tool
    called while an async one is in flight, is BadInput, not a second step."""
    api = Api()
    send, lookup = tools(api)

    @durable.tool(idempotent=True)
    def outer() -> str:
        return str(send("bob"))

    @durable.tool(idempotent=True)
    async def outer_async() -> str:
        return await lookup("bob")

    @durable.tool(idempotent=True)
    async def slow() -> None:
        await asyncio.sleep(0.05)

    async def sync_during_async() -> None:
        async with durable.run(RUN, journal=tmp_path / "c.db"):
            task = asyncio.ensure_future(slow())
            await asyncio.sleep(0)
            try:
                send("bob")
            finally:
                await task

    with pytest.raises(BadInput, match="never overlap"), durable.run(RUN, journal=tmp_path / "a.db"):
        outer()
    with pytest.raises(BadInput, match="never overlap"), durable.run(RUN, journal=tmp_path / "b.db"):
        asyncio.run(outer_async())
    with pytest.raises(BadInput, match="never overlap"):
        asyncio.run(sync_during_async())
    assert [] == api.calls


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"idempotent": True, "timeout_s": 1.0}, "timeout_s needs an async function"),
        ({"idempotent": False, "retry": 2}, "retry needs idempotent=True"),
        ({"idempotent": True, "retry": -1}, "retry must be a count"),
        ({"idempotent": None}, "must declare idempotent=True or idempotent=False"),
    ],
)
def test_declarations_that_cannot_hold_are_refused(options: dict[str, Any], message: str) -> None:
    """Options that cannot mean what they say fail at declaration, naming the tool."""

    def f() -> None: ...

    with pytest.raises(BadInput, match=message):
        durable.tool(**options)(f)


def test_a_timed_out_non_idempotent_call_is_uncertain(tmp_path: Path) -> None:
    """timeout_s on an async tool: past it the outcome is unknown, so a non-idempotent call stops the run."""

    @durable.tool(idempotent=False, timeout_s=0.05)
    async def slow() -> None:
        await asyncio.sleep(5)

    async def main() -> None:
        async with durable.run(RUN, journal=tmp_path / "runs.db"):
            await slow()

    with pytest.raises(UncertainEffect) as raised:
        asyncio.run(main())
    assert "effectlog reconcile --journal" in raised.value.fields["command"]
    assert {"step-0": "uncertain"} == {k: v[0] for k, v in recorded(tmp_path / "runs.db").items()}


def test_retry_sends_an_idempotent_call_again_with_the_same_key(tmp_path: Path) -> None:
    """retry=2: two failures then a success are one step, and every try carried the step's key."""
    seen: list[str] = []

    @durable.tool(idempotent=True, retry=2)
    def flaky(idempotency_key: str) -> str:
        seen.append(idempotency_key)
        if len(seen) < 3:
            raise ConnectionError("reset")
        return "ok"

    with durable.run(RUN, journal=tmp_path / "runs.db"):
        assert "ok" == flaky()
    steps = recorded(tmp_path / "runs.db")
    assert [steps["step-0"][1]] * 3 == seen


def test_not_applied_is_a_known_failure_and_the_run_goes_on(tmp_path: Path) -> None:
    """A tool raising NotApplied: the caller gets NotApplied, the step is failed, never uncertain."""

    @durable.tool(idempotent=False)
    def refuse() -> None:
        raise NotApplied("card declined")

    with durable.run(RUN, journal=tmp_path / "runs.db"), pytest.raises(NotApplied, match="card declined"):
        refuse()
    assert {"step-0": "failed"} == {k: v[0] for k, v in recorded(tmp_path / "runs.db").items()}


def test_a_policy_denies_before_the_call(tmp_path: Path) -> None:
    """The run's policy sees each new call (tool, args, idempotent) and a deny is ToolDenied, nothing called."""
    api = Api()
    send, _ = tools(api)
    asked: list[ToolCall] = []

    def policy(call: ToolCall) -> Decision:
        asked.append(call)
        return "deny" if call.args["to"] == "mallory" else "allow"

    with pytest.raises(ToolDenied):
        block(tmp_path / "runs.db", lambda: send("bob"), lambda: send("mallory"), policy=policy)
    assert ["bob"] == [c[1][0] for c in api.calls]
    assert [("send", {"to": "mallory", "body": "hi"}, False)] == [(c.tool, c.args, c.idempotent) for c in asked[1:]]


def test_a_reconciled_call_returns_on_reconciled_or_the_documented_dict(tmp_path: Path) -> None:
    """After an uncertain call is reconciled as applied, the call returns on_reconciled(Reconciled), or
    the Reconciled record as a plain dict, and is not made again."""
    made: list[str] = []

    def declare(**options: Any) -> Any:
        @durable.tool(idempotent=False, **options)
        def pay(order: str) -> str:
            made.append(order)
            raise TimeoutError("the bank did not answer")

        return pay

    for run_id, options, expected in [
        ("a", {}, {"outcome": "applied", "evidence": "stmt", "operator": "ann", "automated": False}),
        ("b", {"on_reconciled": lambda r: f"paid per {r.evidence}"}, "paid per stmt"),
    ]:
        pay = declare(**options)
        with pytest.raises(UncertainEffect), durable.run(run_id, journal=tmp_path / "runs.db"):
            pay("o-1")
        with SqliteCheckpointer(tmp_path / "runs.db") as store:
            store.reconcile(run_id, "step-0", outcome="applied", evidence="stmt", operator="ann")
        with durable.run(run_id, journal=tmp_path / "runs.db"):
            assert expected == pay("o-1")
    assert ["o-1", "o-1"] == made
    assert Reconciled is durable.Reconciled


def first_block(send: Any, journal: Path) -> None:
    """Inside a block that wrote its run: a second block on it is refused, a block on another run is not."""
    send("bob")
    with pytest.raises(RunOwned):  # a second connection, nested: "bob" replays, "eve" is its first write
        block(journal, lambda: send("bob"), lambda: send("eve"))
    with durable.run("run-2", journal=journal):
        assert "dan" == send("dan")["to"]
    raise LookupError("leave the block with the run open")


def test_a_block_owns_its_run_while_it_writes_and_releases_it_at_exit(tmp_path: Path) -> None:
    """A second block on the same run (its own connection) is refused with RunOwned while the first one
    drives it; another run of the same journal is not; after the first block exits, the run resumes."""
    api = Api()
    send, _ = tools(api)
    journal = tmp_path / "runs.db"
    with pytest.raises(LookupError), durable.run(RUN, journal=journal):
        first_block(send, journal)
    with durable.run(RUN, journal=journal):
        send("bob")
        send("eve")
    assert ["bob", "dan", "eve"] == [c[1][0] for c in api.calls]


def test_a_denied_call_fails_the_run(tmp_path: Path) -> None:
    """A held call that a person denies: the run is failed and running the block again is RunFailed, unpaid."""
    made: list[int] = []

    @durable.tool(idempotent=False, approval=True)
    def pay(cents: int) -> int:
        made.append(cents)
        return cents

    with pytest.raises(ApprovalRequired) as held:
        block(tmp_path / "runs.db", lambda: pay(5))
    assert "step-0" == held.value.step_id
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        store.deny(RUN, "step-0", by="bob", reason="no")
    with pytest.raises(RunFailed):
        block(tmp_path / "runs.db", lambda: pay(5))
    assert [] == made


def test_a_result_that_is_not_json_leaves_the_step_uncertain(tmp_path: Path) -> None:
    """The effect happened but its result cannot be recorded: an unknown outcome at once (UncertainEffect,
    the step recorded uncertain), and the next run stops on it again instead of repeating the call."""
    made: list[str] = []

    @durable.tool(idempotent=False)
    def odd() -> object:
        made.append("odd")
        return object()

    with pytest.raises(UncertainEffect, match="outcome is unknown"):
        block(tmp_path / "runs.db", odd)
    with pytest.raises(UncertainEffect):
        block(tmp_path / "runs.db", odd)
    assert ["odd"] == made


def test_a_caught_exception_of_an_idempotent_call_keeps_the_run_open_until_it_is_settled(tmp_path: Path) -> None:
    """The block catches an idempotent call's exception: leaving it does not complete the run, and run.finish
    is RunUnfinished; the next block sends the call again with the same key and completes."""
    keys: list[str] = []
    failing = [True]

    @durable.tool(idempotent=True)
    def flaky(idempotency_key: str) -> str:
        keys.append(idempotency_key)
        if failing[0]:
            raise ConnectionError("reset")
        return "ok"

    def caught() -> None:
        with pytest.raises(ConnectionError):
            flaky()

    def finish() -> None:
        run = durable.current()
        run.finish("done")

    block(tmp_path / "runs.db", caught)
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        steps = {s.step_id: s.state for s in store.load(RUN).steps}
        assert ("running", {"step-0": "requested"}) == (store.state(RUN).state, steps)
    with pytest.raises(RunUnfinished) as raised:
        block(tmp_path / "runs.db", caught, finish, run_id="run-2")
    assert ("run-2", "step-0") == (raised.value.run_id, raised.value.step_id)
    failing[0] = False
    with durable.run(RUN, journal=tmp_path / "runs.db") as run:
        assert "ok" == flaky()
    assert (True, 3, 2) == (run.completed, len(keys), len(set(keys)))


def test_two_functions_under_one_tool_name_are_refused_in_a_run(tmp_path: Path) -> None:
    """The journal tells steps apart by tool name and arguments: a second function under a used name is BadInput."""
    send, _ = tools(Api())

    @durable.tool(idempotent=False, name="send")
    def other_send(to: str, body: str = "hi") -> str:
        return "other"

    with pytest.raises(BadInput, match="are both named 'send'"):
        block(tmp_path / "runs.db", lambda: send("bob"), lambda: other_send("bob"))


def test_a_call_reconciled_as_not_applied_runs_again_with_a_new_key(tmp_path: Path) -> None:
    """Reconciled as not applied: the next block calls the function once more, as a new attempt with a new key."""
    keys: list[str] = []

    @durable.tool(idempotent=False)
    def pay(order: str, idempotency_key: str) -> str:
        keys.append(idempotency_key)
        if len(keys) == 1:
            raise TimeoutError("the bank did not answer")
        return "paid"

    with pytest.raises(UncertainEffect):
        block(tmp_path / "runs.db", lambda: pay("o-1"))
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        store.reconcile(RUN, "step-0", outcome="not_applied", evidence="no ledger line", operator="ann")
    with durable.run(RUN, journal=tmp_path / "runs.db") as run:
        assert "paid" == pay("o-1")
    assert (True, 2, 2) == (run.completed, len(keys), len(set(keys)))


def test_a_call_from_another_thread_is_refused(tmp_path: Path) -> None:
    """asyncio.to_thread copies the context, so the run is visible there; its calls could race, so they are refused."""
    api = Api()
    send, _ = tools(api)

    async def main() -> None:
        async with durable.run(RUN, journal=tmp_path / "runs.db"):
            await asyncio.to_thread(send, "bob")

    with pytest.raises(BadInput, match="from another thread"):
        asyncio.run(main())
    assert [] == api.calls


@settings(max_examples=25, deadline=None)
@given(args=json_objects, result=json_values)
def test_any_json_args_and_result_round_trip_live_and_replayed(args: dict[str, Any], result: Any) -> None:
    """For any JSON arguments and result: the live call and its replay in a new block return the same value,
    equal to the result as JSON gives it back, and the function runs once."""
    made: list[dict[str, Any]] = []

    @durable.tool(idempotent=False)
    def echo(payload: dict[str, Any]) -> Any:
        made.append(payload)
        return result

    with tempfile.TemporaryDirectory() as tmp:
        values = []
        for _ in range(2):
            with durable.run(RUN, journal=Path(tmp) / "runs.db"):
                values.append(echo(args))
    assert [normalized(result, "result")] * 2 == values
    assert [args] == made

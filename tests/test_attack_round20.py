"""Round-20 attacks on the user's side: hostile tool return values, tools that misbehave in-process,
odd plan files and the framework integrations given hostile values, with cases earlier rounds had not
tried. Each test is one suspicion: a failing reproduction first where it found a defect, kept as a short
regression test where it found none but guards a plausible mistake. Real SQLite files and real
``python -m effectlog`` processes where the CLI is the point.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from effectlog import durable
from hardening_kit import effectlog


class Abort(BaseException):
    """A library's own control-flow exception (a worker's "shutdown", a job runner's "abandon")."""


# What a tool ends its call with after its effect: none of them is an answer.
ENDINGS: dict[str, Callable[[], BaseException]] = {
    "sys.exit(0)": lambda: SystemExit(0),
    "sys.exit('bye')": lambda: SystemExit("bye"),
    "GeneratorExit": GeneratorExit,
    "BaseException subclass": lambda: Abort("abandon"),
}


def _states(journal: Path, run_id: str) -> list[tuple[str, str]]:
    done = effectlog("status", "--journal", str(journal), "--run-id", run_id, "--json", cwd=journal.parent)
    assert 0 == done.returncode, done.stderr
    return [(s["id"], s["state"]) for s in json.loads(done.stdout)["steps"]]


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("ending", sorted(ENDINGS))
def test_a_durable_tool_ending_with_a_base_exception_the_block_catches_stops_the_run_before_the_next_call(
    tmp_path: Path, ending: str, is_async: bool
) -> None:
    """A non-idempotent durable tool makes its effect, then ends with ``sys.exit()``, ``GeneratorExit`` or
    another ``BaseException``; the application catches it (a worker loop's ``except BaseException``) and
    calls the next tool. The payment's outcome is unknown, so the run must stop on it as it does for a
    ``KeyboardInterrupt``: before, only ``CancelledError`` and ``KeyboardInterrupt`` were recorded as
    uncertain, and the next call ran past the payment in doubt (the notice went out before anyone knew
    whether the payment had). Proves: the later call raises ``UncertainEffect`` without running, the
    payment is ``uncertain`` in the journal, and a second pass of the block sends nothing."""
    effects: list[str] = []
    journal = tmp_path / "runs.db"

    def pay_body() -> str:
        effects.append("pay")
        raise ENDINGS[ending]()

    if is_async:

        async def pay_async() -> str:
            return pay_body()

        pay: Any = durable.tool(pay_async, idempotent=False, name="pay")
    else:
        pay = durable.tool(pay_body, idempotent=False, name="pay")

    @durable.tool(idempotent=False)
    def notify() -> str:
        effects.append("notify")
        return "sent"

    def one_pass() -> list[str]:
        said: list[str] = []
        with durable.run("r", journal=journal):
            for call in (pay, notify):
                try:
                    answer = call()
                    if asyncio.iscoroutine(answer):
                        asyncio.run(answer)
                except BaseException as exc:  # the application's catch-all
                    said.append(type(exc).__name__)
        return said

    first = one_pass()
    second = one_pass()

    assert type(ENDINGS[ending]()).__name__ == first[0]
    assert ["UncertainEffect"] == first[1:]
    assert ["UncertainEffect", "UncertainEffect"] == second
    assert ["pay"] == effects
    assert [("step-0", "uncertain")] == _states(journal, "r")


@pytest.mark.parametrize("blocked", ["uncertain", "held for approval"])
def test_a_later_pass_that_catches_the_blocked_steps_error_runs_nothing_past_it(tmp_path: Path, blocked: str) -> None:
    """A run stopped on an uncertain payment (its reply was lost), or held for a person's approval of it,
    is run again before anyone decided: the block reaches the payment, gets ``UncertainEffect`` (or
    ``ApprovalRequired``), catches it as any ``except Exception`` would, and calls the next tool. The pass
    that stopped the run refused that call; a later pass let it run (``run.resumed``, then the notice sent
    while the payment was still in doubt or never approved). Proves: on every pass, the call after the
    blocked step raises the blocked step's error without running, and the journal holds no step past it."""
    effects: list[str] = []
    journal = tmp_path / "runs.db"

    @durable.tool(idempotent=False, approval=blocked == "held for approval")
    def pay() -> str:
        effects.append("pay")
        raise ConnectionError("reply lost")

    @durable.tool(idempotent=False)
    def notify() -> str:
        effects.append("notify")
        return "sent"

    def one_pass() -> list[str]:
        said: list[str] = []
        with durable.run("r", journal=journal):
            for call in (pay, notify):
                try:
                    call()
                    said.append("ran")
                except Exception as exc:  # the application's catch-all
                    said.append(type(exc).__name__)
        return said

    error = "UncertainEffect" if blocked == "uncertain" else "ApprovalRequired"
    passes = [one_pass() for _ in range(3)]

    assert [[error, error]] * 3 == passes
    assert (["pay"] if blocked == "uncertain" else []) == effects
    state = "uncertain" if blocked == "uncertain" else "awaiting_approval"
    assert [("step-0", state)] == _states(journal, "r")


class _NoStr(str):
    """A str subclass (a key type of some ORM or enum library) whose ``str()`` raises."""

    def __str__(self) -> str:
        raise ValueError("no str for this key")


def test_a_result_the_journal_refuses_whose_second_reading_raises_is_said_to_be_unrecordable(tmp_path: Path) -> None:
    """A tool returns a result holding a NaN (which the journal refuses) and, further on, a dict key whose
    ``str()`` raises. Its effect is made and it answered: the outcome is unknown because its answer cannot
    be recorded. The walk that names what cannot be recorded read the value again and raised, and the step
    was recorded as if the tool itself had raised (``outcome unknown: ValueError: ...``), which tells the
    operator deciding it the wrong story (a tool that raised may well have done nothing). Proves: the
    caller gets ``UncertainEffect`` and the recorded reason says the result cannot be recorded and why."""
    effects: list[str] = []

    @durable.tool(idempotent=False)
    def quote() -> dict[str, Any]:
        effects.append("quote")
        return {"price": float("nan"), "tags": {_NoStr("k"): 1}}

    said = ""
    with durable.run("r", journal=tmp_path / "runs.db"):
        try:
            quote()
        except Exception as exc:
            said = f"{type(exc).__name__}: {exc}"

    done = effectlog("status", "--journal", "runs.db", "--run-id", "r", "--json", cwd=tmp_path)
    (step,) = json.loads(done.stdout)["at_stake"]
    assert said.startswith("UncertainEffect"), said
    assert ["quote"] == effects
    assert "uncertain" == step["state"]
    assert step["reason"].startswith("outcome unknown: the tool's result cannot be recorded: "), step["reason"]
    assert "nan is not a finite number" in step["reason"], step["reason"]


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (lambda: b"\xff\xfe", "UnicodeDecodeError"),  # bytes read off a socket, not UTF-8
        (lambda: {"on_done": print}, "PydanticSerializationError"),  # a callback handed back
    ],
    ids=["non-utf8-bytes", "a-function"],
)
def test_a_pydantic_ai_tools_answer_pydantic_cannot_serialise_is_said_to_be_unrecordable(
    tmp_path: Path, answer: Callable[[], Any], said: str
) -> None:
    """A pydantic-ai tool makes its effect and answers with something pydantic cannot turn into JSON. The
    integration converted the answer inside the call, so the failed conversion was recorded as the tool's
    own exception (``outcome unknown: UnicodeDecodeError: ...``): an operator reading it would think the
    tool failed, perhaps before its effect. Proves: the run stops with ``UncertainEffect``, one effect, and
    the recorded reason says the tool's result cannot be recorded, naming the tool and what pydantic said."""
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from effectlog.errors import UncertainEffect
    from effectlog.integrations.pydantic_ai import DurableAgent
    from effectlog.session import SqliteCheckpointer

    effects: list[str] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if not any(isinstance(m, ModelResponse) for m in messages):
            return ModelResponse(parts=[ToolCallPart("fetch", {"url": "u"}, tool_call_id="a")])
        return ModelResponse(parts=[TextPart("done")])

    agent: Agent[None, str] = Agent(FunctionModel(model), output_type=str)

    @agent.tool_plain
    def fetch(url: str) -> Any:
        effects.append(url)
        return answer()

    with pytest.raises(UncertainEffect):
        DurableAgent(agent, journal=tmp_path / "runs.db").run_sync("go", run_id="r")

    store = SqliteCheckpointer(tmp_path / "runs.db")
    step = store.state("r").step("tool-1-a")
    store.close()
    assert ["u"] == effects
    assert step is not None
    assert "uncertain" == step.state
    prefix = "outcome unknown: the tool's result cannot be recorded: the result of tool 'fetch': "
    assert step.reason.startswith(prefix + said), step.reason


@pytest.mark.parametrize(
    ("head", "encoding", "said"),
    [
        (b"\xef\xbb\xbf", "utf-8", "starts with a UTF-8 byte order mark (U+FEFF)"),  # Notepad's "UTF-8 with BOM"
        (b"\xff\xfe", "utf-16-le", "is UTF-16 text (byte order mark FF FE)"),  # PowerShell's `>` redirect
    ],
    ids=["utf8-bom", "utf16"],
)
def test_a_plan_saved_with_a_byte_order_mark_is_refused_saying_so(
    tmp_path: Path, head: bytes, encoding: str, said: str
) -> None:
    """A plan saved by a Windows editor with a byte order mark, or as UTF-16 by a shell redirect, looks right
    in every editor. It was refused as "not valid JSON (... invalid character (byte 0))" or "not UTF-8
    (byte 0)", which names a place the user cannot see anything wrong at. Proves: exit 2, one line naming
    the file and the mark, and no journal created."""
    text = json.dumps({"run_id": "r", "adapters": {"n": {"type": "noop"}}, "steps": [{"id": "a", "adapter": "n"}]})
    (tmp_path / "plan.json").write_bytes(head + text.encode(encoding))

    done = effectlog("run", "plan.json", "--journal", "j.db", cwd=tmp_path)

    assert 2 == done.returncode, done.stderr
    assert [f"effectlog: bad_plan: plan.json: {said}, which JSON does not allow: save it as UTF-8 without one"] == (
        done.stderr.splitlines()
    )
    assert ["plan.json"] == sorted(p.name for p in tmp_path.iterdir())


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def test_a_durable_result_nested_as_deep_as_the_check_allows_is_recorded_or_uncertain_never_a_raw_error(
    tmp_path: Path,
) -> None:
    """A durable tool returns the deepest nesting the recordability check accepts where the tool returns
    (found by trying, from the tool's own frame). The check ran a few frames above the journal's encoder,
    which nests the answer in its event and runs some frames deeper: the answer passed, then the journal's
    write raised a bare ``RecursionError`` to the application, with the step left requested and nothing
    recorded, so a caught one let the next call run past the step in doubt. Proves: no ``RecursionError``
    reaches the block; either the answer is recorded (and the next call runs) or the step is uncertain,
    the caller gets ``UncertainEffect`` and the next call runs nothing."""
    from effectlog.recordable import why_unrecordable

    effects: list[str] = []

    @durable.tool(idempotent=False)
    def fetch() -> Any:
        effects.append("fetch")
        depth = 1200
        while why_unrecordable(_nested(depth)) is not None:
            depth -= 1
        return _nested(depth)

    @durable.tool(idempotent=False)
    def after() -> str:
        effects.append("after")
        return "ok"

    said: list[str] = []
    with durable.run("r", journal=tmp_path / "runs.db"):
        for call in (fetch, after):
            try:
                call()
                said.append("ran")
            except Exception as exc:
                said.append(type(exc).__name__)

    states = _states(tmp_path / "runs.db", "r")
    assert (said, effects, states) in (
        (["ran", "ran"], ["fetch", "after"], [("step-0", "confirmed"), ("step-1", "confirmed")]),
        (["UncertainEffect", "UncertainEffect"], ["fetch"], [("step-0", "uncertain")]),
    )


def _paying_gateway(effects: list[str]) -> Any:
    """A gateway offering one non-idempotent tool ``pay`` (it appends to ``effects``) and no model."""
    from effectlog.session import Toolbox, ToolboxGateway

    tools = Toolbox()

    @tools.tool(idempotent=False)
    def pay() -> str:
        effects.append("pay")
        return "paid"

    class Gateway(ToolboxGateway):
        async def complete(self, body: Any, *, idempotency_key: str) -> dict[str, Any]:
            raise AssertionError("no model call in this test")

    return Gateway(model="m", tools=tools)


NAMES_NO_OPTION_TAKES = ["order 42 ", " order 42", "order\t42", "order\u200b42", "order 42\n"]


@pytest.mark.parametrize("name", NAMES_NO_OPTION_TAKES)
def test_a_run_id_the_cli_cannot_name_is_refused_before_anything_is_written(tmp_path: Path, name: str) -> None:
    """A durable run id with surrounding spaces, a tab, a zero-width character or a newline (a form field, an
    f-string's stray space) was taken as given. When its step became uncertain the printed ``effectlog
    reconcile --run-id 'order 42 '`` was refused by the CLI itself (surrounding spaces and unprintable
    characters are not an id there), so the run could never be reconciled and stayed stopped for good.
    Proves: the API refuses such a run id with ``BadInput`` naming it, before the tool runs, and the journal
    holds no run."""
    from effectlog.errors import BadInput
    from effectlog.session import Session, SqliteCheckpointer

    effects: list[str] = []
    journal = tmp_path / "runs.db"
    gateway = _paying_gateway(effects)

    store = SqliteCheckpointer(journal)

    async def call() -> Any:
        return await Session(name, gateway, store).tool("pay")

    try:
        with pytest.raises(BadInput, match="no command can name it") as refused:
            asyncio.run(call())
        written = store.state(name).seq
    finally:
        store.close()

    assert repr(name) in str(refused.value)
    assert ([], 0) == (effects, written)


@pytest.mark.parametrize("name", NAMES_NO_OPTION_TAKES)
def test_a_step_key_no_step_option_takes_is_named_by_the_printed_command_which_works(tmp_path: Path, name: str) -> None:
    """Step keys are any text on purpose (a model's tool-call id becomes one:
    test_attack_round9.py::test_pydantic_tool_call_ids_with_odd_characters_are_each_one_step_run_once), but
    ``--step`` refuses surrounding spaces and unprintable characters, so the approve command ``status``
    printed for a step keyed ``'order 42 '`` was refused by the CLI: the held call could never be decided,
    the run never finished. Proves: the printed command names such a step with ``--step-json`` (a JSON
    string), works as printed, and the next pass runs the call once and completes."""
    import shlex

    from effectlog.errors import ApprovalRequired
    from effectlog.session import Session, SqliteCheckpointer

    effects: list[str] = []
    journal = tmp_path / "runs.db"
    gateway = _paying_gateway(effects)

    def one_pass() -> Any:
        async def go() -> Any:
            with SqliteCheckpointer(journal) as store:
                session = Session("r", gateway, store, policy=lambda c: "require_approval")
                return await session.tool("pay", key=name)

        return asyncio.run(go())

    with pytest.raises(ApprovalRequired):
        one_pass()
    status = effectlog("status", "--journal", str(journal), "--run-id", "r", "--json", cwd=tmp_path)
    command = json.loads(status.stdout)["at_stake"][0]["command"]
    done = effectlog(*shlex.split(command.replace("NAME", "ann"))[1:], cwd=tmp_path)

    assert (True, 0, "") == ("--step-json " in command, done.returncode, done.stderr), command
    assert ("paid", ["pay"]) == (one_pass(), effects)

"""Durable tools for plain Python: one decorator, one ``with`` block, the session's step machine.

::

    from effectlog import durable

    @durable.tool(idempotent=False)
    def send_email(to: str, body: str, idempotency_key: str = "") -> str: ...

    with durable.run("onboard-42", journal="runs.db") as run:
        send_email("a@b.example", "hi")   # a journaled step: write-ahead intent, recorded result
        run.finish("welcomed")            # optional: the run's result (default: None at the block's end)

Inside a run, each call of a durable tool is one tool step of a ``Session`` (the same
driver, events, fold and CLI as an agent's tool calls): its intent is durable before the
function runs and its result durable before the call returns. Running the block again
with the same run id resumes the run: recorded calls return their recorded results
without running, the first unrecorded call runs. Outside a run a durable tool is an
error (``NotInRun``); ``fn.__wrapped__`` is the plain, unjournaled function. See
docs/integrations.md.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import os
import threading
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar, overload

import msgspec

from effectlog.errors import AdapterNotFound, BadInput, NotApplied, NotInRun
from effectlog.journal import Journal, open_journal
from effectlog.journal.sidecars import is_postgres
from effectlog.notify import Notifier
from effectlog.plan import own_copy
from effectlog.recorder import Clock
from effectlog.session.durable import Session
from effectlog.session.steps import Decision, Policy, Reconciled, ToolCall, allow_all
from effectlog.session.store import Checkpointer, JournalCheckpointer, SqliteCheckpointer
from effectlog.session.timing import Sleeper
from effectlog.session.tools import KEY_PARAMETER, ToolInfo

__all__ = [
    "NotInRun",
    "Reconciled",
    "Run",
    "Tool",
    "current",
    "idempotency_key",
    "run",
    "sleep",
    "sleep_until",
    "tool",
]

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

Approval = bool | Callable[[ToolCall], bool]

_current: contextvars.ContextVar[Run | None] = contextvars.ContextVar("effectlog_durable_run", default=None)
_key: contextvars.ContextVar[str | None] = contextvars.ContextVar("effectlog_durable_key", default=None)
# The run whose tool body is running in this context: new tasks and new loops copy it, so a durable call
# made from inside a tool's body is seen as one however it got there (asyncio.run, gather, create_task).
_inside: contextvars.ContextVar[Run | None] = contextvars.ContextVar("effectlog_durable_inside", default=None)


def current() -> Run:
    """The durable run whose block encloses this code (``NotInRun`` outside every block)."""
    run = _current.get()
    if run is None:
        raise NotInRun("durable.current() asked outside a durable.run block")
    return run


def idempotency_key() -> str:
    """The idempotency key of the durable tool call running now (for a tool without the parameter)."""
    key = _key.get()
    if key is None:
        raise NotInRun("idempotency_key() asked outside a durable tool call")
    return key


class Tool(msgspec.Struct, frozen=True, kw_only=True):
    """One durable tool's declaration: what the step machine needs to know about the function."""

    fn: Callable[..., Any]
    info: ToolInfo
    signature: inspect.Signature  # the function's, with the key parameter
    call_signature: inspect.Signature  # what a caller passes: without the key parameter
    wants_key: bool
    is_async: bool
    approval: Approval = False
    timeout_s: float | None = None
    retry: int = 0
    on_reconciled: Callable[[Reconciled], Any] | None = None

    def needs_approval(self, call: ToolCall) -> bool:
        return self.approval(call) if callable(self.approval) else bool(self.approval)

    def bind(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The call's arguments by parameter name, defaults applied: what the journal fingerprints."""
        if KEY_PARAMETER in kwargs:
            raise BadInput(
                f"durable tool {self.info.name!r}: {KEY_PARAMETER} is given by effectlog (stable per step), "
                "not by the caller"
            )
        bound = self.call_signature.bind(*args, **kwargs)  # a TypeError, as for any wrong call
        bound.apply_defaults()
        return dict(bound.arguments)

    def call_args(self, arguments: Mapping[str, Any], key: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
        full = {**arguments, KEY_PARAMETER: key} if self.wants_key else dict(arguments)
        bound = inspect.BoundArguments(self.signature, full)
        return bound.args, bound.kwargs


@overload
def tool(fn: F, /, *, idempotent: bool, name: str | None = None) -> F: ...


@overload
def tool(
    fn: None = None,
    /,
    *,
    idempotent: bool,
    name: str | None = None,
    approval: Approval = False,
    timeout_s: float | None = None,
    retry: int = 0,
    on_reconciled: Callable[[Reconciled], Any] | None = None,
) -> Callable[[F], F]: ...


def tool(fn: F | None = None, /, **options: Any) -> F | Callable[[F], F]:
    """Declare a durable tool: ``@durable.tool(idempotent=...)`` on a sync or async function.

    - ``idempotent`` (required): may a call whose outcome is unknown be sent again with the
      same key? ``False`` stops the run as uncertain instead (``UncertainEffect``).
    - ``name``: the step's tool name in the journal (default: the function's ``__name__``).
    - ``approval``: ``True``, or a predicate on the ``ToolCall``: the call waits for a person
      (``ApprovalRequired``, approve with the CLI, run the block again).
    - ``timeout_s`` (async tools only): past it the outcome is unknown, as for any exception.
    - ``retry`` (idempotent tools only): tries again within the call, same key, on an exception
      other than ``NotApplied``.
    - ``on_reconciled``: the value a call returns when an operator reconciled it as applied
      (default: the ``Reconciled`` record as a dict).

    The function receives ``idempotency_key`` if it has a parameter of that name.
    """

    def declare(f: F) -> F:
        decl = _declare(f, **options)
        if decl.is_async:

            @functools.wraps(f)
            async def call_async(*args: Any, **kwargs: Any) -> Any:
                return await _active(decl).call(decl, args, kwargs)

            call_async.__effectlog_tool__ = decl  # type: ignore[attr-defined]
            return call_async  # type: ignore[return-value]

        @functools.wraps(f)
        def call(*args: Any, **kwargs: Any) -> Any:
            return _drive_now(_active(decl).call(decl, args, kwargs))

        call.__effectlog_tool__ = decl  # type: ignore[attr-defined]
        return call  # type: ignore[return-value]

    return declare(fn) if fn is not None else declare


def _declare(
    fn: Callable[..., Any],
    *,
    idempotent: bool,
    name: str | None = None,
    approval: Approval = False,
    timeout_s: float | None = None,
    retry: int = 0,
    on_reconciled: Callable[[Reconciled], Any] | None = None,
) -> Tool:
    tool_name = name or getattr(fn, "__name__", "")
    where = f"durable tool {tool_name!r}"
    if not isinstance(idempotent, bool):
        raise BadInput(f"{where} must declare idempotent=True or idempotent=False")
    if not tool_name:
        raise BadInput("a durable tool needs a name")
    if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
        raise BadInput(
            f"{where} is a generator function: a call runs none of its body and returns a generator, which "
            "no journal can hold; make it return its values (a list) instead"
        )
    # An object with an ``async def __call__`` (a configured client) is as async as a coroutine function.
    is_async = inspect.iscoroutinefunction(fn) or (
        callable(fn) and not inspect.isroutine(fn) and inspect.iscoroutinefunction(type(fn).__call__)
    )
    if timeout_s is not None:
        if not is_async:
            raise BadInput(
                f"{where}: timeout_s needs an async function (Python cannot interrupt a running sync one); "
                "give the client you call its own timeout instead"
            )
        if not (isinstance(timeout_s, int | float) and 0 < timeout_s < float("inf")):
            raise BadInput(f"{where}: timeout_s must be a positive number of seconds, not {timeout_s!r}")
    if not isinstance(retry, int) or isinstance(retry, bool) or retry < 0:
        raise BadInput(f"{where}: retry must be a count >= 0, not {retry!r}")
    if retry and not idempotent:
        raise BadInput(f"{where}: retry needs idempotent=True (a call with an unknown outcome is never repeated)")
    signature = inspect.signature(fn)
    wants_key = KEY_PARAMETER in signature.parameters
    params = [p for p in signature.parameters.values() if p.name != KEY_PARAMETER]
    return Tool(
        fn=fn,
        info=ToolInfo(name=tool_name, idempotent=idempotent, description=inspect.getdoc(fn) or ""),
        signature=signature,
        call_signature=signature.replace(parameters=params),
        wants_key=wants_key,
        is_async=is_async,
        approval=approval,
        timeout_s=timeout_s,
        retry=retry,
        on_reconciled=on_reconciled,
    )


def _active(decl: Tool) -> Run:
    current = _current.get()
    if current is None:
        plain = getattr(decl.fn, "__name__", decl.info.name)  # a callable object has no __name__
        raise NotInRun(
            f"durable tool {decl.info.name!r} was called outside a durable.run block; wrap the calls in "
            f"`with durable.run(RUN_ID, journal=...)`, or call {plain}.__wrapped__ for a plain, "
            "unjournaled call"
        )
    return current


def _drive_now(coro: Coroutine[Any, Any, T]) -> T:
    """Run a step of a sync tool to its end in the calling thread, inside or outside an event loop.

    The step machine is written once, as coroutines; with a sync function behind it nothing
    in it ever suspends, so one ``send`` runs it to the end.
    """
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coro.close()
    raise RuntimeError("a sync durable tool's step suspended; this is a bug in effectlog")


class _Pending(msgspec.Struct, frozen=True):
    decl: Tool
    arguments: dict[str, Any]  # as the caller passed them, not JSON-normalized


class _RunGateway:
    """The session's gateway for a ``durable.run``: the tool half calls the pending function."""

    model = ""

    def __init__(self, run: Run) -> None:
        self._run = run

    def tool(self, name: str) -> ToolInfo:
        pending = self._run._pending
        if pending is None or pending.decl.info.name != name:
            raise AdapterNotFound(f"no durable tool {name!r} is being called")
        return pending.decl.info

    def tools(self) -> Sequence[ToolInfo]:
        return []

    async def complete(self, body: Mapping[str, Any], *, idempotency_key: str) -> dict[str, Any]:
        raise BadInput("a durable.run block makes no model calls; use effectlog.session for agent loops")

    async def call_tool(self, name: str, args: Mapping[str, Any], *, idempotency_key: str) -> Any:
        pending = self._run._pending
        assert pending is not None
        token = _inside.set(self._run)
        try:
            return await _invoke(pending, idempotency_key)
        finally:
            _inside.reset(token)


async def _invoke(pending: _Pending, key: str) -> Any:
    """Call the function (retrying an idempotent one with the same key), the key visible to it."""
    decl = pending.decl
    token = _key.set(key)
    try:
        for tries_left in range(decl.retry, -1, -1):
            # Each try gets its own copy of the arguments as called: the journal fingerprinted them, a retry
            # sends the same key, and a resumed pass (which does not call the function) leaves the caller's
            # objects as they were.
            args, kwargs = decl.call_args(own_copy(pending.arguments), key)
            try:
                if not decl.is_async:
                    return decl.fn(*args, **kwargs)
                if decl.timeout_s is None:
                    return await decl.fn(*args, **kwargs)
                return await asyncio.wait_for(decl.fn(*args, **kwargs), decl.timeout_s)
            except Exception as exc:
                if tries_left == 0 or isinstance(exc, NotApplied):
                    raise
                pause = min(0.05 * 2 ** (decl.retry - tries_left), 2.0)
                if decl.is_async:
                    await asyncio.sleep(pause)
                else:
                    time.sleep(pause)
        raise AssertionError("unreachable")
    finally:
        _key.reset(token)


JournalLike = str | os.PathLike[str] | Journal | Checkpointer


def _store(journal: JournalLike) -> tuple[Checkpointer, bool]:
    """The checkpointer for ``journal`` and whether this run opened it (and so closes it)."""
    if isinstance(journal, str) and is_postgres(journal):
        return JournalCheckpointer(open_journal(journal)), True
    if isinstance(journal, str | os.PathLike):
        return SqliteCheckpointer(journal), True
    if isinstance(journal, Checkpointer):
        return journal, False
    return JournalCheckpointer(journal), False


class Run:
    """One pass of a durable run: ``with durable.run(...) as run`` or ``async with``.

    Entering reads the run; its first write claims it for this process (``RunOwned``,
    exit 6, if another drives it) and leaving the block releases it. Leaving normally
    completes a run still open, with ``run.finish(result)``'s result or ``None``;
    leaving on an exception, or with a call whose exception the block caught and whose
    outcome is so unknown, leaves the run open (or suspended, or stopped), so running
    the block again resumes it. ``run.fail(reason)`` closes it as failed.
    """

    def __init__(
        self,
        run_id: str,
        *,
        journal: JournalLike,
        policy: Policy | None = None,
        clock: Clock | None = None,
        deadline: float | None = None,
        sleeper: Sleeper | None = None,
        notify: Notifier | Sequence[Notifier] | None = None,
    ) -> None:
        if not run_id:
            raise BadInput("a durable run needs a run id")
        self._deadline = deadline
        self._sleeper = sleeper
        self._notify = notify
        self.run_id = run_id
        self._journal = journal
        self._policy: Policy = policy or allow_all
        self._clock = clock
        self._session: Session | None = None
        self._store: Checkpointer | None = None
        self._owns_store = False
        self._token: contextvars.Token[Run | None] | None = None
        self._pending: _Pending | None = None  # the call in flight: steps never overlap
        self._holder: asyncio.Task[Any] | None = None  # the task making it, when async
        self._queued = 0  # async calls waiting for or holding their turn
        self._thread = 0  # the thread that entered the block: the only one that may call its tools
        self._origins: dict[str, str] = {}  # tool name -> the function declared under it
        self._lock: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None

    # -- the block -------------------------------------------------------------------------

    def __enter__(self) -> Run:
        if self._session is not None:
            raise BadInput(f"durable run {self.run_id!r} is already entered; open a new durable.run to resume it")
        self._store, self._owns_store = _store(self._journal)
        try:
            self._session = Session(
                self.run_id,
                _RunGateway(self),
                self._store,
                policy=self._decide,
                clock=self._clock,
                replay_closed=True,
                deadline=self._deadline,
                sleeper=self._sleeper,
                notify=self._notify,
            )
        except BaseException:
            self._close_store()
            raise
        self._token = _current.set(self)
        self._thread = threading.get_ident()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        session = self.session
        try:
            if exc is None and session.state.state in ("created", "running") and not session.unsettled:
                session.finish(None)  # a step left unsettled (its exception caught) keeps the run open
        finally:
            session.release()
            if self._token is not None:
                _current.reset(self._token)
                self._token = None
            self._close_store()

    async def __aenter__(self) -> Run:
        return self.__enter__()

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.__exit__(kind, exc, tb)

    def _close_store(self) -> None:
        if self._owns_store and self._store is not None:
            self._store.close()
        self._owns_store = False

    # -- what the block asks of the run ----------------------------------------------------

    @property
    def session(self) -> Session:
        if self._session is None:
            raise NotInRun(f"durable run {self.run_id!r} is used outside its with block")
        return self._session

    @property
    def completed(self) -> bool:
        return self.session.completed

    @property
    def result(self) -> Any:
        """The recorded result of a completed run (``None`` otherwise)."""
        return self.session.result

    @property
    def tool_calls(self) -> int:
        """Tool functions this pass really called (recorded calls that only replayed not counted)."""
        return self.session.tool_calls

    def finish(self, result: Any = None) -> Any:
        """Complete the run with ``result`` (JSON); a completed run keeps the result it recorded."""
        return self.session.finish(result)

    def fail(self, reason: str) -> None:
        """Close the run as failed: running the block again raises ``RunFailed``."""
        self.session.fail(reason)

    # -- durable sleep -----------------------------------------------------------------------

    def _not_inside_a_tool(self, what: str) -> None:
        """A step made from a tool's body follows the tool's own, which a resume skips when recorded."""
        if _inside.get() is self:
            busy = self._pending.decl.info.name if self._pending is not None else "a durable tool"
            raise BadInput(
                f"durable {what} was called inside {busy!r} in run {self.run_id!r}: a step may not be made "
                "from a durable tool's body (sleep in the block, before or after the call)",
                run_id=self.run_id,
            )

    def sleep(self, seconds: float) -> None:
        """Sleep ``seconds`` as a journaled step: a resumed block waits only what is left of it."""
        session = self.session
        self._not_inside_a_tool("sleep")
        _drive_now(session.sleep(seconds, sleeper=self._sync_sleeper()))

    def sleep_until(self, t: float) -> None:
        """Sleep until the POSIX time ``t`` as a journaled step."""
        session = self.session
        self._not_inside_a_tool("sleep_until")
        _drive_now(session.sleep_until(t, sleeper=self._sync_sleeper()))

    async def sleep_async(self, seconds: float) -> None:
        """``sleep`` for an ``async with`` block: waits with ``asyncio.sleep`` (or the run's sleeper)."""
        self._not_inside_a_tool("sleep_async")
        await self.session.sleep(seconds)

    async def sleep_until_async(self, t: float) -> None:
        self._not_inside_a_tool("sleep_until_async")
        await self.session.sleep_until(t)

    def _sync_sleeper(self) -> Sleeper:
        given = self._sleeper
        if given is None:
            return time.sleep

        def wait(seconds: float) -> None:
            if given(seconds) is not None:
                raise BadInput("a sync durable sleep needs a sleeper that returns None (use sleep_async)")

        return wait

    # -- one tool call -----------------------------------------------------------------------

    def _decide(self, call: ToolCall) -> Decision:
        verdict = self._policy(call)
        pending = self._pending
        if verdict == "allow" and pending is not None and pending.decl.needs_approval(call):
            return "require_approval"
        return verdict

    async def call(self, decl: Tool, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        """One call of a durable tool as one tool step of this run's session.

        Steps never overlap: positional step ids must not depend on scheduling. Async calls
        made together (``asyncio.gather``) wait their turn in the order they were made; a sync
        call cannot wait, so it is refused while another call is in flight, and so is a
        durable tool called from inside another one's body.
        """
        session = self.session
        if threading.get_ident() != self._thread:
            raise BadInput(
                f"durable tool {decl.info.name!r} was called from another thread than the one that entered run "
                f"{self.run_id!r}: steps of a run must not race (call it in that thread, or await an async tool)",
                run_id=self.run_id,
            )
        self._check_one_function(decl)
        arguments = decl.bind(args, kwargs)
        if _inside.get() is self:
            # From a tool's body (a new loop or task of it included): its own step would follow the outer
            # one, which a resume skips when recorded, so a later call would take the inner call's step.
            busy = self._pending.decl.info.name if self._pending is not None else "another durable tool"
            raise BadInput(
                f"durable tool {decl.info.name!r} was called from inside {busy!r} in run {self.run_id!r}: "
                "steps of a run never overlap, and a durable tool may not call another (call the inner "
                "one's __wrapped__, or call both from the block)",
                run_id=self.run_id,
            )
        if not decl.is_async or (self._pending is not None and self._holder is asyncio.current_task()):
            if self._pending is not None or self._queued:
                busy = self._pending.decl.info.name if self._pending is not None else "an async tool"
                raise BadInput(
                    f"durable tool {decl.info.name!r} was called while {busy!r} is still running in the same run: "
                    "steps of a run never overlap (a sync call cannot wait its turn, and a durable tool may not "
                    "call another)",
                    run_id=self.run_id,
                )
            return await self._step(session, decl, arguments)
        self._queued += 1
        try:
            async with self._turn():
                return await self._step(session, decl, arguments)
        finally:
            self._queued -= 1

    def _check_one_function(self, decl: Tool) -> None:
        """A tool name is what the journal recognises a step by: two functions under one name would swap results."""
        fn = decl.fn  # a callable object has no __qualname__ of its own: its class names it
        origin = f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', type(fn).__qualname__)}"
        known = self._origins.setdefault(decl.info.name, origin)
        if known != origin:
            raise BadInput(
                f"durable tools {known} and {origin} are both named {decl.info.name!r} in one run; "
                "give one of them another name= (the journal tells steps apart by tool name and arguments)",
                run_id=self.run_id,
            )

    def _turn(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        if self._lock is None or self._lock[0] is not loop:  # a lock serves one event loop
            self._lock = (loop, asyncio.Lock())
        return self._lock[1]

    async def _step(self, session: Session, decl: Tool, arguments: dict[str, Any]) -> Any:
        self._pending = _Pending(decl, arguments)
        self._holder = asyncio.current_task() if decl.is_async else None
        try:
            value = await session.tool(decl.info.name, arguments)
        finally:
            self._pending = None
            self._holder = None
        if isinstance(value, Reconciled):
            return decl.on_reconciled(value) if decl.on_reconciled is not None else msgspec.to_builtins(value)
        return value


def run(
    run_id: str,
    *,
    journal: JournalLike,
    policy: Policy | None = None,
    clock: Clock | None = None,
    deadline: float | None = None,
    sleeper: Sleeper | None = None,
    notify: Notifier | Sequence[Notifier] | None = None,
) -> Run:
    """Run or resume ``run_id`` in ``journal`` (a SQLite path, a ``postgresql://`` URL, a Journal or a Checkpointer).

    ``policy`` is asked before each new call (allow, deny or require_approval), before a
    tool's own ``approval``. ``deadline`` (a POSIX time, pinned in the journal by the first
    pass): a call not begun by then fails the run (``DeadlinePassed``). ``sleeper`` waits the
    run's durable sleeps (default ``time.sleep``/``asyncio.sleep``; a test injects one). ``notify``:
    hook(s) called once when the run suspends for approval or stops on an uncertain call
    (``effectlog.notify``).
    """
    return Run(run_id, journal=journal, policy=policy, clock=clock, deadline=deadline, sleeper=sleeper, notify=notify)


def sleep(seconds: float) -> None:
    """Durable sleep in the enclosing ``durable.run`` block (``run.sleep``)."""
    current().sleep(seconds)


def sleep_until(t: float) -> None:
    """Durable sleep until the POSIX time ``t`` in the enclosing ``durable.run`` block."""
    current().sleep_until(t)

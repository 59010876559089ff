"""Plans: a finite, pinned list of steps, validated with msgspec.

Every error names the JSON path (``steps[3].adapter: unknown adapter 'ledgr'``).
A plan's canonical digest (sha256 of its canonical JSON) is pinned in
``run.started``; re-running a run id with another plan is a conflict.
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
import stat
import weakref
from pathlib import Path
from typing import Any, Literal

import msgspec

from effectlog.canonical import canonical_json, digest, digest_bytes, trusted_json
from effectlog.errors import BadInput, PlanError

ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$"  # as JSON Schema writes it
# Matched whole with ``fullmatch``: Python's ``$`` also matches before a final newline ("r1\n").
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}")
MAX_ARGS_BYTES = 1 << 20  # 1 MiB of canonical JSON per step's args, by default
MAX_PLAN_BYTES = 64 << 20  # 64 MiB: a plan file larger than this is refused unread (--max-plan-bytes)
MAX_DEPTH = 32
MAX_SAFE_INT = 2**53 - 1  # beyond this, JSON numbers are not portable across languages


class RetryPolicy(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Automatic re-sends of the same key; only for idempotent adapters."""

    attempts: int = 3  # total sends, the first included
    backoff_base_s: float = 0.05
    backoff_cap_s: float = 2.0
    jitter: float = 0.5  # fraction of the delay drawn at random (0 = none, 1 = full jitter)


class AdapterDecl(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """An adapter the plan uses: its type (from the registry), version, and declared contract."""

    type: str
    version: str = "1"
    idempotent: bool = False
    options: dict[str, Any] = {}


class StepDecl(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    id: str
    adapter: str
    args: dict[str, Any] = {}
    approval: Literal["required"] | None = None
    timeout_s: float | None = None
    retry: RetryPolicy | None = None
    secret: tuple[str, ...] = ()  # names of args stored only as digests (journal, traces, output)


class Plan(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, weakref=True):
    run_id: str
    adapters: dict[str, AdapterDecl]
    steps: tuple[StepDecl, ...]

    def step(self, step_id: str) -> StepDecl:
        for s in self.steps:
            if s.id == step_id:
                return s
        raise KeyError(step_id)

    @property
    def digest(self) -> str:
        """The canonical digest of ``pinned()``: computed once per ``Plan`` object (it is frozen)."""
        return _derived(self).digest

    def pinned(self) -> dict[str, Any]:
        """The plan as recorded in ``run.started``: secret args replaced by their digests.

        Built once per ``Plan`` object and shared: treat it as read-only.
        """
        return _derived(self).pinned

    @property
    def positions(self) -> dict[str, int]:
        """Each step id's position in ``steps``, once per ``Plan`` object (treat it as read-only)."""
        return _derived(self).positions

    @property
    def step_ids(self) -> frozenset[str]:
        """The ids of the plan's steps (what the fold's ``plan_steps`` holds), once per ``Plan`` object."""
        return _derived(self).step_ids


class _Derived:
    """What a ``Plan`` object derives from itself (a 66k-step plan's digest costs ~60 ms CPU): kept
    beside it for as long as it lives, keyed by identity (a plan holds dicts, so it is not hashable)."""

    __slots__ = ("digest", "pinned", "positions", "step_ids")

    def __init__(self, plan: Plan) -> None:
        raw: dict[str, Any] = msgspec.to_builtins(plan)
        # As JSON gives them back (run.started decoded): lists, so a resumed state equals a replayed one.
        raw["steps"] = list(raw["steps"])
        for decl, step in zip(plan.steps, raw["steps"], strict=True):
            step["secret"] = list(step["secret"])
            for name in decl.secret:
                if name in step.get("args", {}):
                    step["args"][name] = {"$secret_sha256": digest(step["args"][name])}
        _refuse_non_finite(plan)
        self.pinned = raw
        self.digest = digest_bytes(trusted_json(raw))
        self.step_ids = frozenset(s.id for s in plan.steps)
        self.positions = {s.id: i for i, s in enumerate(plan.steps)}


def _refuse_non_finite(plan: Plan) -> None:
    """``BadInput`` if a value of the plan is NaN or an infinity, where it is: canonical JSON would record
    it as null, so the plan's digest would be another plan's. The plan's own values are its steps' args,
    retry times and timeouts and its adapters' options: checked there, not by a walk of the whole plan."""
    for name, decl in plan.adapters.items():
        if decl.options:
            canonical_json(decl.options, f"adapters.{name}.options")
    isfinite = math.isfinite
    for i, step in enumerate(plan.steps):
        if step.args:
            canonical_json(step.args, f"steps[{i}].args")
        if step.timeout_s is not None and not isfinite(step.timeout_s):
            raise BadInput(f"steps[{i}].timeout_s: {step.timeout_s!r} is not a finite number of seconds")
        retry = step.retry
        if retry is not None:
            for name in ("backoff_base_s", "backoff_cap_s", "jitter"):
                if not isfinite(getattr(retry, name)):  # NaN passes every range check of check_plan
                    raise BadInput(f"steps[{i}].retry: {name} must be a finite number")


_DERIVED: dict[int, tuple[weakref.ref[Plan], _Derived]] = {}


def _derived(plan: Plan) -> _Derived:
    key = id(plan)
    found = _DERIVED.get(key)
    if found is not None and found[0]() is plan:
        return found[1]
    derived = _Derived(plan)
    _DERIVED[key] = (weakref.ref(plan, lambda _, key=key: _DERIVED.pop(key, None)), derived)  # type: ignore[misc]
    return derived


def args_digest(step: StepDecl) -> str:
    return digest(step.args)


_ATOMS = frozenset({str, int, float, bool, type(None)})


def own_copy(args: dict[str, Any]) -> dict[str, Any]:
    """A copy of a call's args for one send, which the tool may edit in place: a tool's edits never reach
    the plan, the caller's objects or the next send of the same key (which must carry the body the journal
    digested), nor what secrets are redacted against. Args of JSON atoms only (most) are copied shallow;
    values ``deepcopy`` refuses stay shared below the top level."""
    atoms = _ATOMS
    for value in args.values():  # (a loop, not ``all`` over a generator: once per send)
        if type(value) not in atoms:
            break
    else:
        return dict(args)
    try:
        return copy.deepcopy(args)
    except Exception:
        return dict(args)


def redact(step: StepDecl, text: str) -> str:
    """``text`` (a tool's error message, say) with the step's secret arg values replaced by ``<secret NAME>``."""
    for name in step.secret:
        forms: set[str] = set()
        _secret_forms(step.args.get(name), forms)
        for form in sorted(forms, key=len, reverse=True):  # longest first: a value inside another stays hidden
            text = text.replace(form, f"<secret {name}>")
    return text


def _secret_forms(value: Any, forms: set[str]) -> None:
    """The ways a secret value may appear in text: each string or number in it, its JSON, its repr."""
    if isinstance(value, bool) or value is None:
        return
    if isinstance(value, dict | list):
        forms.add(canonical_json(value).decode())
        for item in value.values() if isinstance(value, dict) else value:
            _secret_forms(item, forms)
        return
    forms.update(f for f in (str(value), repr(value), canonical_json(value).decode()) if f)


def _path(loc: str) -> str:
    # msgspec says "at `$.steps[3].adapter`"; we say "steps[3].adapter"
    return loc.removeprefix("$").lstrip(".") or "plan"


_LOC = re.compile(r"^(?P<msg>.*?)(?: - at `(?P<loc>[^`]*)`)?$", re.S)


def _validation_message(exc: msgspec.ValidationError) -> str:
    m = _LOC.match(str(exc))
    assert m is not None
    loc = _path(m.group("loc") or "$")
    return f"{loc}: {m.group('msg').replace('`', '')}"


def _adapter_message(raw: Any, exc: msgspec.ValidationError) -> str | None:
    """msgspec locates a bad map value as ``adapters[...]``; name the adapter instead."""
    if "`$.adapters[...]" not in str(exc) or not isinstance(raw, dict) or not isinstance(raw["adapters"], dict):
        return None
    for name, value in raw["adapters"].items():
        try:
            msgspec.convert(value, AdapterDecl)
        except msgspec.ValidationError as inner:
            loc, _, msg = _validation_message(inner).partition(": ")
            return f"adapters.{name}{'' if loc == 'plan' else '.' + loc}: {msg}"
    return None


def parse_plan(data: bytes, origin: str = "plan", *, max_args_bytes: int = MAX_ARGS_BYTES) -> Plan:
    """Decode and validate a plan; raise ``PlanError`` naming ``origin`` and the JSON path."""
    mark = _byte_order_mark(data)
    if mark is not None:
        raise PlanError(f"{origin}: {mark}, which JSON does not allow: save it as UTF-8 without one")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PlanError(f"{origin}: not UTF-8 (byte {exc.start})") from None
    try:
        raw = _PLAN_JSON.decode(text.encode())
    except msgspec.DecodeError as exc:
        raise PlanError(f"{origin}: not valid JSON ({exc})") from None
    except RecursionError:  # nesting so deep the decoder gives up before our own depth check runs
        raise PlanError(f"{origin}: plan: nested deeper than {MAX_DEPTH} levels") from None
    _check_json_values(raw, origin, "", 0)
    # Bytes that are the encoding of what they decode to (a plan a store or a CLI wrote, as a fleet
    # runner reads every one) cannot hold a key twice in one object: an encoder writes a dict's keys
    # once each. Only other text takes the second, slower pass (~20 µs of a ~35 µs parse).
    if _ENCODER.encode(raw) != data:
        _refuse_duplicate_keys(text, origin)
    try:
        plan = msgspec.convert(raw, Plan)
    except msgspec.ValidationError as exc:
        raise PlanError(f"{origin}: {_adapter_message(raw, exc) or _validation_message(exc)}") from None
    check_plan(plan, origin, max_args_bytes=max_args_bytes)
    return plan


def _byte_order_mark(data: bytes) -> str | None:
    """What a byte order mark at the start of ``data`` says, if it has one. Editors show none of it (a
    Windows editor's "UTF-8 with BOM", PowerShell's UTF-16 ``>``), so "invalid character (byte 0)" named a
    place where the user sees nothing wrong."""
    if data.startswith(b"\xef\xbb\xbf"):
        return "starts with a UTF-8 byte order mark (U+FEFF)"
    for mark, name in ((b"\xff\xfe", "FF FE"), (b"\xfe\xff", "FE FF")):
        if data.startswith(mark):
            return f"is UTF-16 text (byte order mark {name})"
    return None


def is_valid_id(text: str) -> bool:
    """A run, step or adapter id: ``[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}``, the whole string."""
    return _ID.fullmatch(text) is not None


def load_plan(path: str | Path, *, max_args_bytes: int = MAX_ARGS_BYTES, max_plan_bytes: int = MAX_PLAN_BYTES) -> Plan:
    """Read and validate a plan file: a regular file of at most ``max_plan_bytes``.

    A FIFO, a device (``/dev/zero``) or a directory is refused before a byte is read, and
    a file is never read past the limit, so no input can block or exhaust memory here.
    """
    return parse_plan(read_plan_bytes(path, max_plan_bytes), str(path), max_args_bytes=max_args_bytes)


def _not_regular(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "Is a directory"
    kind = "a FIFO" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket"
    return f"{kind}, not a regular file"


def read_plan_bytes(path: str | Path, max_plan_bytes: int = MAX_PLAN_BYTES) -> bytes:
    try:
        # O_NONBLOCK: opening a FIFO with no writer would otherwise wait for ever.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise PlanError(f"{path}: cannot read the plan ({exc.strerror})") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise PlanError(f"{path}: cannot read the plan ({_not_regular(mode)})")
        os.set_blocking(fd, True)
        chunks: list[bytes] = []
        size = 0
        while size <= max_plan_bytes:
            chunk = os.read(fd, min(1 << 20, max_plan_bytes + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise PlanError(f"{path}: cannot read the plan ({exc.strerror})") from None
    finally:
        os.close(fd)
    if size > max_plan_bytes:
        raise PlanError(f"{path}: the plan is over the {max_plan_bytes}-byte limit (--max-plan-bytes N to raise it)")
    return b"".join(chunks)


# float_hook: an out-of-range number (1e999) decodes to inf, which the value check then
# reports with its JSON path, instead of msgspec's "Number out of range" with no usable path.
_PLAN_JSON = msgspec.json.Decoder(float_hook=float)
_ENCODER = msgspec.json.Encoder()


def _shown(value: str) -> str:
    """An id as an error message shows it: quoted, and cut short when it is long."""
    return repr(value) if len(value) <= 64 else f"{value[:32]!r}... ({len(value)} characters)"


def _check_json_values(value: Any, origin: str, where: str, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise PlanError(f"{origin}: {where or 'plan'}: nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, dict):
        for k, v in value.items():
            _check_json_values(v, origin, f"{where}.{k}" if where else k, depth + 1)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_json_values(v, origin, f"{where}[{i}]", depth + 1)
    elif isinstance(value, float) and not math.isfinite(value):
        raise PlanError(f"{origin}: {where}: NaN and Infinity are not JSON numbers")
    elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_SAFE_INT:
        raise PlanError(f"{origin}: {where}: integer beyond 2^53 cannot be hashed portably")


class _Keyed(dict[str, Any]):
    """A JSON object as the duplicate-key pass sees it: the first key given twice, if any."""

    duplicate: str | None = None


def _pairs(pairs: list[tuple[str, Any]]) -> _Keyed:
    obj = _Keyed()
    for key, value in pairs:
        if key in obj and obj.duplicate is None:
            obj.duplicate = key
        obj[key] = value
    return obj


def _refuse_duplicate_keys(text: str, origin: str) -> None:
    """JSON allows a key twice in one object and decoders keep the last; a plan must not.

    A second pass over text msgspec has already accepted (valid JSON, nesting checked), so
    only the duplicate is new here; it is named with its JSON path.
    """
    try:
        parsed = json.loads(text, object_pairs_hook=_pairs)
    except (ValueError, RecursionError) as exc:  # not expected after msgspec accepted it; still one line
        raise PlanError(f"{origin}: not valid JSON ({exc})") from None
    found = _first_duplicate(parsed, "")
    if found is not None:
        where, key = found
        raise PlanError(f"{origin}: {where or 'plan'}: key {key!r} appears more than once in one object")


def _first_duplicate(value: Any, where: str) -> tuple[str, str] | None:
    if isinstance(value, _Keyed):
        if value.duplicate is not None:
            return where, value.duplicate
        items: Any = ((f"{where}.{k}" if where else k, v) for k, v in value.items())
    elif isinstance(value, list):
        items = ((f"{where}[{i}]", v) for i, v in enumerate(value))
    else:
        return None
    for path, item in items:
        found = _first_duplicate(item, path)
        if found is not None:
            return found
    return None


def check_plan(plan: Plan, origin: str = "plan", *, max_args_bytes: int = MAX_ARGS_BYTES) -> None:
    """Checks msgspec's types cannot express: ids, references, uniqueness, contracts, sizes, finite numbers."""
    try:
        _refuse_non_finite(plan)  # NaN passes every range check below; canonical JSON records it as null
    except BadInput as exc:
        raise PlanError(f"{origin}: {exc.message}") from None
    if not _ID.fullmatch(plan.run_id):
        raise PlanError(f"{origin}: run_id: {_shown(plan.run_id)} is not a valid id (letters, digits, . _ : @ -)")
    for name in plan.adapters:
        if not _ID.fullmatch(name):
            raise PlanError(f"{origin}: adapters.{name}: not a valid adapter name")
    if not plan.steps:
        raise PlanError(f"{origin}: steps: a plan needs at least one step")
    seen: set[str] = set()
    for i, step in enumerate(plan.steps):
        where = f"{origin}: steps[{i}]"
        if not _ID.fullmatch(step.id):
            raise PlanError(f"{where}.id: {_shown(step.id)} is not a valid id (letters, digits, . _ : @ -)")
        if step.id in seen:
            raise PlanError(f"{where}.id: duplicate step id {step.id!r}")
        seen.add(step.id)
        used = plan.adapters.get(step.adapter)
        if used is None:
            raise PlanError(f"{where}.adapter: unknown adapter {step.adapter!r}")
        if step.retry is not None:
            if not used.idempotent:
                raise PlanError(
                    f"{where}.retry: adapter {step.adapter!r} is not idempotent; it is never retried automatically"
                )
            if step.retry.attempts < 1 or step.retry.backoff_base_s < 0 or step.retry.backoff_cap_s < 0:
                raise PlanError(f"{where}.retry: attempts must be >= 1 and backoff times >= 0")
            if max(step.retry.backoff_base_s, step.retry.backoff_cap_s) >= 86_400 * 7:
                # As timeout_s: a run asleep for longer between two sends of one key is a typo, not a plan.
                raise PlanError(f"{where}.retry: backoff times must be under a week (seconds)")
            if not 0 <= step.retry.jitter <= 1:
                raise PlanError(f"{where}.retry.jitter: must be between 0 and 1")
        if step.timeout_s is not None and not (0 < step.timeout_s < 86_400 * 7):
            raise PlanError(f"{where}.timeout_s: must be positive (seconds) and under a week")
        size = len(trusted_json(step.args))  # its numbers were checked above
        if size > max_args_bytes:
            raise PlanError(f"{where}.args: {size} bytes is over the {max_args_bytes}-byte limit")
        for name in step.secret:
            if name not in step.args:
                raise PlanError(f"{where}.secret: {name!r} is not one of the step's args")

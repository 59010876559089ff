"""Secret arguments in the fleet: the store keeps their digests, the runner supplies the values.

A plain ``effectlog run`` reads the values from the plan file on the machine that
runs it and writes only their digests to the journal (``Plan.pinned``). The fleet
store is shared by every submitter, runner and operator, and holds the runs' journal
too, so ``submit`` stores the pinned plan: each secret arg is
``{"$secret_sha256": HEX}``. The value never travels through the store, encrypted or
not. The runner that runs the step supplies it, from its own machine:

1. a provider hook (``effectlog runner --secrets MODULE:ATTR``): a callable given a
   ``SecretWanted`` that returns the value, or ``None`` when it does not hold it;
2. else the runner's environment, ``EFFECTLOG_SECRET_<NAME>`` (the arg's name
   upper-cased, anything but letters and digits as ``_``): the string itself, or the
   JSON it holds when the submitted value was not that string.

Whatever the source, the value must hash to the submitted digest, so a runner can
never run a step with another card than the one submitted. A missing or different
value fails the attempt before any step is requested (``secret_unavailable``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from effectlog.canonical import digest
from effectlog.errors import BadInput, SecretUnavailable
from effectlog.plan import Plan, StepDecl, redact

MARK = "$secret_sha256"
ENV_PREFIX = "EFFECTLOG_SECRET_"


class SecretWanted(msgspec.Struct, frozen=True, kw_only=True):
    """What a runner asks its provider for: whose secret, and the digest the value must have."""

    run_id: str
    step_id: str
    name: str
    sha256: str


Provider = Callable[[SecretWanted], Any]


def env_name(name: str) -> str:
    return ENV_PREFIX + re.sub(r"[^A-Za-z0-9]", "_", name).upper()


def from_environment(wanted: SecretWanted, environ: Mapping[str, str] | None = None) -> Any:
    """The value in ``EFFECTLOG_SECRET_<NAME>`` whose digest matches: the string, else the JSON it holds."""
    text = (os.environ if environ is None else environ).get(env_name(wanted.name))
    if text is None:
        return None
    try:
        text.encode()
    except UnicodeEncodeError:  # bytes that are not UTF-8: no submitted (JSON) value is this one
        raise SecretUnavailable(
            f"steps.{wanted.step_id}.args.{wanted.name}: {env_name(wanted.name)} is not UTF-8 text, so it is not "
            "the submitted value",
            run_id=wanted.run_id,
            step_id=wanted.step_id,
        ) from None
    if digest(text) == wanted.sha256:
        return text
    try:
        return msgspec.json.decode(text.encode())
    except msgspec.DecodeError:
        return text  # not JSON either: the digest check reports the mismatch


def placeholder(value: Any) -> str | None:
    """The digest in ``{"$secret_sha256": HEX}``; ``None`` for anything else."""
    if isinstance(value, dict) and len(value) == 1 and isinstance(value.get(MARK), str):
        return str(value[MARK])
    return None


def resolve(plan: Plan, provider: Provider | None = None) -> Plan:
    """``plan`` (as stored: secret args as digests) with every secret arg's value supplied by this runner."""
    steps: list[StepDecl] = []
    for step in plan.steps:
        args = dict(step.args)
        for name in step.secret:
            sha = placeholder(args.get(name))
            if sha is None:  # submitted by a version that stored values: nothing to supply
                continue
            wanted = SecretWanted(run_id=plan.run_id, step_id=step.id, name=name, sha256=sha)
            value = provider(wanted) if provider is not None else None
            if value is None:
                value = from_environment(wanted)
            where = f"steps.{step.id}.args.{name}"
            if value is None:
                raise SecretUnavailable(
                    f"{where}: this runner holds no value for secret {name!r} (set {env_name(name)} or give "
                    "--secrets MODULE:ATTR); the store keeps only its digest",
                    run_id=plan.run_id,
                    step_id=step.id,
                )
            try:
                held = digest(value)
            except (BadInput, TypeError, ValueError, msgspec.EncodeError) as exc:  # not UTF-8 text, not JSON
                raise SecretUnavailable(
                    f"{where}: this runner's value for secret {name!r} has no JSON form, so it is not the "
                    f"submitted one ({type(exc).__name__})",
                    run_id=plan.run_id,
                    step_id=step.id,
                ) from None
            if held != sha:
                raise SecretUnavailable(
                    f"{where}: this runner's value for secret {name!r} is not the submitted one "
                    f"(sha256 {held[:12]}..., submitted {sha[:12]}...)",
                    run_id=plan.run_id,
                    step_id=step.id,
                )
            args[name] = value
        steps.append(msgspec.structs.replace(step, args=args) if args != step.args else step)
    return msgspec.structs.replace(plan, steps=tuple(steps))


def redact_all(plan: Plan, text: str) -> str:
    """``text`` with every secret value of the plan hidden (for reasons written to the store)."""
    for step in plan.steps:
        text = redact(step, text)
    return text

"""Review round 6: today's speed work and edge fixes (``git diff 8f09706..main -- src``) read for an effect
that could happen twice, a result lost, a run owned by two, a check skipped, or an error escaping as a
traceback. Each test is one finding: a failing reproduction first, the fix after it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from effectlog.adapters.protocol import Request
from effectlog.adapters.shell import ShellAdapter, ShellTimeout
from effectlog.canonical import canonical_json, digest
from effectlog.chain import Chain
from effectlog.errors import BadInput, SecretUnavailable
from effectlog.fleet.secrets import env_name, resolve
from effectlog.plan import Plan, parse_plan
from effectlog.recordable import why_unrecordable
from effectlog.session.identity import finite
from hardening_kit import cli_env, effectlog, one_line, run_good_plan, wait_until_gone_or_effect


def _nested(leaf: Any, depth: int) -> Any:
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


# -- canonical JSON: a NaN nested deeper than the walk's old depth limit ----------------------------


@pytest.mark.parametrize("depth", [257, 300, 900])
def test_deep_nan_is_refused_not_recorded_as_null(depth: int) -> None:
    """A NaN nested between 257 and ~990 levels deep (the encoder goes on to Python's recursion limit)
    was passed by the non-finite walk, which stopped at 256: its canonical bytes, digest and recorded
    result were those of ``None``'s nesting (``f(nan)`` and ``f(None)`` one call, a result read back as
    None). Every place that refuses a NaN uses this walk: canonical JSON, results, session identity."""
    nan, none = _nested(float("nan"), depth), _nested(None, depth)
    expected = (True, True, True)
    refused_canonical = False
    try:
        refused_canonical = digest(nan) != digest(none)
    except BadInput:
        refused_canonical = True
    refused_result = why_unrecordable(nan) is not None
    try:
        finite(nan, "args")
        refused_identity = False
    except BadInput:
        refused_identity = True
    assert expected == (refused_canonical, refused_result, refused_identity)


def test_deep_finite_value_still_encodes() -> None:
    """The walk that now goes all the way down passes a deep value with nulls and finite floats."""
    value = _nested({"a": None, "b": 1.5}, 900)
    expected = canonical_json(value)
    assert expected == canonical_json(value, "result")
    assert why_unrecordable(value) is None


# -- shell adapter: a command that closes its output pipes, then outlives its timeout -----------------


def test_shell_timeout_holds_for_a_command_that_closes_its_pipes(tmp_path: Path) -> None:
    """``_outputs`` ended its loop when both pipes had ended and then waited for the command with no
    timeout: a command that closes stdout and stderr (``exec >&- 2>&-``, a daemonising script) ran past
    ``timeout_s`` unkilled, its step reported as done when it ended, and, under the runtime (which gives
    up after timeout_s + grace and records the outcome unknown), kept running after the journal called
    the effect uncertain, free to land after a reconciliation or a retry. The timeout must still hold:
    ``ShellTimeout`` and the process group killed before its effect."""
    marker = tmp_path / "effect"
    pidfile = tmp_path / "pid"
    script = f"echo $$ > {pidfile}; exec >&- 2>&-; sleep 3; echo done > {marker}"
    request = Request(
        run_id="r1",
        step_id="s1",
        attempt=1,
        idempotency_key="r1/s1/1",
        args={"argv": ["sh", "-c", script]},
        timeout_s=0.5,
    )
    with pytest.raises(ShellTimeout):
        ShellAdapter().invoke(request)
    wait_until_gone_or_effect(pidfile, marker, 3.5)  # a command left alive would write its effect first
    expected = False
    assert expected == marker.exists()


# -- the entry point's fds 0-2: stdin closed ------------------------------------------------------------


def test_a_command_reading_stdin_started_with_fd_0_closed_gives_one_line_not_a_traceback(tmp_path: Path) -> None:
    """``standard_descriptors_open`` points a closed fd 0 at /dev/null but gave ``sys.stdin`` (None, as
    Python sets it for a closed fd) no stream, as it does for stdout and stderr: ``console hash-password``
    started with ``<&-`` died with ``AttributeError: 'NoneType' object has no attribute 'isatty'``. With
    stdin read as /dev/null it is the documented refusal of an empty password (exit 2, one line)."""
    done = effectlog("console", "hash-password", cwd=tmp_path, env=cli_env(), preexec=lambda: os.close(0))
    line = one_line(done.stderr)
    expected = (2, "effectlog: bad_input: hash-password: the password is empty")
    assert expected == (done.returncode, line)


# -- a journal key in the environment that is not UTF-8 --------------------------------------------------


def test_a_journal_key_in_the_environment_that_is_not_utf8_is_used_as_its_bytes(tmp_path: Path) -> None:
    """The argv check (non-UTF-8 arguments refused in one line) left the one other text every command
    takes from outside: ``EFFECTLOG_JOURNAL_KEY`` set to bytes that are not UTF-8 (a key from a random
    source) reached ``str.encode`` and every command died with ``UnicodeEncodeError``. The key is bytes
    (``--key-file`` reads it as bytes): the environment's bytes are the key, and a journal written with
    them verifies."""
    journal = tmp_path / "keyed.db"
    run_good_plan(journal, chain=Chain(b"\xffkey"))
    env = cli_env({"EFFECTLOG_JOURNAL_KEY": "\udcffkey"})  # os.fsencode gives the child b"\xffkey"
    done = effectlog("verify", "--journal", str(journal), cwd=tmp_path, env=env)
    expected = (0, False)
    assert expected == (done.returncode, "Traceback" in done.stderr), done.stderr


# -- a fleet runner's secret value that is not UTF-8 text ---------------------------------------------


def _secret_plan() -> Plan:
    plan = {
        "run_id": "pay-1",
        "adapters": {"rec": {"type": "noop"}},
        "steps": [{"id": "charge", "adapter": "rec", "args": {"card": "4111"}, "secret": ["card"]}],
    }
    pinned = parse_plan(json.dumps(plan).encode()).pinned()  # as the store keeps it: the card as its digest
    return parse_plan(json.dumps(pinned).encode())


@pytest.mark.parametrize("source", ["environment", "provider"])
def test_a_secret_value_that_is_not_utf8_is_secret_unavailable(source: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Same class as the argv and journal-key cases, at the fleet's other outside text: a runner whose
    ``EFFECTLOG_SECRET_CARD`` (or provider hook) gives a value that is not UTF-8 raised
    ``UnicodeEncodeError`` from the digest check, past the attempt's prepare (which reports ``BadInput``
    as a failed attempt), so the attempt was never reported, its lease ran out and each requeue did the
    same. It is ``SecretUnavailable`` (a ``BadInput``) naming the arg, as any other wrong value is."""
    plan = _secret_plan()
    value = "\udcff4111"  # what Python makes of the bytes b"\xff4111" in the environment
    provider = (lambda wanted: value) if source == "provider" else None
    if source == "environment":
        monkeypatch.setenv(env_name("card"), value)
    with pytest.raises(SecretUnavailable) as caught:
        resolve(plan, provider)
    assert "steps.charge.args.card" in caught.value.message

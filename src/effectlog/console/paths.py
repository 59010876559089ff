"""How the console's URLs name a run and a step: each id one path segment, read back from the path as sent.

A run id may hold ``/`` (a session's or ``durable.run``'s may; a plan's may not). Jinja's
``urlencode`` keeps ``/``, and Starlette routes on the decoded path: such a run's page was
never matched. Links and forms now encode each id whole (``segment``), the routes take
``{run_id:path}``, and a decision reads its ids from the path as sent (``decision_path``),
so a step id holding ``/`` cannot move the split and name another run.
"""

from __future__ import annotations

from urllib.parse import quote, unquote

from starlette.exceptions import HTTPException
from starlette.requests import Request


def segment(value: object) -> str:
    """An id as one path segment: every reserved character encoded, ``/`` too (Jinja's urlencode keeps it)."""
    return quote(str(value), safe="")


def decision_path(request: Request) -> tuple[str, str, str]:
    """The run id, step id and action a decision's URL names, read from the path as sent (``raw_path``).

    A run id may hold ``/``: the route matches the decoded path with ``{run_id:path}``, where a step id
    holding ``/`` would move the split and name another run. The path as sent, with each id one
    segment (``segment``), names them exactly; any other shape is refused."""
    raw = request.scope.get("raw_path")
    if not isinstance(raw, bytes):  # a server that keeps no raw path: the decoded one, as routed
        return request.path_params["run_id"], request.path_params["step_id"], request.path_params["action"]
    parts = raw.split(b"?", 1)[0].decode("utf-8", "replace").split("/")
    parts = parts[2:] if parts[1:2] == ["api"] else parts[1:]
    if len(parts) != 5 or parts[0] != "runs" or parts[2] != "steps":
        raise HTTPException(404, "name the run and the step each as one path segment (a '/' in an id as %2F)")
    return unquote(parts[1]), unquote(parts[3]), unquote(parts[4])

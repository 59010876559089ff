"""A stand-in for an OpenAI-compatible provider, on 127.0.0.1, started by the tests.

It counts billable generations and honours ``Idempotency-Key`` the way the IETF
draft describes: the same key with the same body answers the stored generation
(not billed again); the same key with another body is 422. Replies follow a script,
chosen by how many assistant turns the request holds.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# text, a tool call (its args as a dict, or as the raw arguments string), parallel calls
Reply = str | tuple[str, dict[str, Any] | str] | list[tuple[str, dict[str, Any] | str]]


class ProviderStandIn:
    def __init__(self, script: Sequence[Reply], *, stall: threading.Event | None = None) -> None:
        self.script = list(script)
        # When given: the first generation is billed, then its answer waits until the event is set
        # (a test kills the client while the request is in flight).
        self.stall = stall
        self.billed = 0
        self.requests = 0
        self.replayed = 0
        self.keys_seen: list[str | None] = []
        # Answers given before any generation, one per request, in order: (status, headers); nothing billed.
        self.faults: list[tuple[int, dict[str, str]]] = []
        self._lock = threading.Lock()
        self._generations: dict[str, tuple[str, dict[str, Any]]] = {}
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, name="provider-standin", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def start(self) -> ProviderStandIn:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def _generate(self, body: dict[str, Any]) -> dict[str, Any]:
        turn = sum(1 for m in body.get("messages", []) if m.get("role") == "assistant")
        reply = self.script[min(turn, len(self.script) - 1)]
        self.billed += 1
        if isinstance(reply, str):
            message: dict[str, Any] = {"role": "assistant", "content": reply}
        else:
            calls = (
                [(f"call_{turn}", *reply)]
                if isinstance(reply, tuple)
                else [(f"call_{turn}_{i}", *call) for i, call in enumerate(reply)]
            )
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": cid, "type": "function", "function": {"name": name, "arguments": _raw(args)}}
                    for cid, name, args in calls
                ],
            }
        return {
            "id": f"gen-{self.billed}",
            "object": "chat.completion",
            "model": body.get("model", ""),
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        }

    def handle(self, key: str | None, raw: bytes) -> tuple[int, dict[str, Any]]:
        body = json.loads(raw)
        body_hash = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
        with self._lock:
            self.requests += 1
            self.keys_seen.append(key)
            if key is not None and key in self._generations:
                stored_hash, stored = self._generations[key]
                if stored_hash != body_hash:
                    return 422, {
                        "error": {
                            "type": "idempotency_error",
                            "message": "Idempotency-Key reused with a different body",
                        }
                    }
                self.replayed += 1
                return 200, stored
            answer = self._generate(body)
            if key is not None:
                self._generations[key] = (body_hash, answer)
            return 200, answer

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                if self.path.rstrip("/") != "/v1/chat/completions":
                    self._send(404, {"error": {"message": "not found"}})
                    return
                raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with provider._lock:
                    fault = provider.faults.pop(0) if provider.faults else None
                    if fault is not None:
                        provider.requests += 1
                        provider.keys_seen.append(self.headers.get("Idempotency-Key"))
                if fault is not None:
                    self._send(fault[0], {"error": {"message": f"stand-in fault {fault[0]}"}}, fault[1])
                    return
                status, payload = provider.handle(self.headers.get("Idempotency-Key"), raw)
                stall = provider.stall
                if stall is not None and provider.billed == 1:
                    provider.stall = None  # one request stalls: the one a test kills its client during
                    stall.wait(60)
                self._send(status, payload)

            def _send(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                return

        return Handler


def _raw(args: dict[str, Any] | str) -> str:
    """A tool call's arguments string: a dict as JSON, a str as given (broken or odd arguments)."""
    return args if isinstance(args, str) else json.dumps(args)

"""Who may use the console: users and roles from a TOML file, passwords hashed with scrypt.

The file (``--users FILE``)::

    [users.alice]
    role = "operator"          # or "viewer"
    password = "scrypt$16384$8$1$<salt b64>$<hash b64>"
    token_sha256 = "<64 hex>"  # optional: the JSON API's bearer token, by its SHA-256

A password hash comes from ``effectlog console hash-password`` (the stdlib's
``hashlib.scrypt``: no new dependency); a token and its line from ``effectlog console
new-token`` (a random 256-bit token: a plain SHA-256 is enough to keep it unguessable).
``viewer`` may read every page; ``operator`` may also decide (approve, deny, reconcile).
The file is read once, at start-up.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import secrets
import tomllib
from typing import Literal

import msgspec

from effectlog.errors import BadInput

Role = Literal["viewer", "operator"]
ROLES: tuple[Role, ...] = ("viewer", "operator")
_N, _R, _P = 2**14, 8, 1  # scrypt cost: ~16 MiB and tens of ms per check, as OWASP suggests for scrypt
_SCHEME = "scrypt"
_HEX64 = re.compile(r"[0-9a-fA-F]{64}")


class User(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    role: Role
    password_hash: str
    token_sha256: str = ""

    @property
    def may_decide(self) -> bool:
        return self.role == "operator"


def hash_password(password: str, *, salt: bytes | None = None) -> str:
    """``scrypt$N$r$p$salt$hash`` (base64): what the users file holds for a password."""
    if not password:
        raise BadInput("hash-password: the password is empty")
    salt = salt if salt is not None else os.urandom(16)
    key = hashlib.scrypt(password.encode(), salt=salt, n=_N, r=_R, p=_P, dklen=32)
    b64 = base64.b64encode
    return f"{_SCHEME}${_N}${_R}${_P}${b64(salt).decode()}${b64(key).decode()}"


def check_password(password: str, stored: str) -> bool:
    """Whether ``password`` matches ``stored`` (constant-time compare); a malformed hash never matches."""
    try:
        scheme, n, r, p, salt, key = stored.split("$")
        if scheme != _SCHEME:
            return False
        expected = base64.b64decode(key, validate=True)
        got = hashlib.scrypt(
            password.encode(),
            salt=base64.b64decode(salt, validate=True),
            n=int(n),
            r=int(r),
            p=int(p),
            dklen=len(expected),
            maxmem=64 * 1024 * 1024,
        )
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(got, expected)


def new_token() -> str:
    return secrets.token_urlsafe(32)


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def by_token(users: dict[str, User], token: str) -> User | None:
    """The user whose ``token_sha256`` is the token's (every user compared, in constant time each)."""
    wanted = token_digest(token)
    found = None
    for user in users.values():
        if user.token_sha256 and hmac.compare_digest(user.token_sha256, wanted):
            found = user
    return found


def load_users(path: str) -> dict[str, User]:
    """The users of ``path``; a file that cannot be used is ``BadInput`` naming what and where."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise BadInput(f"--users {path}: cannot read it ({exc.strerror})") from None
    except tomllib.TOMLDecodeError as exc:
        raise BadInput(f"--users {path}: not TOML ({exc})") from None
    table = data.get("users")
    if not isinstance(table, dict) or not table:
        raise BadInput(f"--users {path}: no [users.NAME] tables")
    users: dict[str, User] = {}
    for name, entry in table.items():
        if not isinstance(entry, dict):
            raise BadInput(f"--users {path}: users.{name} is not a table")
        role, password = entry.get("role"), entry.get("password")
        if role not in ROLES:
            raise BadInput(f"--users {path}: users.{name}.role must be viewer or operator, not {role!r}")
        if not isinstance(password, str) or not password.startswith(f"{_SCHEME}$") or password.count("$") != 5:
            raise BadInput(
                f"--users {path}: users.{name}.password must be a hash from 'effectlog console hash-password'"
            )
        token = entry.get("token_sha256", "")
        if not isinstance(token, str) or (token and not _HEX64.fullmatch(token)):
            raise BadInput(f"--users {path}: users.{name}.token_sha256 must be 64 hex digits ('console new-token')")
        users[name] = User(name=name, role=role, password_hash=password, token_sha256=token.lower())
    return users

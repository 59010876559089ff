"""``effectlog console``: serve the operator console; ``console hash-password``: hash one for the users file."""

from __future__ import annotations

import argparse
import getpass
import ipaddress
import os
import sys

from effectlog.cli.inspect_cmds import existing_journal
from effectlog.cli.output import err, out
from effectlog.errors import BadInput, MissingDependency

LOOPBACK_NAMES = ("localhost",)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "console",
        help="serve the operator console in the browser (extra effectlog[console]; see docs/console.md)",
        description="Serve the operator console, or with 'hash-password' print a password hash for the users file.",
    )
    p.add_argument(
        "action",
        nargs="?",
        choices=("serve", "hash-password", "new-token"),
        default="serve",
        help="serve (default); hash-password: hash one for the users file; new-token: a bearer token for the API",
    )
    p.add_argument("--journal", help="the journal: a SQLite path or postgresql:// URL")
    p.add_argument("--key-file", metavar="F", help="HMAC key for the chain (else EFFECTLOG_JOURNAL_KEY)")
    p.add_argument("--effects", help="the effect store runs pinned: offers 'reconcile from the effect store'")
    p.add_argument(
        "--adapters",
        metavar="MODULE:ATTR",
        action="append",
        default=[],
        help="adapter factories: offers reconcile by the step's own lookup (as reconcile --lookup)",
    )
    p.add_argument("--store", help="a fleet store: its needs_operator requests are shown as needing attention")
    p.add_argument("--users", help="the users file (TOML, see docs/console.md)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8765, help="port to bind (default 8765)")
    p.add_argument("--allow-remote", action="store_true", help="allow a --host other than loopback")
    p.add_argument("--tls-cert", help="serve HTTPS with this certificate (PEM); cookies become Secure")
    p.add_argument("--tls-key", help="the certificate's private key (PEM)")
    p.set_defaults(handler=cmd_console)


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def cmd_console(args: argparse.Namespace) -> int:
    if args.action == "hash-password":
        return _hash_password()
    if args.action == "new-token":
        from effectlog.console.users import new_token, token_digest

        token = new_token()
        out(f'token: {token}\ntoken_sha256 = "{token_digest(token)}"\n')
        return 0
    if not args.journal:
        raise BadInput("console: give --journal (a SQLite path or postgresql:// URL)")
    if not args.users:
        raise BadInput("console: give --users FILE (see docs/console.md; 'effectlog console hash-password' hashes one)")
    if not is_loopback(args.host) and not args.allow_remote:
        raise BadInput(f"console: --host {args.host} is not loopback; give --allow-remote to bind it anyway")
    if bool(args.tls_cert) != bool(args.tls_key):
        raise BadInput("console: give --tls-cert and --tls-key together")
    if not 0 < args.port < 65536:
        raise BadInput(f"console: --port {args.port} is not a port")
    for flag, path in (("--effects", args.effects), ("--store", args.store)):
        if path and "://" not in path and not os.path.isfile(path):
            raise BadInput(f"console: {flag} {path}: no such file")
    existing_journal(args.journal)
    from effectlog.console.users import load_users

    users = load_users(args.users)
    if args.adapters:
        from effectlog.console.decisions import adapter_registry

        adapter_registry(tuple(args.adapters))  # a module that does not load is refused now, not at the first click
    try:
        import uvicorn

        from effectlog.console.app import create_app
        from effectlog.console.decisions import Config, reading, with_store
        from effectlog.notify import shown_location
    except ModuleNotFoundError as exc:
        raise MissingDependency(f"console needs its extra: install effectlog[console] ({exc})") from None
    config = Config(
        journal=args.journal,
        users=users,
        store=args.store,
        effects=args.effects,
        key_file=args.key_file,
        adapters=tuple(args.adapters),
        https_only=bool(args.tls_cert),
    )
    # Opened once now, read only: a mistyped --key-file, a key that is not the journal's (or the fleet
    # store's) and an unreadable journal are refused before the console says it serves (exit 2), not
    # found by every page it would serve.
    reading(config, lambda journal: None)
    if args.store:
        with_store(config, lambda store: None)
    scheme = "https" if args.tls_cert else "http"
    host = f"[{args.host}]" if ":" in args.host else args.host
    where = shown_location(args.journal)  # a PostgreSQL URL's password stays out of the console's log
    out(f"effectlog console: {scheme}://{host}:{args.port}/ (journal {where}, {len(users)} users)\n")
    sys.stdout.flush()
    uvicorn.run(
        create_app(config),
        host=args.host,
        port=args.port,
        log_level="warning",
        ssl_certfile=args.tls_cert,
        ssl_keyfile=args.tls_key,
        server_header=False,
        timeout_graceful_shutdown=2,  # open event streams (live pages) must not hold a stop up
    )
    return 0


def _hash_password() -> int:
    from effectlog.console.users import hash_password

    if sys.stdin.isatty():
        password = getpass.getpass("password: ")
        if getpass.getpass("again: ") != password:
            err("effectlog: console hash-password: the two passwords differ\n")
            return 2
    else:
        password = sys.stdin.readline().rstrip("\n")
    out(hash_password(password) + "\n")
    return 0

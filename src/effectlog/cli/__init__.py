"""The ``effectlog`` command line.

Each area registers its subcommands from its own module. Every error becomes one
line on stderr and a documented exit status (see ``effectlog.errors.ExitStatus``);
no traceback reaches the user for bad input.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from effectlog.cli.output import (
    drop_stdout,
    err,
    keep_tools_off_stdout,
    lost_output,
    out,
    standard_descriptors_open,
)
from effectlog.cli.progress import end_logging, error_line, json_errors
from effectlog.errors import BadInput, EffectlogError, ExitStatus, MissingDependency, OutputUnwritable
from effectlog.journal.sidecars import is_postgres, is_url, new_name_refusal, not_a_path, url_refusal

Handler = Callable[[argparse.Namespace], int]


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit status 2."""

    def error(self, message: str) -> NoReturn:
        command = self.prog.removeprefix("effectlog").strip()  # "run", "crash-matrix run", or none
        where = f"{command}: " if command else ""
        err(f"effectlog: usage: {where}{message} (see '{self.prog} --help')\n")
        raise SystemExit(ExitStatus.BAD_INPUT)

    def _print_message(self, message: str, file: Any = None) -> None:
        """``--help`` and ``--version`` through ``output.out``, as every command's output: a closed pipe is
        dropped, and a full disk is said by ``exit`` (they wrote past it and exited 0 with the text lost)."""
        if message and (file is None or file is sys.stdout):
            out(message)
        else:
            super()._print_message(message, file)

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        lost = lost_output()
        if status == 0 and lost is not None:
            raise SystemExit(
                _fail(OutputUnwritable(f"stdout: cannot write the output ({lost.strerror or lost}); it is lost"))
            )
        super().exit(status, message)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        """A subcommand's parser refuses what it does not know itself. argparse hands a subcommand's
        leftovers up to the top parser, whose message named neither the command nor its help
        (``effectlog: usage: unrecognized arguments: --from-step s (see 'effectlog --help')``)."""
        parsed, extras = super().parse_known_args(args, namespace)
        if extras and self.prog != "effectlog":
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras


def build_parser() -> argparse.ArgumentParser:
    from effectlog.cli import inspect_cmds, run_cmds

    parser = _Parser(prog="effectlog", description="Durable execution of AI-agent tool calls.")
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for module in (inspect_cmds, run_cmds):
        module.register(sub)
    _register_optional(sub)
    return parser


def _register_optional(sub: Any) -> None:
    """Areas that land in their own modules register here when present."""
    import importlib

    for name in ("crashmatrix_cmds", "fleet_cmds", "lifecycle_cmds", "console_cmds"):
        try:
            module = importlib.import_module(f"effectlog.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"effectlog.cli.{name}":
                raise
            continue
        module.register(sub)


def _version() -> str:
    from effectlog import __version__

    return f"effectlog {__version__}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if (getattr(args, "adapters", None) or getattr(args, "secrets", None)) and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # `--adapters my_tools:X` finds ./my_tools.py, as `python -m effectlog` does
    handler: Handler = args.handler
    json_errors(args)  # --log-format json: the error line is one JSON object too
    shutdown = _telemetry()
    try:
        refuse_undecodable(args)
        refuse_empty_locations(args)
        status = handler(args)
    except EffectlogError as exc:
        status = _fail(exc)
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] not in ("psycopg", "psycopg_pool"):
            raise
        status = _fail(
            MissingDependency(f"a postgresql:// location needs psycopg: install effectlog[postgres] ({exc})")
        )
    except KeyboardInterrupt:
        err(error_line("effectlog: interrupted", exit_status=int(ExitStatus.INTERRUPTED)))
        status = int(ExitStatus.INTERRUPTED)
    except BrokenPipeError:
        # Only a write that bypassed ``output.out`` gets here, and the command's own status is
        # lost with it: say so with 1 rather than pretend the command succeeded.
        drop_stdout()
        status = int(ExitStatus.RUN_FAILED)
    if shutdown is not None:
        shutdown()  # export what the SDK still holds (the last spans, the metrics) before exiting
    end_logging()  # main() inside another program (or a test) leaves its logging as it found it
    out("")  # flush what is buffered; a closed pipe is dropped, not an error
    lost = lost_output()
    if lost is not None:
        # What the command did stands; its output did not reach stdout. A status of its own stays (a run
        # stopped, suspended: 3, 4), else 2: exit 0 would tell a script the output it reads is whole.
        failed = _fail(OutputUnwritable(f"stdout: cannot write the output ({lost.strerror or lost}); it is lost"))
        status = status or failed
    return status


def refuse_undecodable(args: argparse.Namespace) -> None:
    """``BadInput`` for an argument that is not UTF-8 text, before anything is opened or written.

    Python hands a byte that is not UTF-8 (a shell's ``$'\\xff'``) to the program as a lone
    surrogate. What effectlog is given is recorded as UTF-8 (names, reasons, the effect store's
    pinned path, fleet rows), where that raised ``UnicodeEncodeError`` half-way through a
    command; one check here refuses it for every command and argument.
    """
    for dest, value in vars(args).items():
        for text in value if isinstance(value, list | tuple) else (value,):
            if isinstance(text, str) and not text.isascii():
                try:
                    text.encode()
                except UnicodeEncodeError:
                    flag = dest if dest in _POSITIONALS else "--" + dest.replace("_", "-")
                    raise BadInput(
                        f"argument {flag}: {text!r} is not UTF-8 text (effectlog records its arguments as "
                        "UTF-8); nothing was done"
                    ) from None


def refuse_empty_locations(args: argparse.Namespace) -> None:
    """``BadInput`` for a file or database location given as empty or blank text (``--journal ""``, an unset
    shell variable): it reached SQLite as the current directory ("cannot open the journal (Is a
    directory)"), and a blank ``--effects " "`` made a store file named by a space. Also for a file's
    location ending in ``/`` (a shell's completion of a directory): ``run --effects fx.db/`` ended in a
    traceback after making the journal, while ``--journal j.db/`` quietly made and used ``j.db``. And for
    one written as a URL other than ``postgresql://`` or as a SQLite URI (``--journal file:j.db``): it made
    a file of that name, a second journal beside ``j.db`` (``journal.sidecars.is_url``); and for a new
    journal, store or effect store whose name begins or ends with whitespace or an invisible character
    (``--journal "j.db "``), or is another Unicode spelling of a file there (``jé.db`` decomposed beside
    ``jé.db`` composed), a file apart from the one meant likewise (``journal.sidecars.new_name_refusal``)."""
    for dest in _LOCATIONS:
        value = getattr(args, dest, None)
        if not isinstance(value, str):
            continue
        flag = dest if dest in _POSITIONALS else "--" + dest.replace("_", "-")
        if not value.strip():
            raise BadInput(f"argument {flag}: {value!r} is empty, not a location; nothing was done")
        if is_url(value) and not is_postgres(value):
            raise BadInput(f"argument {flag}: {url_refusal(value, 'local')}")
        refusal = new_name_refusal(value, _DATABASES[dest]) if dest in _DATABASES and not not_a_path(value) else None
        if refusal is not None:
            raise BadInput(f"argument {flag}: {refusal}")
        if value.endswith(os.sep) and dest not in _DIRECTORIES and "://" not in value:
            raise BadInput(
                f"argument {flag}: {value!r} ends with {os.sep!r}, so it names a directory, not a file; nothing done"
            )


# The arguments that name a file or a database.
_LOCATIONS = (
    "journal", "store", "effects", "trace", "key_file", "plan", "ledger", "output", "postgres_url",
    "tls_cert", "tls_key", "workdir", "blind", "report",
)  # fmt: skip

# The locations that name a SQLite file effectlog makes when it is not there, each as its refusal names it:
# checked here too (not only when opened) so that no other is made before the one refused (``--effects``).
_DATABASES = {"journal": "journal", "store": "fleet store", "effects": "effect store"}

# The locations that name a directory, where a trailing separator is usual.
_DIRECTORIES = frozenset({"workdir"})

# Arguments without a flag (dests as argparse names them): said as they are, not as --DEST.
_POSITIONALS = frozenset({"plan", "command", "what", "machine", "action", "report"})


def process_main() -> int:
    """The process entry point: ``python -m effectlog`` and the ``effectlog`` console script.

    As ``main()``, and once tools have run fd 1 stays on stderr until the process exits, so
    nothing a tool leaves behind (a thread, an ``atexit`` hook) prints into ``--json`` output
    (``output.keep_tools_off_stdout``). ``main()`` called from Python gives fd 1 back to its
    caller when the tools are done instead.
    """
    standard_descriptors_open()  # before any file is opened: see output.standard_descriptors_open
    keep_tools_off_stdout()
    return main()


def _telemetry() -> Callable[[], None] | None:
    """OpenTelemetry exporters from the OTEL_* variables (docs/observability.md); nothing is imported otherwise."""
    from effectlog.observe import sdk

    return sdk.configure() if sdk.wanted() else None


def _fail(exc: EffectlogError) -> int:
    err(error_line(f"effectlog: {exc.code}: {exc}", code=exc.code, exit_status=int(exc.exit_status)))
    return int(exc.exit_status)

"""SQLite files that would live in each other's sidecar names.

SQLite keeps a database's WAL, shared-memory index and rollback journal beside it, at its name plus
``-wal``, ``-shm`` and ``-journal``, and takes whatever file is there for its own: a WAL without a
valid header is reset by the next commit and deleted by the last close, a -shm is rewritten, a
-journal is "rolled back" and deleted. So a journal or store made at ``j.db-wal`` (one key too far in
a tab completion) was destroyed by the next commit to ``j.db``, and a store made at ``x.db`` destroyed
a journal already at ``x.db-wal``: acknowledged runs and idempotency keys gone. Every effectlog SQLite
file is checked here before SQLite opens it.
"""

from __future__ import annotations

import os
import re
import stat
import urllib.parse
from collections.abc import Sequence

from effectlog import spelling
from effectlog.errors import (
    BadInput,
    FileBindMounted,
    JournalUnreadable,
    LocationAmbiguous,
    LocationMisleads,
    NotARegularFile,
    SidecarClash,
)
from effectlog.journal import filelocks

SUFFIXES = filelocks.SIDECARS
_DATABASE_HEADER = b"SQLite format 3\x00"  # a WAL, -shm or rollback journal never starts with it


def _database(path: str, *, empty_too: bool) -> bool:
    """Whether ``path`` is a regular file holding a SQLite database (or empty, if ``empty_too``).

    A file this process has open as a database is one, without reading it: closing a descriptor
    opened here to read it would drop this process's SQLite locks on it (``filelocks.open_here``).
    """
    if filelocks.open_here(path):
        return True
    if not os.path.isfile(path):
        return False  # before open(): a FIFO would block it
    try:
        with open(path, "rb") as file:
            head = file.read(len(_DATABASE_HEADER))
    except OSError:
        return False
    return head == _DATABASE_HEADER or (empty_too and head == b"")


# The start of a libpq connection string in keyword form (``host=db dbname=effectlog``): its keywords.
_CONNINFO = re.compile(
    r"\s*(host|hostaddr|port|dbname|user|password|passfile|service|sslmode|options|application_name"
    r"|connect_timeout|target_session_attrs|sslrootcert|channel_binding|gssencmode)\s*="
)


def _mount_points() -> set[str]:
    """This process's mount points (``/proc/self/mountinfo``, field 5, its octal escapes decoded); none where
    there is no such file."""
    try:
        with open("/proc/self/mountinfo", "rb") as file:
            lines = file.read().splitlines()
    except OSError:
        return set()
    escaped = (line.split(b" ")[4] for line in lines if line.count(b" ") >= 4)
    return {
        re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m[1], 8)]), point).decode("utf-8", "surrogateescape")
        for point in escaped
    }


def _same(one: str, other: str) -> bool:
    """Whether two paths reach one file (or directory), by the kernel's resolution of each."""
    try:
        a, b = os.stat(one), os.stat(other)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _misleads(path: str, depth: int = 0) -> str | None:
    """The file ``os.path.realpath(path)`` names when it is another than the one the kernel reaches by
    ``path`` (``None`` when both are one, or when there is no telling).

    Every opener resolves its location by text (``realpath``, as SQLite's own full-path logic does,
    which puts the WAL beside the result). The links of ``/proc/PID/root``, ``/proc/PID/cwd`` and
    ``/proc/PID/fd/N`` lead the kernel into that process's mounts, but their text is a path of this
    mount namespace (``readlink /proc/PID/root`` is ``/``): a container's journal reached that way was
    the host's file of the same path, a new one, and a finished run there ran its steps again."""
    real = os.path.realpath(path)
    if os.path.exists(path):
        return None if _same(path, real) else real
    if os.path.islink(path):  # a link to a file not there yet: the file is made where it points
        target = os.path.join(os.path.dirname(path), os.readlink(path))
        return _misleads(target, depth + 1) if depth < 40 else None
    parent = os.path.dirname(path) or "."
    if not os.path.isdir(parent):
        return None  # no directory there: its opener says so
    return None if _same(parent, os.path.dirname(real)) else real


def refuse_shared(named: Sequence[tuple[str, str | None, bool]]) -> None:
    """``BadInput`` if two of ``named`` (flag, location, whether it is a SQLite database), the files one
    command opens as different things (a journal, an effect store, a fleet store, a trace), are one file:
    the same name twice, another spelling of it (``./x``, an absolute path, a symlink, even one whose file is
    not there yet), a hard link, or one database's sidecar (``j.db-wal``). Before anything is opened: each
    opener alone would create its file first and only then find the other's tables in it (or write a
    trace into a WAL). The later of the two is named; URLs and empty locations are not files."""
    seen: list[tuple[str, str, str, tuple[int, int] | None, bool]] = []
    for flag, location, database in named:
        if not location or is_url(location) or is_conninfo(location):
            continue
        real = os.path.realpath(location)
        try:
            found = os.stat(location)
            ident: tuple[int, int] | None = (found.st_dev, found.st_ino)
        except OSError:
            ident = None
        for other_flag, other, other_real, other_ident, other_database in seen:
            if real == other_real or (ident is not None and ident == other_ident):
                raise BadInput(
                    f"{flag} {location}: that is the {other_flag} file ({other}); give each its own file; "
                    "nothing was written"
                )
            for base, sidecar, owner, owner_flag, is_db in (
                (other_real, real, other, other_flag, other_database),
                (real, other_real, location, flag, database),
            ):
                suffix = next((x for x in SUFFIXES if is_db and sidecar == base + x), None)
                if suffix is not None:
                    raise BadInput(
                        f"{flag} {location}: that is SQLite's {suffix[1:]} file of the {owner_flag} database "
                        f"({owner}); give each its own file; nothing was written"
                    )
        seen.append((flag, location, real, ident, database))


def refuse_misleading(path: str, what: str) -> None:
    """``LocationMisleads`` if ``path`` names, by its text, another file than the kernel reaches by it
    (``_misleads``): before anything opens it, SQLite included."""
    real = _misleads(path)
    if real is not None:
        raise LocationMisleads(
            f"{path}: this path reaches the {what} through a link whose text names another file ({real}), as "
            f"/proc/PID/root, /proc/PID/cwd and /proc/PID/fd/N do for a process in another mount namespace; SQLite "
            f"opens a file by that text, so it would use {real} instead: give a path of this mount namespace "
            "(or run the command inside the other one, nsenter -m); nothing was written"
        )


def is_conninfo(text: str) -> bool:
    """Whether ``text`` reads as a PostgreSQL connection string in keyword form (``host=... dbname=...``):
    a location to refuse (``refuse_clash``), never a relative file path to make absolute."""
    return _CONNINFO.match(text) is not None


# A location written as a URL (``scheme://...``) or a SQLite URI filename (``file:j.db``, ``sqlite:...``).
_URL = re.compile(r"(?i:file:|sqlite:|[a-z][a-z0-9+.-]*://)")


def is_url(text: str) -> bool:
    """Whether ``text`` reads as a URL or a SQLite URI, which effectlog never opens as a file: SQLite takes
    ``file:`` as a URI only when asked to, so ``file:j.db`` was a file of that name, another journal than
    ``j.db`` for the same run (every step ran again). A location to refuse, never a path to make absolute;
    a file of such a name is ``./NAME``."""
    return _URL.match(text) is not None


def is_postgres(location: str) -> bool:
    """Whether ``location`` is a PostgreSQL URL (``postgresql://`` or ``postgres://``, as libpq takes
    them): the one location that is neither a file's path nor refused."""
    return location.startswith(("postgresql://", "postgres://"))


def not_a_path(text: str) -> bool:
    """``is_conninfo`` or ``is_url``: text its opener refuses, to keep as given (not made absolute)."""
    return is_conninfo(text) or is_url(text)


# A URL's scheme and ``//``, and a ``key=value`` parameter of its query or of a keyword connection string.
_AUTHORITY = re.compile(r"(?i)[a-z][a-z0-9+.-]*://")
_PARAMETER = re.compile(r"(^|[?&\s])([^=&?#\s]+)(\s*=\s*)('(?:[^'\\]|\\.)*'|[^&#\s]*)")
_SECRET_KEYS = frozenset({"password", "sslpassword"})  # libpq's: the server's, and a client key's


def masked(location: str) -> str:
    """``location`` fit to print, log or send: a URL's password (``user:PASSWORD@``, up to the last ``@``,
    so a raw ``/`` or ``@`` in it is masked too) and the value of a ``password`` or ``sslpassword``
    parameter (of a URL's query, its key percent-decoded as libpq does, or of a keyword connection
    string) are ``***``. Any other text, a file's path included, is as given. The one mask every message,
    notification and console page uses."""
    scheme = _AUTHORITY.match(location)
    if scheme is None and not is_conninfo(location):
        return location
    if scheme is not None:
        rest, at = location[scheme.end() :], location.rfind("@") - scheme.end()
        user, colon, _ = rest[: max(at, 0)].partition(":")
        if colon:
            location = f"{scheme.group()}{user}:***{rest[at:]}"

    def value(found: re.Match[str]) -> str:
        secret = urllib.parse.unquote(found[2]).lower() in _SECRET_KEYS
        return f"{found[1]}{found[2]}{found[3]}***" if secret else found[0]

    return _PARAMETER.sub(value, location)


def url_refusal(text: str, what: str) -> str:
    """The message for a ``what`` location that ``is_url`` (a password in it masked)."""
    shown = masked(text)
    return (
        f"{shown!r} is a URL, not a {what} file's path: effectlog opens a SQLite file by its path (not as a "
        "file: URI or a sqlite:// URL) and PostgreSQL by a postgresql:// URL; a file of that name is "
        "./NAME or its absolute path; nothing was written"
    )


def _twin(path: str) -> str | None:
    """Another entry of ``path``'s directory that is shown as ``path``'s name is (``spelling.seen_as``), if any."""
    directory, name = os.path.split(path)
    try:
        entries = os.listdir(directory or ".")
    except OSError:
        return None  # no directory there (or none to list): its opener says so
    return spelling.twin(name, entries)


def new_name_refusal(path: str, what: str) -> str | None:
    """The message for a ``what`` location (a SQLite file effectlog makes when it is not there) that no file
    is at yet and whose name is not the one meant, else ``None``:

    - it begins or ends with whitespace or a format character (``j.db ``, ``j.db\\n``, a byte-order mark from
      a location read out of a file, a zero-width space pasted from a web page): a location pasted or read
      with what surrounded it, which would make a file apart from ``j.db``, invisibly so in every listing;
    - another file of its directory is the same name spelled otherwise (``jé.db`` composed against
      decomposed, NFC against NFD, or with a format character inside): Linux keeps a name as the bytes it is
      given, so the two are two files every listing shows alike;
    - the file is there through another spelling of a directory on its way (``runs-é/j.db`` with ``runs-é``
      composed, given through a decomposed ``runs-é`` a script's ``mkdir -p`` made beside it).

    Either way the same run given later by the name meant ran every step again. A file of such a name
    already there is opened as it is (its runs are not stranded)."""
    if os.path.lexists(path):
        return None
    name = os.path.basename(path)
    meant = spelling.trimmed(name)
    if meant != name:
        return (
            f"{path!r}: the {what} file's name begins or ends with whitespace or an invisible character (a "
            f"location pasted or read with its newline, or a file's byte-order mark?), so it would be a new file "
            f"apart from {meant!r}: give the name without it; nothing was written"
        )
    twin = _twin(path)
    if twin is not None:
        return (
            f"{path!r}: no {what} file of this name is there, but {twin!r} is, and its name is this one in another "
            "Unicode spelling (composed against decomposed accents, or an invisible character inside), which the "
            "file system keeps as another file: give the name as that file has it (or rename it first), so the runs "
            "in it are not run again in a new one; nothing was written"
        )
    absolute = os.path.abspath(path)
    directory = os.path.dirname(absolute)
    while os.path.dirname(directory) != directory:  # each directory on the way, up to (not) the root
        twin = _twin(directory)
        there = twin and os.path.join(os.path.dirname(directory), twin, os.path.relpath(absolute, directory))
        if there and os.path.lexists(there):
            return (
                f"{path!r}: no {what} file is there, but {there!r} is: the same location with its directory "
                f"{os.path.basename(directory)!r} in another Unicode spelling (composed against decomposed accents, "
                "or an invisible character inside), a directory apart that every listing shows alike: give the "
                "location through the directory that holds the file, so its runs are not run again in a new one; "
                "nothing was written"
            )
        directory = os.path.dirname(directory)
    return None


def refuse_ambiguous(path: str, what: str) -> None:
    """``BadInput`` for an empty location; ``LocationAmbiguous`` for a URL, a connection string in keyword
    form, or a new file whose name is not the one meant (``new_name_refusal``): by the text alone, before anything
    (SQLite, a trace) opens it."""
    if not path:  # (an unset variable's text) realpath("") is the working directory: said as what it is not
        raise BadInput(f"{path!r} is empty, not a location of a {what}; nothing was written")
    if is_url(path):
        raise LocationAmbiguous(url_refusal(path, what))
    if is_conninfo(path):
        raise LocationAmbiguous(
            f"{masked(path)}: a PostgreSQL connection string in keyword form, not a {what} file: give it as a "
            "postgresql:// URL (or a file of that name as ./NAME); nothing was written"
        )
    refusal = new_name_refusal(path, what)
    if refusal is not None:
        raise LocationAmbiguous(refusal)


def refuse_clash(path: str, what: str) -> None:
    """``SidecarClash`` if ``path`` (a ``what``: journal, effect store, fleet store) is another SQLite
    file's sidecar, or if one of its own sidecar names holds a database of its own; ``NotARegularFile`` if
    ``path`` is a device, FIFO or socket (``/dev/null``: SQLite made ``/dev/null-journal`` beside the
    device before failing with "disk I/O error"); ``JournalUnreadable`` if it is a file that is not SQLite
    (``notes.txt``: SQLite made ``notes.txt-wal`` beside it before failing). ``LocationAmbiguous`` for a
    URL, a connection string in keyword form, or a new file whose name is not the one meant
    (``refuse_ambiguous``). A directory is left to its opener's own message."""
    refuse_ambiguous(path, what)
    try:
        mode = os.stat(path).st_mode
    except OSError:
        mode = None  # not there (yet): made as a regular file by its opener
    if mode is not None and not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise NotARegularFile(
            f"{path}: a device, FIFO or socket, not a {what} file (give it a file's path); nothing was written"
        )
    refuse_misleading(path, what)
    if mode is not None and stat.S_ISREG(mode) and os.path.realpath(path) in _mount_points():
        raise FileBindMounted(
            f"{path}: the file is bind-mounted on its own ({os.path.realpath(path)} is a mount point): SQLite keeps "
            f"the {what}'s WAL beside the name it opens, so each place the file is mounted would have a WAL of its "
            "own; mount the directory that holds it instead; nothing was written"
        )
    with filelocks.no_opens():  # see no_opens: another thread's SQLite must not open the file mid-check
        if mode is not None and stat.S_ISREG(mode) and os.access(path, os.R_OK) and not _database(path, empty_too=True):
            # SQLite would find out only after putting a -wal beside it: the directory changed by bad input
            # (a file this process may not read is left to its opener, which says why)
            raise JournalUnreadable(
                f"{path}: not an effectlog {what} (the file is not a SQLite database); nothing was written"
            )
        _refuse_sidecar_clash(path, what)


def _refuse_sidecar_clash(path: str, what: str) -> None:
    for name in dict.fromkeys((path, os.path.realpath(path))):
        if filelocks.open_here(name):
            # Open here already, so checked at that open; and its sidecars are its own now, locked by
            # SQLite in this process: reading one would close a descriptor of it (see _database).
            continue
        for suffix in SUFFIXES:
            if name.endswith(suffix) and _database(name[: -len(suffix)], empty_too=True):
                raise SidecarClash(
                    f"{path}: this name is SQLite's {suffix[1:]} file of {name[: -len(suffix)]}, which SQLite "
                    f"overwrites and deletes; give the {what} a name of its own; nothing was written"
                )
            if _database(name + suffix, empty_too=False):
                raise SidecarClash(
                    f"{path}: {name + suffix} is a database of its own, and SQLite would take it for this "
                    f"{what}'s {suffix[1:]} file (overwrite and delete it); move it away or give the {what} "
                    "another name; nothing was written"
                )

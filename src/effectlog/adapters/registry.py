"""Where adapters come from: built-ins, the ``effectlog.adapters`` entry-point group,
and user code named as ``module:attr`` (a mapping of type name to factory).

A factory is ``factory(decl, context) -> adapter``.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Mapping
from importlib.metadata import EntryPoint, entry_points
from typing import Any, NamedTuple

import msgspec

from effectlog.adapters.effects import ControlEffects, EffectStore, IdempotentEffects
from effectlog.adapters.noop import NoopAdapter
from effectlog.adapters.protocol import implementation_fingerprint
from effectlog.adapters.shell import ShellAdapter
from effectlog.errors import AdapterNotFound, BadInput
from effectlog.events import AdapterIdentity, EffectStoreIdentity
from effectlog.plan import AdapterDecl, Plan


class AdapterContext(msgspec.Struct, kw_only=True):
    """What factories may need from the runtime: the effect store location, for the built-ins."""

    effects: str | None = None
    read_only: bool = False  # reconciliation: the store is evidence, opened without writing a byte
    _store: EffectStore | None = None
    asks: int = 0  # calls of effect_store(): Registry.build tells which factories asked for the store

    def effect_store(self) -> EffectStore:
        self.asks += 1
        if self.effects is None:
            raise BadInput("this plan uses effects.* adapters: give an effect store (--effects FILE)")
        if self._store is None:
            self._store = EffectStore(self.effects, read_only=self.read_only)
        return self._store

    def pinned_store(self) -> EffectStoreIdentity | None:
        """The identity of the effect store the adapters opened (None if none did)."""
        return self._store.identity if self._store is not None else None

    def store_to_pin(self) -> EffectStoreIdentity | None:
        """The identity of the effect store this run is given, opened now if no factory opened it: what
        a run pins, and what a resume or a fork is checked against (None without ``effects``).

        An adapter may open the store on its first call rather than in its factory; a run that
        pinned only stores factories opened pinned none then, and a resume given another store
        sent the step's key again where it was unknown. Not counted in ``asks``: opening it here
        makes no adapter one whose effects are the store's rows."""
        if self.effects is not None and self._store is None:
            asks = self.asks
            self.effect_store()
            self.asks = asks
        return self.pinned_store()

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None


Factory = Callable[[AdapterDecl, AdapterContext], Any]

BUILTINS: dict[str, Factory] = {
    "effects.idempotent": lambda decl, ctx: IdempotentEffects(ctx.effect_store()),
    "effects.control": lambda decl, ctx: ControlEffects(ctx.effect_store()),
    "shell": lambda decl, ctx: ShellAdapter(decl.options),
    "noop": lambda decl, ctx: NoopAdapter(),
}


def load_object(spec: str) -> Any:
    """Import ``module:attr`` (attr may be dotted)."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise BadInput(f"{spec!r}: expected module:attr")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise AdapterNotFound(f"{spec}: cannot import {module_name!r} ({exc})") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise AdapterNotFound(f"{spec}: {module_name!r} has no attribute {attr!r}") from None
    return obj


class Built(NamedTuple):
    """A plan's adapters, built: by name, their pinned identities, and which asked for the effect store."""

    adapters: dict[str, Any]
    identities: dict[str, AdapterIdentity]
    store_users: tuple[str, ...]


class Registry:
    """Adapter factories by type name.

    Third-party entry points (group ``effectlog.adapters``) are listed up front but imported
    only when a plan names their type: one broken package cannot break plans that do not
    use it, and a plan that does gets one line naming the distribution and the error.
    """

    def __init__(self, factories: Mapping[str, Factory] | None = None, *, entry_point_group: bool = True) -> None:
        self.factories: dict[str, Factory] = dict(BUILTINS)
        self._entry_points: dict[str, EntryPoint] = {}
        if entry_point_group:
            for ep in entry_points(group="effectlog.adapters"):
                self._entry_points.setdefault(ep.name, ep)
        self.factories.update(factories or {})

    def factory(self, type_name: str) -> Factory | None:
        """The factory for ``type_name`` (importing its entry point now if it has one), or None."""
        found = self.factories.get(type_name)
        if found is not None:
            return found
        ep = self._entry_points.get(type_name)
        if ep is None:
            return None
        try:
            loaded: Factory = ep.load()
        except (Exception, SystemExit) as exc:
            dist = f"distribution {ep.dist.name} {ep.dist.version}" if ep.dist is not None else "unknown distribution"
            detail = " ".join(f"{type(exc).__name__}: {exc}".split())
            raise AdapterNotFound(
                f"adapter type {type_name!r} from {dist} (entry point {ep.name} = {ep.value}) "
                f"cannot be loaded: {detail}"
            ) from None
        self.factories[type_name] = loaded
        return loaded

    def add_module(self, spec: str) -> None:
        obj = load_object(spec)
        if not isinstance(obj, Mapping):
            raise BadInput(f"--adapters {spec}: expected a mapping of adapter type to factory")
        self.factories.update(obj)

    def build(self, plan: Plan, context: AdapterContext) -> Built:
        """Instantiate every adapter the plan declares, with the identity that gets pinned, and
        the names of those whose factory asked for the effect store (their effects are its rows)."""
        adapters: dict[str, Any] = {}
        identities: dict[str, AdapterIdentity] = {}
        store_users: list[str] = []
        for name, decl in plan.adapters.items():
            asks = context.asks
            adapters[name], identities[name] = self.build_one(name, decl, context)
            if context.asks != asks:
                store_users.append(name)
        return Built(adapters, identities, tuple(store_users))

    def build_one(self, name: str, decl: AdapterDecl, context: AdapterContext) -> tuple[Any, AdapterIdentity]:
        """One adapter the plan declares (reconciliation builds only the step's own)."""
        factory = self.factory(decl.type)  # an entry point is imported only now, when a plan names it
        if factory is None:
            raise AdapterNotFound(
                f"adapters.{name}: no adapter of type {decl.type!r} is registered (give --adapters MODULE:ATTR)"
            )
        adapter = factory(decl, context)
        identity = AdapterIdentity(
            type=decl.type,
            version=decl.version,
            idempotent=decl.idempotent,
            fingerprint=cached_fingerprint(adapter),
        )
        return adapter, identity


# implementation_fingerprint by adapter class, with the identity of its module's file when it was read:
# (path, mtime ns, size, inode, device). A run actor builds its adapters per run, and reading and hashing
# the module's source each time was ~17 µs of every fleet attempt.
_FINGERPRINTS: dict[type, tuple[tuple[str, int, int, int, int], str]] = {}


def _file_identity(path: str) -> tuple[str, int, int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (path, st.st_mtime_ns, st.st_size, st.st_ino, st.st_dev)


def cached_fingerprint(adapter: object) -> str:
    """``implementation_fingerprint(adapter)``, read again only when the class's module file changed.

    The fingerprint hashes the module's source as it is on disk, so the cache is keyed by that
    file's path, modification time (ns), size, inode and device, looked up on every call: an
    edited, replaced or renamed-over file is read and hashed again. An explicit ``fingerprint``
    attribute is the adapter's own (no cache); so is a class whose module has no file.
    """
    explicit = getattr(adapter, "fingerprint", None)
    cls = type(adapter)
    path = getattr(sys.modules.get(cls.__module__), "__file__", None)
    if (isinstance(explicit, str) and explicit) or not isinstance(path, str):
        return implementation_fingerprint(adapter)
    before = _file_identity(path)
    known = _FINGERPRINTS.get(cls)
    if known is not None and before is not None and known[0] == before:
        return known[1]
    fingerprint = implementation_fingerprint(adapter)
    if before is not None and _file_identity(path) == before:  # unchanged while it was read
        _FINGERPRINTS[cls] = (before, fingerprint)
    return fingerprint

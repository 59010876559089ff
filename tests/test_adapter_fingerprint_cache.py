"""The adapter fingerprint pinned by a run is read from the module's source once per version of the file
(``registry.cached_fingerprint``): built again with the file unchanged, the cached one; with the file
edited (even to the same size), replaced or touched, the new source's fingerprint.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from effectlog.adapters import registry
from effectlog.adapters.protocol import implementation_fingerprint
from effectlog.adapters.registry import AdapterContext, Registry
from effectlog.plan import AdapterDecl

SOURCE = '''
class Tool:
    """version {v}"""

    def invoke(self, request):
        return {{"v": "{v}"}}


def factory(decl, context):
    return Tool()


ADAPTERS = {{"tool": factory}}
'''


@pytest.fixture
def module(tmp_path: Path) -> Iterator[Path]:
    """A user module of adapters, importable as ``fp_cache_tools``."""
    path = tmp_path / "fp_cache_tools.py"
    path.write_text(SOURCE.format(v="a"))
    sys.path.insert(0, str(tmp_path))
    try:
        yield path
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("fp_cache_tools", None)


def built(reg: Registry) -> str:
    """The fingerprint a run would pin for the ``tool`` adapter."""
    _, identity = reg.build_one("t", AdapterDecl(type="tool"), AdapterContext())
    return identity.fingerprint


def test_an_unchanged_module_is_read_once_and_pins_what_reading_it_gives(
    module: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three builds with the file unchanged: the source is read and hashed once, and every build pins
    exactly what ``implementation_fingerprint`` gives."""
    reg = Registry()
    reg.add_module("fp_cache_tools:ADAPTERS")
    reads: list[object] = []

    def counted(adapter: object) -> str:
        reads.append(adapter)
        return implementation_fingerprint(adapter)

    monkeypatch.setattr(registry, "implementation_fingerprint", counted)
    fingerprints = [built(reg) for _ in range(3)]
    tool = importlib.import_module("fp_cache_tools").Tool()
    assert ([implementation_fingerprint(tool)] * 3, 1) == (fingerprints, len(reads))


@pytest.mark.parametrize("change", ["same size, new time", "other size, same time", "replaced by rename"])
def test_a_changed_module_file_is_read_again(module: Path, change: str) -> None:
    """After the module's file changed on disk (its source edited to the same length with a new modification
    time, edited to another length with the old time put back, or replaced by a renamed new file), the
    next build pins the new source's fingerprint, as reading it afresh gives."""
    reg = Registry()
    reg.add_module("fp_cache_tools:ADAPTERS")
    first = built(reg)
    stat = module.stat()
    if change == "same size, new time":
        module.write_text(SOURCE.format(v="b"))
        os.utime(module, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    elif change == "other size, same time":
        module.write_text(SOURCE.format(v="longer"))
        os.utime(module, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    else:
        fresh = module.with_name("fp_cache_tools.new")
        fresh.write_text(SOURCE.format(v="renamed"))
        os.utime(fresh, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        os.replace(fresh, module)
    second = built(reg)
    tool = importlib.import_module("fp_cache_tools").Tool()
    assert first != second
    assert implementation_fingerprint(tool) == second

"""An installed wheel works on its own: it ships the specs, py.typed and the console script."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_ships_the_specs_and_loads_them_without_the_source_tree(tmp_path: Path) -> None:
    """A built wheel contains effectlog/specs/*.toml and py.typed, and its spec loader uses them."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert 0 == done.returncode, done.stderr[-2000:]
    wheel = next(tmp_path.glob("effectlog-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"effectlog/specs/step.toml", "effectlog/specs/run.toml", "effectlog/py.typed"} <= names
    assert {"effectlog/console/templates/run.html", "effectlog/console/static/console.css"} <= names  # issue 15
    assert any(n.endswith("entry_points.txt") for n in names)
    unpacked = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(unpacked)
    probe = subprocess.run(
        [sys.executable, "-c", "import effectlog.spec as s; print(s.specs_dir()); print(s.load('step').states)"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(unpacked)},
    )
    assert 0 == probe.returncode, probe.stderr
    assert str(unpacked / "effectlog" / "specs") == probe.stdout.splitlines()[0]
    assert "uncertain" in probe.stdout

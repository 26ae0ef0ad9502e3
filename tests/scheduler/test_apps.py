"""load_app: ``module:attr`` to the app, for ``chronoq run`` and the Spark commands."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from scheduler import Scheduler
from scheduler.apps import AppNotFound, load_app


@pytest.fixture
def app_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A directory on sys.path for throwaway app modules (removed from sys.modules after)."""
    monkeypatch.syspath_prepend(str(tmp_path))
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        if name.startswith("chronoq_test_app"):
            del sys.modules[name]


def _write(app_dir: Path, name: str, apps: int) -> None:
    lines = ["from scheduler import Scheduler"]
    lines += [f"app{i} = Scheduler('rocksdb://{app_dir / f'd{i}'}')" for i in range(apps)]
    (app_dir / f"{name}.py").write_text("\n".join(lines) + "\n")


def test_attr_and_the_only_scheduler(app_dir: Path) -> None:
    _write(app_dir, "chronoq_test_app_one", 1)
    app = load_app("chronoq_test_app_one")
    assert isinstance(app, Scheduler)
    assert load_app("chronoq_test_app_one:app0") is app


@pytest.mark.parametrize(
    ("target", "apps", "fragment"),
    [
        ("chronoq_test_app_missing", 0, "cannot import 'chronoq_test_app_missing'"),
        ("chronoq_test_app_two:nope", 2, "has no 'nope'"),
        ("chronoq_test_app_two", 2, "has 2 Scheduler objects; name one"),
        ("chronoq_test_app_none", 0, "has 0 Scheduler objects"),
    ],
)
def test_what_is_not_an_app(app_dir: Path, target: str, apps: int, fragment: str) -> None:
    if "missing" not in target:
        _write(app_dir, target.partition(":")[0], apps)
    with pytest.raises(AppNotFound, match=fragment) as info:
        load_app(target)
    assert info.value.target == target and isinstance(info.value, LookupError)


def test_the_command_line_says_it_with_its_name(app_dir: Path) -> None:
    from workers.cli import load_app as cli_load_app

    with pytest.raises(SystemExit, match="^chronoq run: cannot import 'chronoq_test_app_gone'"):
        cli_load_app("chronoq_test_app_gone")

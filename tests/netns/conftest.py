"""The :func:`lab` fixture: namespaced hosts ``R``, ``A``, ``B``, always removed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.netns.lab import Lab, require_netns


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    """Hosts ``R``, ``A``, ``B`` on one bridge (skips without ``ip netns``, fails under
    ``CI=true``); every process and namespace is removed after the test, also when it
    failed."""
    require_netns()
    lab = Lab(tmp_path)
    try:
        yield lab.start()
    finally:
        lab.close()

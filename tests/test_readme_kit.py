"""The README's "Testing your app" example, run from the README itself.

The fenced block under that heading is written to a file and run as a real
pytest session (``pytester``) with the plugin chronoq installs: README and test
cannot drift apart, and the example must pass.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_kit_example() -> str:
    """The first ```python block after the "Testing your app" heading."""
    text = README.read_text(encoding="utf-8")
    start = text.index("### Testing your app")
    found = re.search(r"```python\n(.*?)```", text[start:], re.DOTALL)
    assert found is not None, "no python block under 'Testing your app'"
    return found.group(1)


def test_the_readme_example_is_a_short_test_of_the_order_workflow() -> None:
    source = readme_kit_example()
    body = source[source.index("def test_") :]
    assert len(body.strip().splitlines()) <= 11  # the test itself: ten lines and its def
    for step in ("advance(minutes=29)", "ABORTED", "advance(minutes=30)"):
        assert step in body


def test_the_readme_example_passes(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_orders=readme_kit_example())
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-W", "error")
    result.assert_outcomes(passed=1)


def test_the_readme_example_fails_when_the_workflow_is_wrong(pytester: pytest.Pytester) -> None:
    """It is a real test: a job that closes paid orders too makes it fail."""
    broken = readme_kit_example().replace(
        'key="order:42")\n', 'key="order:42")\n    close_order.schedule(42)\n', 1
    )
    assert broken != readme_kit_example()
    pytester.makepyfile(test_orders=broken)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)

"""Full-size model tests (``@pytest.mark.slow``) run only when asked for with ``-m slow``."""

from pathlib import Path

import pytest

_HERE = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "slow" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="full-size model: run with -m slow")
    for item in items:
        if item.get_closest_marker("slow") and _HERE in Path(item.path).parents:
            item.add_marker(skip)

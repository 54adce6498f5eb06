"""Long tests get time limits that scale with their length (`tests/conftest.py`)."""

from __future__ import annotations

import pytest

from tests.conftest import BUSY_MACHINE_FACTOR


@pytest.mark.slow(seconds=100)
def test_a_long_test_gets_a_limit_of_its_length_times_the_busy_machine_factor(
    request: pytest.FixtureRequest,
) -> None:
    marker = request.node.get_closest_marker("timeout")
    assert marker is not None and marker.args[0] == BUSY_MACHINE_FACTOR * 100


def test_a_short_test_keeps_the_suites_limit(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("timeout") is None
    assert float(request.config.getini("timeout")) == 300

"""Shared test settings: a Hypothesis profile that keeps property tests quick and repeatable.

``HYPOTHESIS_PROFILE=explore`` draws fresh random examples (and more of them) instead of the
fixed, derandomized set the default ``ci`` profile runs.
"""

import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

TESTS = str(Path(__file__).resolve().parent)

settings.register_profile(
    "ci",
    deadline=None,
    max_examples=25,
    derandomize=True,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "explore",
    deadline=None,
    max_examples=100,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))



@pytest.fixture
def fake_tasks_importable(monkeypatch):
    """Side-task processes import the fake tasks from tests/ (harvest_fixtures)."""
    monkeypatch.setenv("PYTHONPATH", TESTS + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if TESTS not in sys.path:
        monkeypatch.syspath_prepend(TESTS)

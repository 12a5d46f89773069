"""Shared test settings: a Hypothesis profile that keeps property tests quick and repeatable.

``HYPOTHESIS_PROFILE=explore`` draws fresh random examples (and more of them) instead of the
fixed, derandomized set the default ``ci`` profile runs.
"""

import os

from hypothesis import HealthCheck, settings

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


"""Hypothesis profiles: `ci` (the default) is derandomized with a bounded example count;
ACCY_PROPERTY_EXAMPLES=N runs N examples per property with fresh randomness."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_examples = os.environ.get("ACCY_PROPERTY_EXAMPLES")
settings.register_profile(
    "accy",
    max_examples=int(_examples) if _examples else 40,
    derandomize=not _examples,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
settings.load_profile("accy")

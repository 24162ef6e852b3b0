"""Hypothesis profiles of the fuzz suite: `ci` (bounded, the default) and `long` (AGL_FUZZ_PROFILE=long)."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_SLOW_OK = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large]
settings.register_profile("ci", max_examples=40, deadline=None, suppress_health_check=_SLOW_OK, derandomize=True)
settings.register_profile("long", max_examples=2000, deadline=None, suppress_health_check=_SLOW_OK)
PROFILE = os.environ.get("AGL_FUZZ_PROFILE", "ci")
settings.load_profile(PROFILE)

"""Shared by the interop tests: every test runs once per broker runtime.

The broker binary is started with `--runtime NAME` for each of RUNTIMES, so one pytest run
covers tokio and smol (test ids end in `[tokio]` / `[smol]`). FELIX_RUNTIME narrows the run
to one runtime.
"""

import os

import pytest

RUNTIMES = ["tokio", "smol"]


def broker_runtimes():
    only = os.environ.get("FELIX_RUNTIME")
    if only:
        if only not in RUNTIMES:
            raise ValueError(f"FELIX_RUNTIME={only!r}: expected one of {RUNTIMES}")
        return [only]
    return RUNTIMES


@pytest.fixture(scope="module", params=broker_runtimes())
def runtime(request):
    """The broker runtime under test."""
    return request.param


def runs_on(log, runtime):
    """Whether the broker's log says it listens on `runtime` (logs are plain: NO_COLOR)."""
    return f"runtime={runtime}" in log or f'runtime="{runtime}"' in log

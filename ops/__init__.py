"""Operator tools: the `rollout` CLI (ops.cli), the incident drills (ops.drill), the offline
regression gate (ops.verify), the benchmarks (ops.bench), the load-generation library and load
test (ops.load), the generators of shipped files (ops.generate), scripts and configuration for
running the gateway.

Tools that moved into a wing keep their old name: `python -m ops.loadtest` runs
`ops.load.loadtest`, and so on for every name in MOVED (an import of the old name gets the
module at its new place). New code and docs use the new names.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys

MOVED = {
    "ops.loadtest": "ops.load.loadtest",
    "ops.measure": "ops.drill.measure",
    "ops.overhead": "ops.bench.overhead",
    "ops.bench_series": "ops.bench.series_cost",
    "ops.gate_sim": "ops.bench.gate_sim",
    "ops.make_regression_set": "ops.generate.regression_set",
    "ops.make_messy_set": "ops.generate.messy_set",
    "ops.settings_doc": "ops.generate.settings_doc",
}


class MovedFinder(importlib.abc.MetaPathFinder):
    """Finds a moved tool under its old name: the new module's source, loaded as the old name
    (so `python -m` runs it as `__main__`, and an import of the old name works)."""

    def find_spec(self, fullname, path=None, target=None):
        new = MOVED.get(fullname)
        if new is None:
            return None
        found = importlib.util.find_spec(new)
        return importlib.util.spec_from_file_location(fullname, found.origin)


if not any(isinstance(finder, MovedFinder) for finder in sys.meta_path):
    sys.meta_path.append(MovedFinder())

"""Incident drills against a running gateway (`python -m ops.drill SCENARIO`, ops.drill.command).

`main` runs the command line and returns its exit code; `build_parser` is its parser;
`SCENARIOS` maps each scenario's name to its module; `run_one` runs one scenario into a report.
"""

from ops.drill.command import SCENARIOS, build_parser, main, run_one

__all__ = ["SCENARIOS", "build_parser", "main", "run_one"]

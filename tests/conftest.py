"""Shared by every tier: each test's tier marker, from its folder; and the tests' own cache folder,
so built artifacts (serve.recipes.artifact), `auto` choices (serve.recipes.auto.choose) and plans
never mix with the user's ~/.cache, nor a run with another. A crash in native code prints the
crashing thread's stack only, so that it stays within what CI shows of a run's output."""

import faulthandler
import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
# a folder of tests/ each, and the marker (registered in pyproject.toml) of every test in it
TIERS = ("unit", "integration", "e2e")


@pytest.hookimpl(tryfirst=True)  # before `-m` selects on the markers
def pytest_collection_modifyitems(items):
    """Marks each test under tests/ with its folder's tier. A test outside the tier folders, or a
    file that sets a tier mark itself, stops the run: a mark a file can forget, or get wrong, is a
    tier a test can leak out of."""
    for item in items:
        if not item.path.is_relative_to(HERE):
            continue
        where = item.path.relative_to(HERE)
        tier = where.parts[0] if len(where.parts) > 1 else None
        if tier not in TIERS:
            raise pytest.UsageError(
                f"tests/{where.as_posix()} is in no tier folder: move it to "
                + ", ".join(f"tests/{name}" for name in TIERS[:-1]) + f" or tests/{TIERS[-1]}")
        for marked in (name for name in TIERS if item.get_closest_marker(name)):
            raise pytest.UsageError(
                f"tests/{where.as_posix()} sets the tier mark {marked}: its folder sets the tier "
                f"(tests/{tier}); drop the mark, or move the file")
        item.add_marker(tier)


@pytest.hookimpl(trylast=True)  # after pytest's faulthandler plugin enables its own
def pytest_configure(config):
    """pytest's faulthandler dumps every thread (Ray's, gRPC's, pools'), which pushes the one that
    crashed out of a truncated log. The dump goes to a copy of standard error taken now, as the
    plugin's does: once a test runs, descriptor 2 is pytest's capture."""
    faulthandler.enable(file=os.dup(sys.stderr.fileno()), all_threads=False)


@pytest.fixture(scope="session", autouse=True)
def _own_cache(tmp_path_factory):
    before = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))
    yield
    if before is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = before


@pytest.fixture(scope="session")
def small_lm(tmp_path_factory) -> Path:
    """The project's small causal LM (ops.generate.small_lm), trained once per test run (the
    run's own cache holds it); `CANARY_TEST_SMALL_LM`, a folder that command built, skips the
    training in repeated local runs."""
    from ops.generate.small_lm import MARKER, build

    given = os.environ.get("CANARY_TEST_SMALL_LM")
    if given:
        if not (Path(given) / MARKER).is_file():
            raise pytest.UsageError(f"CANARY_TEST_SMALL_LM={given}: not a folder that "
                                    "`python -m ops.generate.small_lm DIR` built")
        return Path(given)
    folder = tmp_path_factory.mktemp("small-lm") / "model"
    build(folder)
    return folder

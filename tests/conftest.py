"""Shared by every tier: the tests' own cache folder, so built artifacts (serve.recipes.artifact),
`auto` choices (serve.recipes.auto.choose) and plans never mix with the user's ~/.cache, nor a run
with another."""

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def _own_cache(tmp_path_factory):
    before = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))
    yield
    if before is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = before

"""What the end-to-end modules share: `auto`'s cache, measured once on the first start of the
session and warm for every later one, as on a user's machine."""

import pytest


@pytest.fixture(scope="session")
def auto_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")  # a new user's: `auto` measures, artifacts built

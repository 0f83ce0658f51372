"""The tiers: each test's marker comes from its folder (tests/conftest.py), and a unit test is
refused Ray and any connection beyond the loopback (tests/unit/conftest.py). The fence is shown
here in the test itself; both conftests also run in a pytest of their own over a small tree that
holds copies of them and of pyproject.toml: a test of each tier, and the mistakes that stop a
run. And pyproject.toml's warning filters: a deprecation fails the run in the project's own
modules, and is ignored in the listed dependencies'."""

from __future__ import annotations

import builtins
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import tomllib
import warnings
from pathlib import Path

import pytest

from tests.unit.conftest import UnitTierError, is_loopback

ROOT = Path(__file__).resolve().parents[2]
OUTSIDE = [("192.0.2.1", 80), ("203.0.113.7", 443), ("example.invalid", 80), ("0.0.0.0", 80)]


def test_ray_and_serve_are_refused(unit_fence):
    import ray
    from ray import serve

    for start, name in ((ray.init, r"ray\.init"), (serve.start, r"ray\.serve\.start"),
                        (serve.run, r"ray\.serve\.run")):
        with pytest.raises(UnitTierError, match=rf"{name}\(\) in a unit test: .*tests/integration"):
            start()
    assert not ray.is_initialized() and len(unit_fence.refused) == 3
    unit_fence.refused.clear()  # refused on purpose: the fixture would fail the test for them


def test_this_test_has_the_unit_mark_from_its_folder(request):
    assert [mark.name for mark in request.node.iter_markers()
            if mark.name in ("unit", "integration", "e2e")] == ["unit"]


@pytest.mark.parametrize("address", OUTSIDE)
def test_outside_connections_are_refused(unit_fence, address):
    with pytest.raises(UnitTierError, match="a socket connection to"):
        socket.create_connection(address, timeout=0.1)
    with socket.socket() as sock:
        for connect in (sock.connect, sock.connect_ex):
            with pytest.raises(UnitTierError, match="in a unit test"):
                connect(address)
    assert len(unit_fence.refused) == 3
    unit_fence.refused.clear()


def test_loopback_and_unix_sockets_are_not(tmp_path):
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        for host in ("127.0.0.1", "localhost"):
            socket.create_connection((host, port), timeout=2).close()
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(tmp_path / "s"))
        server.listen()
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(str(tmp_path / "s"))


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.3.2.1", True), ("::1", True), ("::ffff:127.0.0.1", True),
    ("localhost", True), ("LocalHost.", True), (b"127.0.0.1", True),
    ("10.0.0.5", False), ("0.0.0.0", False), ("::", False), ("fe80::1%eth0", False),
    ("db", False), ("", False), (None, False),
])
def test_loopback_is_the_loopback_only(host, loopback):
    assert is_loopback(host) is loopback


# --- the warning filters ----------------------------------------------------------------------


def warning_filters() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return config["tool"]["pytest"]["ini_options"]["filterwarnings"]


def apply(line: str) -> None:
    """One `action:message:category:module` line as pytest applies an ini line (regexes, the
    last line applied first)."""
    action, message, category, module = (line.split(":") + [""] * 4)[:4]
    warnings.filterwarnings(action, message, getattr(builtins, category or "Warning"), module)


@pytest.mark.parametrize(("module", "fails"), [
    ("rollout", True), ("rollout.ramp.controller", True), ("serve.gateway.deployment", True),
    ("ops.cli.kill", True), ("tests.unit.test_tiers", True),
    ("ray.serve._private.config", False), ("pydantic._internal._fields", False),
    ("torch.jit._script", False), ("torchao.quantization", False), ("websockets.legacy", False),
    ("a_new_dependency.module", True),  # an unlisted dependency's deprecation fails too
])
def test_deprecations_fail_in_our_modules_and_in_no_listed_dependency(module, fails):
    for category in (DeprecationWarning, PendingDeprecationWarning):
        with warnings.catch_warnings(record=True) as shown:
            warnings.resetwarnings()
            for line in warning_filters():
                apply(line)
            if fails:
                with pytest.raises(category):
                    warnings.warn_explicit("old", category, "m.py", 1, module=module, registry={})
            else:
                warnings.warn_explicit("old", category, "m.py", 1, module=module, registry={})
                assert shown == []


def test_both_deprecation_categories_ignore_the_same_modules():
    ignored = {line.split(":")[2]: line.split(":")[3] for line in warning_filters()
               if line.startswith("ignore::") and "Deprecation" in line}
    assert ignored["DeprecationWarning"] == ignored["PendingDeprecationWarning"]


# --- the two conftests in a pytest of their own ------------------------------------------------

UNIT_TEST = """
import socket
import sys

import pytest


def test_ray_imported_during_the_test_is_refused(unit_fence):
    assert "ray" not in sys.modules  # the fence itself never imports it
    import ray

    with pytest.raises(RuntimeError, match="unit test"):
        ray.init()
    unit_fence.refused.clear()


def test_a_refusal_the_code_swallows_fails_at_teardown():
    try:
        socket.create_connection(("192.0.2.1", 80), timeout=0.1)
    except Exception:
        pass
"""

INTEGRATION_TEST = """
import socket

import _socket


def test_not_fenced():
    import ray

    assert ray.init is ray._private.worker.init
    assert socket.socket.connect is _socket.socket.connect
    assert socket.create_connection.__module__ == "socket"
"""


def tree(root: Path, files: dict[str, str]) -> Path:
    """A project of the real conftests and pyproject.toml, the tier packages and `files`."""
    for name in ("pyproject.toml", "tests/conftest.py", "tests/unit/conftest.py"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, root / name)
    for package in ("tests", "tests/unit", "tests/integration", "tests/e2e"):
        (root / package).mkdir(parents=True, exist_ok=True)
        (root / package / "__init__.py").touch()
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text))
    return root


def pytest_in(root: Path, *args: str) -> subprocess.CompletedProcess:
    """pytest over `root`, without the installed plugins (none is needed; they take seconds)."""
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
                          cwd=root, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})


def test_each_test_has_its_folders_tier(tmp_path):
    root = tree(tmp_path, {"tests/unit/test_a.py": "def test_a(): pass\n",
                           "tests/integration/test_b.py": "def test_b(): pass\n",
                           "tests/e2e/test_c.py": "def test_c(): pass\n"})
    for tier, test in (("unit", "tests/unit/test_a.py::test_a"),
                       ("integration", "tests/integration/test_b.py::test_b"),
                       ("e2e", "tests/e2e/test_c.py::test_c")):
        run = pytest_in(root, "tests", "-m", tier, "--collect-only", "-q")
        assert run.returncode == 0, run.stdout + run.stderr
        assert [line for line in run.stdout.splitlines() if "::" in line] == [test]


def test_the_fence_holds_in_unit_tests_and_nowhere_else(tmp_path):
    root = tree(tmp_path, {"tests/unit/test_a.py": UNIT_TEST,
                           "tests/integration/test_b.py": INTEGRATION_TEST})
    # the unit tests first: the integration test then also shows the fence was taken down
    run = pytest_in(root, "tests/unit", "tests/integration", "-rA")
    out = run.stdout
    assert "PASSED tests/unit/test_a.py::test_ray_imported_during_the_test_is_refused" in out, out
    assert "ERROR tests/unit/test_a.py::test_a_refusal_the_code_swallows_fails_at_teardown" in out
    assert ("the unit tier's fence refused: a socket connection to ('192.0.2.1', 80) in a unit "
            "test" in out), out
    assert "PASSED tests/integration/test_b.py::test_not_fenced" in out, out
    assert "3 passed, 1 error" in out, out  # the swallowing test passes, then errs


LEFT_RUNNING = """
import sys
import types


def test_leaves_ray_running():  # as a fixture of a wider scope than its tier would
    sys.modules["ray"] = types.SimpleNamespace(is_initialized=lambda: True, init=None)
"""


def test_a_ray_left_running_by_an_earlier_tier_fails_each_unit_test(tmp_path):
    root = tree(tmp_path, {"tests/integration/test_b.py": LEFT_RUNNING,
                           "tests/unit/test_a.py": "def test_a(): pass\n"})
    run = pytest_in(root, "tests/integration", "tests/unit", "-rA")
    assert "PASSED tests/integration/test_b.py::test_leaves_ray_running" in run.stdout, run.stdout
    assert "ERROR tests/unit/test_a.py::test_a" in run.stdout, run.stdout
    assert "Ray is still running in this process, left by an earlier tier's" in run.stdout


@pytest.mark.parametrize(("name", "text", "message"), [
    ("tests/perf/test_d.py", "def test_d(): pass\n",
     "tests/perf/test_d.py is in no tier folder: move it to tests/unit, tests/integration or "
     "tests/e2e"),
    ("tests/unit/test_e.py", "import pytest\npytestmark = pytest.mark.integration\n"
     "def test_e(): pass\n",
     "tests/unit/test_e.py sets the tier mark integration: its folder sets the tier"),
], ids=["outside the tiers", "a tier mark"])
def test_a_test_outside_the_tiers_or_a_tier_mark_in_a_file_stops_the_run(tmp_path, name, text,
                                                                          message):
    run = pytest_in(tree(tmp_path, {name: text}), "tests", "--collect-only", "-q")
    assert run.returncode == pytest.ExitCode.USAGE_ERROR
    assert message in run.stderr, run.stderr

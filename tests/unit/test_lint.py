"""The lint gate: `ops/test.sh` runs `ruff check .` with the project's rules before pytest, and a
finding fails the run before any test starts. The script runs here in a scratch tree with the
real ruff and a stand-in for the installer and for pytest, so nothing is installed or tested."""

import os
import re
import subprocess
import tomllib
from pathlib import Path

import pytest
from ruff.__main__ import find_ruff_bin

ROOT = Path(__file__).resolve().parents[2]
RECORDING_PYTHON = '#!/usr/bin/env bash\necho "$@" >> "$(dirname "$0")/../../pytest-args"\n'


def _scratch_tree(tmp_path: Path, source: str) -> Path:
    """A copy of the test command over one Python file `source`, the project's ruff rules, a
    no-op setup and a `.venv/bin` whose `ruff` is the real one and whose `python` only records
    its arguments."""
    (tmp_path / "ops").mkdir()
    (tmp_path / "ops" / "test.sh").write_text((ROOT / "ops" / "test.sh").read_text())
    (tmp_path / "ops" / "setup.sh").write_text("exit 0\n")
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    (tmp_path / "module.py").write_text(source)
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "ruff").symlink_to(find_ruff_bin())
    (bin_dir / "python").write_text(RECORDING_PYTHON)
    (bin_dir / "python").chmod(0o755)
    return tmp_path


def _run_test_command(tree: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUFF_")}
    return subprocess.run(["bash", str(tree / "ops" / "test.sh"), *args], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=60)


def test_a_long_line_fails_the_test_command_before_pytest(tmp_path):
    tree = _scratch_tree(tmp_path, f"VALUE = {'1' * 100}\n")
    result = _run_test_command(tree)
    assert result.returncode == 1
    assert "E501" in result.stdout + result.stderr
    assert not (tree / "pytest-args").exists(), "pytest ran although the lint failed"


def test_a_clean_tree_goes_on_to_pytest_with_the_arguments(tmp_path):
    tree = _scratch_tree(tmp_path, "VALUE = 1\n")
    result = _run_test_command(tree, "tests/unit", "-q")
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tree / "pytest-args").read_text() == "-m pytest tests/unit -q\n"


@pytest.mark.parametrize("source, rule", [
    ("import os\nimport sys\n\nprint(zip(sys.argv, os.sep))\n", "B905"),
    ("from enum import Enum\n\n\nclass Arm(str, Enum):\n    A = 'a'\n", "UP042"),
])
def test_the_project_rules_reach_beyond_pycodestyle(tmp_path, source, rule):
    tree = _scratch_tree(tmp_path, source)
    result = _run_test_command(tree)
    assert result.returncode == 1 and rule in result.stdout


def test_the_installed_ruff_is_the_pinned_one():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = [r for r in extras["optional-dependencies"]["test"] if r.startswith("ruff")]
    assert len(pins) == 1 and re.fullmatch(r"ruff==[\d.]+", pins[0]), pins
    version = subprocess.run([find_ruff_bin(), "--version"], capture_output=True, text=True,
                             check=True).stdout.split()[-1]
    assert pins[0] == f"ruff=={version}", "reinstall the test extra: bash ops/setup.sh --tests"


def test_the_script_takes_ruff_and_python_from_the_venv_and_lints_first():
    # the scratch runs above put their stand-ins in .venv/bin: the real script must look there
    script = (ROOT / "ops" / "test.sh").read_text()
    assert 'export PATH="$root/.venv/bin:$PATH"' in script
    assert script.index("ruff check") < script.index("python -m pytest")

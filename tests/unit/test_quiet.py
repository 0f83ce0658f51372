"""A model load and trace as a replica does them (serve.recipes.variants) says nothing of
third-party deprecations and GPU kernels on the console (serve.common.quiet), in a process
that logs every warning to stderr; the same load with the filter emptied does, so the check
can fail."""

import re
import subprocess
import sys
from pathlib import Path

from tests.tiny_model import make_tiny_encoder

ROOT = Path(__file__).resolve().parents[2]
LOAD = """
import logging, sys
logging.basicConfig(level=logging.WARNING)
import serve.common.quiet as quiet
if sys.argv[2] == "loud":
    quiet.NOISE.clear()
from rollout.settings import Settings
from serve.recipes.variants import Variant
from tests.variant_settings import groups
Variant(groups(Settings(model_path=sys.argv[1])), "baseline")  # loaded, then traced
print("built")
"""
NOISY = re.compile(r"deprecat|\w*Warning:|loss_type|Failed to load", re.IGNORECASE)


def _console(model: Path, mode: str) -> str:
    done = subprocess.run([sys.executable, "-c", LOAD, str(model), mode], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "built" in done.stdout, done.stderr
    return done.stderr


def test_loading_and_tracing_a_model_keeps_the_console_free_of_third_party_noise(tmp_path):
    model = make_tiny_encoder(tmp_path / "enc")
    assert NOISY.search(_console(model, "loud"))  # what the filter is for
    quiet = _console(model, "quiet")
    assert not [line for line in quiet.splitlines() if NOISY.search(line)], quiet

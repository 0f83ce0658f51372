"""The README documents every setting, and names the two quick-start commands that exist."""

from pathlib import Path

from rollout import Settings

ROOT = Path(__file__).resolve().parents[2]


def test_every_setting_is_documented():
    readme = (ROOT / "README.md").read_text()
    for name in Settings.model_fields:
        variable = "REDIS_URL" if name == "redis_url" else f"CANARY_{name.upper()}"
        assert f"`{variable}`" in readme, f"{variable} missing from README"


def test_quick_start_scripts_exist_and_are_executable():
    readme = (ROOT / "README.md").read_text()
    for script in ("ops/run.sh", "ops/test.sh"):
        assert script in readme
        assert (ROOT / script).stat().st_mode & 0o111

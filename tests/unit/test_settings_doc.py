"""docs/settings.md's table is generated from the settings' descriptions
(ops.generate.settings_doc)."""

from __future__ import annotations

import difflib

import pytest

from ops.generate import settings_doc
from rollout import Settings
from rollout.settings import SETTING_GROUPS


def test_the_documented_table_is_the_generated_one():
    page = settings_doc.PAGE.read_text(encoding="utf-8")
    wanted = settings_doc.replace_table(page, settings_doc.render())

    diff = "".join(difflib.unified_diff(page.splitlines(keepends=True),
                                        wanted.splitlines(keepends=True)))
    assert page == wanted, f"run python -m ops.generate.settings_doc:\n{diff}"


def test_every_setting_has_a_row_under_its_group():
    table = settings_doc.render()
    rows = [line for line in table.splitlines() if line.startswith("| `")]

    assert len(rows) == len(Settings.model_fields)
    for group in SETTING_GROUPS:
        section = settings_doc.group_section(group)
        assert section[0] == "## " + group.__doc__.strip().splitlines()[0]
        assert all(f"`{settings_doc.variable(name)}`" in "\n".join(section)
                   for name in group.model_fields)


def test_a_row_shows_variable_default_values_and_description():
    rows = {line.split(" | ")[0]: line for line in settings_doc.render().splitlines()}

    assert rows["| `REDIS_URL`"].startswith("| `REDIS_URL` | `redis://127.0.0.1:6379/0` |  | ")
    assert rows["| `CANARY_STATE_POLL_S`"] == (
        "| `CANARY_STATE_POLL_S` | `1` | 0 < x ≤ 60 | fallback poll of the rollout state |")
    assert "| `info`, `warning`, `critical` |" in rows["| `CANARY_WEBHOOK_MIN_SEVERITY`"]
    assert "| none | 16–256 characters |" in rows["| `CANARY_OPERATOR_TOKEN`"]
    assert "| `1,8,32` |" in rows["| `CANARY_VERIFY_BATCH_SIZES`"]
    assert "| empty |" in rows["| `CANARY_ROUTING_SALT`"]
    assert "`f(text) -> str \\| None`" in rows["| `CANARY_FLIP_REDACT`"]  # a pipe is escaped


PAGE = """# Settings

intro
<!-- settings-table:start -->
| old | table |
<!-- settings-table:end -->

after
"""


def test_only_the_marked_region_is_replaced():
    assert settings_doc.replace_table(PAGE, "NEW") == (
        "# Settings\n\nintro\n<!-- settings-table:start -->\n\nNEW\n\n"
        "<!-- settings-table:end -->\n\nafter\n")


@pytest.mark.parametrize("page", ["# no markers\n", "<!-- settings-table:end -->\n"
                                  "<!-- settings-table:start -->\n"])
def test_a_page_without_the_markers_is_refused(page):
    with pytest.raises(ValueError, match="settings-table:start"):
        settings_doc.replace_table(page, "NEW")


def test_check_exits_1_with_a_diff_and_the_command_rewrites_the_page(tmp_path, capsys):
    page = tmp_path / "settings.md"
    page.write_text(PAGE, encoding="utf-8")

    assert settings_doc.main(["--check", "--page", str(page)]) == 1
    out = capsys.readouterr()
    assert "-| old | table |" in out.out and "+| `REDIS_URL`" in out.out
    assert "python -m ops.generate.settings_doc" in out.err
    assert page.read_text(encoding="utf-8") == PAGE  # --check writes nothing

    assert settings_doc.main(["--page", str(page)]) == 0
    assert settings_doc.main(["--check", "--page", str(page)]) == 0
    text = page.read_text(encoding="utf-8")
    assert text.startswith("# Settings\n\nintro\n") and text.endswith("\n\nafter\n")


def test_a_page_without_markers_exits_2(tmp_path, capsys):
    page = tmp_path / "settings.md"
    page.write_text("# no table\n", encoding="utf-8")

    assert settings_doc.main(["--check", "--page", str(page)]) == 2
    assert "settings-table:start" in capsys.readouterr().err

"""The README and docs/ document every setting and every `rollout` command, and name only ones that
exist; every docs page is linked from the table of contents; docs/layout.md names every module;
the README names the two quick-start commands, and they exist."""

import argparse
import re
from pathlib import Path

from pydantic import AliasChoices

from ops.cli.args import build_parser
from rollout import Settings

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PACKAGES = ("rollout", "serve", "ops")
# `rollout COMMAND [SUBCOMMAND]` where a reader would type it: at the start of a code span or
# line, or after a shell separator
TYPED_COMMAND = re.compile(r"(?:^|[;&|(`]\s*)rollout ([a-z][a-z-]*)(?: ([a-z][a-z-]*))?")


def _documentation() -> str:
    """The README and every page under docs/, as one text."""
    pages = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
    return "\n".join(page.read_text() for page in pages)


def _code(text: str) -> list[str]:
    """What a reader would type: inline code spans and the lines of fenced code blocks."""
    fenced = re.findall(r"^```[^\n]*\n(.*?)^```", text, re.M | re.S)
    outside = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.M | re.S)
    return [*re.findall(r"`([^`\n]+)`", outside), *(line for block in fenced
                                                      for line in block.splitlines())]


def _setting_variables() -> dict[str, set[str]]:
    """Each setting's documented variable -> every variable that sets it (aliases too)."""
    variables = {}
    for name, field in Settings.model_fields.items():
        main = "REDIS_URL" if name == "redis_url" else f"CANARY_{name.upper()}"
        aliases = {main}
        if isinstance(field.validation_alias, AliasChoices):
            aliases |= {alias.upper() for alias in field.validation_alias.choices
                        if isinstance(alias, str)}
        variables[main] = aliases
    return variables


def _commands() -> dict[str, set[str]]:
    """`rollout`'s commands -> their subcommands (empty for a command without any)."""
    commands = {}
    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, parser in action.choices.items():
                commands[name] = {sub for inner in parser._actions
                                  if isinstance(inner, argparse._SubParsersAction)
                                  for sub in inner.choices}
    return commands


def test_every_setting_is_documented():
    settings_page = (DOCS / "settings.md").read_text()
    for variable in _setting_variables():
        assert f"`{variable}`" in settings_page, f"{variable} missing from docs/settings.md"


def test_every_documented_setting_exists():
    known = set().union(*_setting_variables().values())
    named = set(re.findall(r"\bCANARY_[A-Z0-9_]*[A-Z0-9]\b(?![_*])", _documentation()))
    assert named <= known, f"documented settings that do not exist: {sorted(named - known)}"


def test_every_rollout_command_is_documented():
    text = _documentation()
    for command, subcommands in _commands().items():
        assert f"rollout {command}" in text, f"`rollout {command}` is not documented"
        for sub in subcommands:
            assert f"rollout {command} {sub}" in text, f"`rollout {command} {sub}` undocumented"


def test_every_documented_rollout_command_exists():
    commands = _commands()
    for snippet in _code(_documentation()):
        for command, sub in TYPED_COMMAND.findall(snippet.strip()):
            assert command in commands, f"documented `rollout {command}` does not exist: {snippet}"
            if commands[command] and sub:
                assert sub in commands[command], f"`rollout {command} {sub}` does not exist"


def test_every_docs_page_is_linked_from_the_table_of_contents():
    contents = (DOCS / "README.md").read_text()
    linked = set(re.findall(r"\]\(([^)#\s]+\.md)(?:#[^)]*)?\)", contents))
    pages = {page.relative_to(DOCS).as_posix() for page in DOCS.rglob("*.md")} - {"README.md"}
    assert pages <= linked, f"docs pages not linked from docs/README.md: {sorted(pages - linked)}"
    assert "(docs/README.md)" in (ROOT / "README.md").read_text()


def test_relative_links_in_the_docs_point_at_files_and_headings():
    for page in [ROOT / "README.md", *DOCS.rglob("*.md")]:
        for target, anchor in re.findall(r"\]\((?!https?:|mailto:)([^)#\s]*)(?:#([^)\s]+))?\)",
                                         page.read_text()):
            path = (page.parent / target).resolve() if target else page
            assert path.exists(), f"{page.relative_to(ROOT)}: link to missing {target}"
            if anchor:
                assert anchor in _anchors(path), f"{page.relative_to(ROOT)}: no #{anchor} there"


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors of a markdown page (headings inside code blocks excluded)."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    headings = re.findall(r"^#{1,6} (.+)$", text, re.M)
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
            for heading in headings}


def test_the_layout_page_names_every_module():
    """docs/layout.md has one section per package (a heading naming it, e.g. `rollout/ramp/`),
    and each section names its package's modules."""
    sections = re.split(r"^## ", (DOCS / "layout.md").read_text(), flags=re.M)
    by_package = {}
    for section in sections[1:]:
        heading = re.match(r"`([\w/]+/)`", section)
        if heading:
            by_package[heading.group(1)] = section
    missing = []
    for package in PACKAGES:
        for module in sorted((ROOT / package).rglob("*.py")):
            if module.name in ("__init__.py", "__main__.py"):
                continue
            folder = module.parent.relative_to(ROOT).as_posix() + "/"
            if f"`{module.name}`" not in by_package.get(folder, ""):
                missing.append(module.relative_to(ROOT).as_posix())
    assert not missing, f"modules not named in their package's section of docs/layout.md: {missing}"


def test_quick_start_scripts_exist_and_are_executable():
    readme = (ROOT / "README.md").read_text()
    for script in ("ops/run.sh", "ops/test.sh"):
        assert script in readme
        assert (ROOT / script).stat().st_mode & 0o111

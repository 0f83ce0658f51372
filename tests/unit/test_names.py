"""A module name says what it holds: no base name (a module's file name, a package's folder name)
is used for two different things in rollout/, serve/ and ops/.

A name is reused only for one concept in two layers (its logic in rollout/, its adapter in
serve/ or its command in ops/, its settings group in rollout/settings/) or one role in two
wings; those names are listed below and, in the same words, in the "Same concept, two layers"
section of docs/layout.md, which is parsed here so that the two lists cannot drift.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("rollout", "serve", "ops")
SECTION = "## Same concept, two layers"

SAME_CONCEPT = {
    "admission": {"rollout/settings/admission.py", "serve/gateway/admission.py"},
    "batching": {"rollout/settings/batching.py", "serve/common/batching.py"},
    "checks": {"rollout/ramp/checks.py", "serve/control_plane/checks.py"},
    "command": {"ops/drill/command.py", "ops/verify/command.py"},
    "control": {"rollout/control.py", "rollout/ramp/control.py"},
    "controller": {"rollout/ramp/controller.py", "serve/control_plane/controller.py"},
    "errors": {"rollout/errors.py", "serve/common/errors.py", "serve/dashboard/errors.py",
               "ops/cli/errors.py"},
    "flips": {"rollout/flips.py", "ops/cli/flips.py"},
    "ramp": {"rollout/ramp/", "rollout/settings/ramp.py", "serve/dashboard/ramp.py",
             "ops/cli/ramp.py"},
    "recipes": {"rollout/settings/recipes.py", "serve/recipes/"},
    "redis_store": {"rollout/redis_store.py", "rollout/ramp/redis_store.py",
                    "rollout/telemetry/redis_store.py"},
    "report": {"ops/bench/report.py", "ops/verify/report.py"},
    "shadow": {"rollout/shadow.py", "rollout/settings/shadow.py", "serve/gateway/shadow.py"},
    "slices": {"rollout/slices.py", "ops/cli/slices.py"},
    "state": {"rollout/state.py", "rollout/settings/state.py"},
    "store": {"rollout/store.py", "rollout/ramp/store.py"},
    "telemetry": {"rollout/telemetry/", "rollout/settings/telemetry.py", "serve/telemetry/",
                  "ops/cli/telemetry.py"},
    "verify": {"rollout/settings/verify.py", "ops/verify/"},
    "webhooks": {"rollout/settings/webhooks.py", "serve/control_plane/webhooks.py"},
}


def base_names(root: Path, packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    """Base name -> where it is used: `a/b.py` for a module, `a/b/` for a package."""
    found: dict[str, set[str]] = defaultdict(set)
    for package in packages:
        for path in (root / package).rglob("*.py"):
            relative = path.relative_to(root)
            if path.name == "__init__.py":
                found[path.parent.name].add(relative.parent.as_posix() + "/")
            elif path.name != "__main__.py":
                found[path.stem].add(relative.as_posix())
    return dict(found)


def reused(names: dict[str, set[str]]) -> dict[str, set[str]]:
    return {name: where for name, where in names.items() if len(where) > 1}


def documented_pairs(layout: str) -> dict[str, set[str]]:
    """The "Same concept, two layers" list of docs/layout.md: one `- `name`: paths` item per
    name; the paths are the code spans that hold a `/`."""
    assert SECTION in layout, f"docs/layout.md has no {SECTION!r} section"
    section = re.split(r"^## ", layout.split(SECTION, 1)[1], flags=re.M)[0]
    pairs = {}
    for item in re.findall(r"^- (.*?)(?=^- |\Z)", section, flags=re.M | re.S):
        name = re.match(r"`(\w+)`:", item)
        assert name, f"an item of {SECTION!r} does not start with `name`: {item[:60]!r}"
        pairs[name.group(1)] = {span for span in re.findall(r"`([^`]+)`", item) if "/" in span}
    return pairs


def test_no_base_name_names_two_different_things():
    found = reused(base_names(ROOT))
    unlisted = {name: sorted(where) for name, where in found.items() if name not in SAME_CONCEPT}
    assert not unlisted, (
        f"module names used for two things: {unlisted}; rename one so that its name says what "
        f"it holds (git mv), or, if it is one concept in two layers, add it to SAME_CONCEPT here "
        f"and to the {SECTION!r} section of docs/layout.md")
    stale = {name: (sorted(where), sorted(found.get(name, ())))
             for name, where in SAME_CONCEPT.items() if found.get(name) != where}
    assert not stale, f"SAME_CONCEPT (listed, found) no longer matches the tree: {stale}"


def test_the_same_concept_list_is_the_one_in_docs_layout():
    documented = documented_pairs((ROOT / "docs" / "layout.md").read_text())
    both = documented.keys() & SAME_CONCEPT.keys()
    assert documented == SAME_CONCEPT, (
        f"docs/layout.md {SECTION!r} and SAME_CONCEPT in {Path(__file__).name} differ: "
        f"only in the docs {sorted(documented.keys() - SAME_CONCEPT.keys())}, "
        f"only here {sorted(SAME_CONCEPT.keys() - documented.keys())}, "
        f"other paths {sorted(n for n in both if documented[n] != SAME_CONCEPT[n])}")


def test_a_reused_module_or_package_name_is_found(tmp_path):
    for relative in ("a/plan.py", "b/c/plan.py", "b/kill/__init__.py", "a/kill.py",
                     "a/__main__.py", "b/__main__.py", "a/only.py"):
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text("")
    assert reused(base_names(tmp_path, ("a", "b"))) == {
        "plan": {"a/plan.py", "b/c/plan.py"}, "kill": {"a/kill.py", "b/kill/"}}


def test_the_docs_list_is_parsed_item_by_item():
    layout = (f"# Layout\n\n{SECTION}\n\nIntro naming `a/x.py`.\n\n"
              "- `plan`: `a/plan.py` (one),\n  `b/plan.py` (two).\n"
              "- `kill`: `a/kill.py`, `b/kill/`.\n"
              "\n## `tests/`\n\n- `x/y.py`\n")
    assert documented_pairs(layout) == {"plan": {"a/plan.py", "b/plan.py"},
                                        "kill": {"a/kill.py", "b/kill/"}}

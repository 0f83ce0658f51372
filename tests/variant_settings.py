"""A variant's settings groups taken from one whole `Settings`, as the composition roots pass
them (serve.recipes.variants.VariantSettings), for tests that configure arms with
`Settings(...)`."""

from __future__ import annotations

from rollout import Settings
from rollout.settings import ModelSettings, RecipeSettings, VerifySettings
from serve.recipes.source import versions
from serve.recipes.variants import VariantSettings


def groups(settings: Settings) -> VariantSettings:
    """`settings` as each group a variant reads."""
    return VariantSettings(settings, settings, settings, settings)


def versions_of(settings: Settings) -> dict[str, str]:
    """The versions both arms will report (serve.recipes.source.versions), from `settings`."""
    return versions(settings, settings, settings)


def auto_groups(settings: Settings) -> tuple[ModelSettings, RecipeSettings, VerifySettings]:
    """`settings` as each group `auto` reads (serve.recipes.auto.choose: the model's, building
    the recipe's, verify's)."""
    return settings, settings, settings

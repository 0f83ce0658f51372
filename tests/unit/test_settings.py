"""The one settings object (rollout.settings): defaults, environment, validation."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pydantic
import pytest

from rollout import Settings
from rollout.settings import DEFAULT_LABELS


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    """No CANARY_* or REDIS_URL from the machine running the tests leaks into them."""
    for name in list(os.environ):
        if name.upper().startswith("CANARY_") or name.upper() == "REDIS_URL":
            monkeypatch.delenv(name)


def field_errors(info: pytest.ExceptionInfo) -> str:
    """Every error location and message, as one string to search for a field's name."""
    return " | ".join(f"{e['loc']}: {e['msg']}" for e in info.value.errors())


# --- defaults ------------------------------------------------------------------------------------


def test_defaults_are_valid():
    settings = Settings()

    assert settings.redis_url == "redis://127.0.0.1:6379/0"
    assert settings.app_name == "default"
    assert settings.labels == DEFAULT_LABELS
    assert settings.state_staleness_s > settings.state_poll_s
    assert settings.max_item_chars <= settings.max_total_chars
    assert settings.label_template.count("{}") == 1


def test_settings_are_immutable():
    settings = Settings()

    with pytest.raises(pydantic.ValidationError):
        settings.app_name = "other"


# --- environment ---------------------------------------------------------------------------------


def test_environment_variables_with_the_canary_prefix_are_read(monkeypatch):
    monkeypatch.setenv("CANARY_MAX_BATCH_SIZE", "32")
    monkeypatch.setenv("CANARY_APP_NAME", "shop-ranker")
    monkeypatch.setenv("CANARY_STATE_POLL_S", "0.5")
    monkeypatch.setenv("CANARY_ROUTING_SALT", "exp-7")
    monkeypatch.setenv("MAX_BATCH_SIZE", "99")  # unprefixed: not ours

    settings = Settings()

    assert settings.max_batch_size == 32
    assert settings.app_name == "shop-ranker"
    assert settings.state_poll_s == 0.5
    assert settings.routing_salt == "exp-7"


def test_redis_url_is_read_under_its_common_name(monkeypatch):
    monkeypatch.setenv("REDIS_URL", "redis://cache.internal:6380/2")

    assert Settings().redis_url == "redis://cache.internal:6380/2"


def test_redis_url_is_also_read_with_the_prefix(monkeypatch):
    monkeypatch.setenv("CANARY_REDIS_URL", "rediss://cache.internal:6380/2")

    assert Settings().redis_url == "rediss://cache.internal:6380/2"


def test_keyword_arguments_override_the_environment(monkeypatch):
    monkeypatch.setenv("CANARY_MAX_ITEMS", "10")

    assert Settings(max_items=20).max_items == 20


def test_an_invalid_environment_value_names_the_field(monkeypatch):
    monkeypatch.setenv("CANARY_MAX_BATCH_SIZE", "0")

    with pytest.raises(pydantic.ValidationError) as info:
        Settings()

    assert "max_batch_size" in field_errors(info)


# --- labels --------------------------------------------------------------------------------------


def test_labels_from_a_comma_separated_environment_variable(monkeypatch):
    monkeypatch.setenv("CANARY_LABELS", "spam, ham ,eggs")

    assert Settings().labels == ("spam", "ham", "eggs")


def test_labels_from_a_json_list_in_the_environment(monkeypatch):
    monkeypatch.setenv("CANARY_LABELS", '["good, really", "bad"]')

    assert Settings().labels == ("good, really", "bad")


def test_labels_from_a_python_list():
    assert Settings(labels=["positive", "negative"]).labels == ("positive", "negative")


@pytest.mark.parametrize(
    "labels",
    [
        "spam", "spam,", "spam,,ham", "spam, ,ham", "spam,spam", "spam, spam", "", '["only"]',
        "[]", '["a", "b"',
    ],
)
def test_invalid_labels_are_rejected(monkeypatch, labels):
    monkeypatch.setenv("CANARY_LABELS", labels)

    with pytest.raises(pydantic.ValidationError) as info:
        Settings()

    assert "labels" in field_errors(info)


@pytest.mark.parametrize("labels", [["only-one"], ["a", "a"], ["a", ""]])
def test_invalid_label_lists_are_rejected(labels):
    with pytest.raises(pydantic.ValidationError) as info:
        Settings(labels=labels)

    assert "labels" in field_errors(info)


# --- other checks --------------------------------------------------------------------------------


@pytest.mark.parametrize(("poll", "staleness"), [(1.0, 1.0), (5.0, 2.0)])
def test_staleness_must_exceed_the_poll_interval(poll, staleness):
    with pytest.raises(pydantic.ValidationError) as info:
        Settings(state_poll_s=poll, state_staleness_s=staleness)

    assert "state_staleness_s" in field_errors(info)


def test_an_item_cannot_exceed_the_request_limit():
    with pytest.raises(pydantic.ValidationError) as info:
        Settings(max_item_chars=1_000, max_total_chars=999)

    assert "max_item_chars" in field_errors(info)


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:6379/0", "127.0.0.1:6379", "", "redis:/127.0.0.1"]
)
def test_redis_url_must_use_a_redis_scheme(monkeypatch, url):
    monkeypatch.setenv("REDIS_URL", url)

    with pytest.raises(pydantic.ValidationError) as info:
        Settings()

    assert "redis_url" in field_errors(info).lower()


@pytest.mark.parametrize(
    "url", ["redis://127.0.0.1:6379/0", "rediss://:pw@cache:6380/1", "unix:///run/redis.sock"]
)
def test_redis_url_accepts_redis_schemes(url):
    assert Settings(redis_url=url).redis_url == url


@pytest.mark.parametrize("name", ["", "has space", "a/b", "a:b", "x" * 65, "ünï"])
def test_app_name_must_be_a_safe_key_segment(name):
    with pytest.raises(pydantic.ValidationError) as info:
        Settings(app_name=name)

    assert "app_name" in field_errors(info)


@pytest.mark.parametrize("name", ["a", "shop-ranker_v2.1", "x" * 64])
def test_app_name_accepts_letters_digits_and_separators(name):
    assert Settings(app_name=name).app_name == name


@pytest.mark.parametrize("template", ["This text is about it.", "{} and {}", "{0}", ""])
def test_label_template_needs_exactly_one_placeholder(template):
    with pytest.raises(pydantic.ValidationError) as info:
        Settings(label_template=template)

    assert "label_template" in field_errors(info)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_batch_size", 0), ("batch_wait_ms", -1), ("request_timeout_s", 0),
        ("model_num_cpus", -1), ("optimized_recipe", "int4"), ("device", "tpu"),
        ("routing_salt", "s" * 65), ("max_tokens", 4),
    ],
)
def test_out_of_range_fields_are_rejected_by_name(field, value):
    with pytest.raises(pydantic.ValidationError) as info:
        Settings(**{field: value})

    assert field in field_errors(info)


def test_threads_per_model():
    assert Settings(torch_threads=3).threads_per_model() == 3
    assert Settings().threads_per_model(replicas=10_000) == 1


def test_control_connection_defaults_to_redis_url_and_is_validated():
    plain = Settings(redis_url="redis://gateway:pw@h:6379/0")
    assert plain.control_settings().redis_url == "redis://gateway:pw@h:6379/0"
    split = Settings(redis_url="redis://gateway:pw@h:6379/0",
                     control_redis_url="rediss://controller:pw@h:6380/0")
    assert split.control_settings().redis_url == "rediss://controller:pw@h:6380/0"
    assert split.redis_url == "redis://gateway:pw@h:6379/0"
    with pytest.raises(pydantic.ValidationError, match="must start with redis://"):
        Settings(control_redis_url="http://h:6379")


def test_the_ramp_lease_must_outlive_the_controller_interval():
    assert Settings(ramp_interval_s=1, ramp_lease_ttl_s=3).ramp_lease_ttl_s == 3
    with pytest.raises(pydantic.ValidationError, match="ramp_lease_ttl_s must be longer"):
        Settings(ramp_interval_s=10, ramp_lease_ttl_s=10)


# --- groups --------------------------------------------------------------------------------------


def test_the_package_exports_every_public_name_of_its_modules():
    """One module per group; callers import from the package, so it exports each module's
    classes and constants (what the module itself defines, not what it imports)."""
    import rollout.settings as package

    defined = set()
    for path in Path(package.__file__).parent.glob("*.py"):
        for node in ast.parse(path.read_text()).body:
            targets = ([node] if isinstance(node, ast.ClassDef | ast.FunctionDef) else
                       getattr(node, "targets", [getattr(node, "target", None)]))
            defined |= {getattr(t, "id", getattr(t, "name", "")) for t in targets if t}
    public = {name for name in defined if name and not name.startswith("_")}
    assert sorted(package.__all__) == sorted(public)
    assert all(getattr(package, name) is not None for name in package.__all__)
    assert {group.__name__ for group in package.SETTING_GROUPS} <= set(package.__all__)


def test_settings_compose_the_groups_and_every_field_is_in_exactly_one():
    from rollout.settings import SETTING_GROUPS

    owners = {}
    for group in SETTING_GROUPS:
        for name in group.model_fields:
            owners.setdefault(name, []).append(group.__name__)
    assert {name: groups for name, groups in owners.items() if len(groups) > 1} == {}
    assert list(owners) == list(Settings.model_fields)  # the groups' order is the fields' order
    assert all(issubclass(Settings, group) for group in SETTING_GROUPS)


def test_every_field_and_group_says_what_it_is():
    from rollout.settings import SETTING_GROUPS

    assert [name for name, field in Settings.model_fields.items() if not field.description] == []
    for group in SETTING_GROUPS:
        title, blank, *body = (group.__doc__ or "").splitlines()
        assert title.strip() and not blank.strip() and " ".join(body).strip(), group.__name__


def test_a_group_reads_the_same_environment_alone(monkeypatch):
    from rollout.settings import RampSettings, StateSettings

    monkeypatch.setenv("CANARY_RAMP_INTERVAL_S", "2")
    monkeypatch.setenv("REDIS_URL", "redis://cache.internal:6380/2")

    assert RampSettings().ramp_interval_s == Settings().ramp_interval_s == 2
    assert StateSettings().redis_url == Settings().redis_url == "redis://cache.internal:6380/2"
    with pytest.raises(pydantic.ValidationError, match="ramp_lease_ttl_s must be longer"):
        RampSettings(ramp_lease_ttl_s=1)


def test_building_a_recipe_is_a_group_of_its_own_under_the_same_names(monkeypatch):
    from rollout.settings import ModelSettings, RecipeSettings

    monkeypatch.setenv("CANARY_ONNX_DIR", "/cache/onnx")
    monkeypatch.setenv("CANARY_HIDE_NATIVE_BF16", "true")

    assert RecipeSettings().onnx_dir == Settings().onnx_dir == "/cache/onnx"
    assert RecipeSettings().hide_native_bf16 and Settings().hide_native_bf16
    assert not set(RecipeSettings.model_fields) & set(ModelSettings.model_fields)


def test_checks_across_groups_hold_in_the_composed_settings():
    with pytest.raises(pydantic.ValidationError, match="cannot exceed gateway_max_ongoing"):
        Settings(gateway_max_in_flight=300, gateway_max_ongoing_requests=256)
    with pytest.raises(pydantic.ValidationError, match="max_batch_tokens must hold"):
        Settings(max_batch_tokens=100, max_tokens=256)

"""Settings where they are consumed: each component takes its group (rollout.settings).

A group instance has only its own fields, so a component built here from just the group(s) its
signature names fails with AttributeError the day it reads a field of another group. The last
test keeps the whole `Settings` at the composition roots, by reading the source (no imports).
"""

from __future__ import annotations

import ast
import asyncio
import io
import threading
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from rollout import MemoryStateStore, MemoryTelemetry, Settings, open_store, open_telemetry
from rollout.ramp import open_ramp_store
from rollout.settings import (
    AdmissionSettings,
    BatchingSettings,
    ModelSettings,
    RecipeSettings,
    ServingSettings,
    ShadowSettings,
    StateSettings,
    TelemetrySettings,
    VerifySettings,
    WebhookSettings,
)
from rollout.verdict import thresholds_from
from serve.control_plane.notify import start_notifications
from serve.control_plane.webhooks import sender_from
from serve.dashboard.reads import Readings
from serve.gateway import ingress
from serve.gateway.idempotent import Idempotency
from serve.gateway.preprocess import Preprocessor
from serve.gateway.schemas import max_body_bytes, parse_predict
from serve.gateway.shadow import Shadow, flip_capture
from serve.recipes import recipe_for, resolve_device
from serve.recipes.auto.choose import Hardware, cached_choice, choice_dir, choice_key
from serve.recipes.source import load_tokenizer, model_dir, versions
from serve.recipes.variants import Variant, VariantSettings
from serve.replica.model_server import startup_threads
from serve.telemetry.metrics_targets import MemoryTargetBook, ReplicaEndpoint
from serve.telemetry.otel import RequestLog, Telemetry
from tests.tiny_model import make_tiny_encoder

ROOT = Path(__file__).resolve().parents[2]


def test_a_group_has_only_its_own_fields():
    """What the tests below rely on."""
    with pytest.raises(AttributeError):
        ShadowSettings().max_items  # noqa: B018
    with pytest.raises(AttributeError):
        StateSettings().telemetry_flush_s  # noqa: B018


def test_request_path_components_read_only_their_groups():
    assert parse_predict(b'{"inputs": ["a"]}', AdmissionSettings()).inputs == ["a"]
    assert max_body_bytes(AdmissionSettings()) > 0
    assert flip_capture(ShadowSettings(flip_capture=True)).enabled
    Idempotency(StateSettings(), ServingSettings()).store.close()
    off = Telemetry(StateSettings(), TelemetrySettings(telemetry_enabled=False), "g")
    shadow = Shadow(ShadowSettings(shadow_share=1.0), None, off)
    assert not shadow.enabled  # telemetry off: no shadow, whatever the share


def test_telemetry_reads_the_telemetry_and_state_groups():
    class Store:
        def write(self, items):
            pass

    telemetry = Telemetry(StateSettings(app_name="groups"), TelemetrySettings(), "g",
                          prometheus=True, request_log=True, environ={}, store=Store(),
                          log_stream=io.StringIO())
    try:
        assert telemetry.registry is not None
    finally:
        telemetry.shutdown()
    RequestLog(TelemetrySettings(), io.StringIO())
    endpoint = ReplicaEndpoint.open(StateSettings(), TelemetrySettings(), CollectorRegistry(),
                                    MemoryTargetBook(), replica="r", node_ip="127.0.0.1")
    assert endpoint is not None and endpoint.target.labels["app"] == "default"
    endpoint.close()


def test_readings_and_stores_read_only_their_groups():
    readings = Readings(StateSettings(app_name="unit"), TelemetrySettings(device_hour_price=2),
                        MemoryStateStore(), MemoryTelemetry())
    assert readings.device_hour_price == 2 and readings.app == "unit"
    for store in (open_store(StateSettings()), open_ramp_store(StateSettings()),
                  open_telemetry(StateSettings(), TelemetrySettings())):
        store.close()
    assert thresholds_from(VerifySettings()).min_agreement == 0.98


def test_notifications_read_the_state_and_webhook_groups():
    sender = sender_from(WebhookSettings(webhook_urls="http://127.0.0.1:9/hook"))
    assert sender is not None
    sender.close()
    assert start_notifications(StateSettings(), WebhookSettings(), MemoryStateStore(),
                               leader=lambda: True, stop=threading.Event()) is None


def test_the_ingress_reads_the_admission_group_and_the_request_deadline(monkeypatch):
    class Open:
        def door(self, timeout_s):
            return None

        def enter(self):
            return None  # no slot: the request goes on without one

        def leave(self, slot):
            pass

    async def app(scope, receive, send):
        seen.append(scope[ingress.BODY])

    async def receive():
        return {"type": "http.request", "body": b"{}", "more_body": False}

    seen = []
    monkeypatch.setattr(ingress, "_gateway", ingress._Gateway())
    ingress.configure(AdmissionSettings(), ServingSettings(request_timeout_s=3), Open())
    scope = {"type": "http", "method": "POST", "path": ingress.SHED_PATH, "headers": []}
    asyncio.run(ingress.BodyGate(app)(scope, receive, None))
    assert seen == [b"{}"] and ingress._gateway.request_timeout_s == 3


def test_model_side_helpers_read_only_the_model_group(tmp_path):
    model = ModelSettings(model_path=str(make_tiny_encoder(tmp_path / "enc")), device="cpu")
    assert model_dir(model) == Path(model.model_path)
    assert resolve_device(model) == "cpu" and recipe_for("baseline", model, "cpu") == "fp32"
    assert startup_threads(ModelSettings(torch_threads=3)) == 3
    assert choice_dir(RecipeSettings(auto_choice_dir=str(tmp_path))) == tmp_path
    assert load_tokenizer(model)[1] > 0
    pre = Preprocessor(model, ServingSettings(gateway_tokenize_threads=1), [{"tokenizer": "x"}])
    assert not pre.enabled  # another tokenizer reported: texts are sent


def test_a_variant_reads_the_model_recipe_verify_and_batching_groups(tmp_path):
    model = ModelSettings(model_path=str(make_tiny_encoder(tmp_path / "enc")), device="cpu",
                          optimized_recipe="int8-dynamic")
    recipe = RecipeSettings(plan_dir=str(tmp_path / "plans"), auto_choice_dir=str(tmp_path))
    verify, batching = VerifySettings(), BatchingSettings(max_batch_tokens=64)
    variant = Variant(VariantSettings(model, recipe, verify, batching), "optimized")
    assert variant.served(["a short text", "word " * 40]).shape[0] == 2
    assert versions(model, recipe, verify)["optimized"] == variant.version
    aware = model.model_copy(update={"optimized_recipe": "accuracy-aware"})
    assert versions(aware, recipe, verify)["optimized"] is None  # no plan computed yet
    auto = model.model_copy(update={"optimized_recipe": "auto"})
    assert versions(auto, recipe, verify)["optimized"] is None  # nothing measured yet


def test_autos_key_is_the_same_from_the_groups_as_from_the_whole_settings(tmp_path):
    hardware, whole = Hardware("cpu", True, ("avx2",)), Settings()
    groups = (ModelSettings(), RecipeSettings(auto_choice_dir=str(tmp_path)), VerifySettings())
    key, _ = choice_key(*groups, weights="a" * 64, hardware=hardware)
    assert key == choice_key(whole, whole, whole, weights="a" * 64, hardware=hardware)[0]
    assert cached_choice(*groups, weights="a" * 64, device="cpu", hardware=hardware) is None


# --- the whole Settings only at the composition roots ------------------------------------------

# Where a parameter may be the whole `Settings`, and why. ops/ as a whole: every operator command
# loads Settings where it starts (its composition root) and hands groups to rollout/ and serve/.
WHOLE_SETTINGS_PACKAGES = {"ops/": "operator commands: each loads Settings where it starts"}
WHOLE_SETTINGS = {
    "serve/config.py:model_arms": "binds each arm's model deployment (a composition root) with "
    "the whole settings, for build()",
    "serve/gateway/generation.py:settings_for": "the gateway's whole settings as a generative "
    "model's requests read them (their own deadline): Gateway._open_arms' composition",
    "serve/config.py:build": "the application's composition root (`serve run serve.config:app`)",
    "serve/config.py:model_version": "hashes what a model replica is built with: the whole "
    "settings its composition root (ModelServer.__init__) is bound with",
    "serve/gateway/deployment.py:Gateway.__init__": "a gateway replica's composition root: Ray "
    "builds it from what build() binds, and it hands each component its groups",
    "serve/replica/model_server.py:ModelServer.__init__": "a model replica's composition root (as "
    "the gateway)",
    "serve/replica/generate_server.py:GenerateServer.__init__": "a generative arm's model "
    "replica's composition root (as ModelServer)",
    "serve/gateway/deployment.py:Gateway._open_arms": "hands the whole settings to "
    "serve.gateway.colocated.load (the colocated topology)",
    "serve/gateway/colocated.py:load": "builds both arms' ModelServer (composition roots) in a "
    "gateway replica",
    "serve/control_plane/controller.py:RampControllerDeployment.__init__": "the ramp controller "
    "replica's composition root (as the gateway)",
    "serve/recipes/auto/causal.py:resolve": "reads an arm's recipe and hands `auto` its three "
    "groups: the one entry a generative replica and verify share",
}


def _names_settings(annotation: ast.expr | None) -> bool:
    """Whether an annotation names the whole `Settings` (bare, dotted, in a union or quoted)."""
    if annotation is None:
        return False
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        return _names_settings(ast.parse(annotation.value, mode="eval").body)
    return any((isinstance(node, ast.Name) and node.id == "Settings")
               or (isinstance(node, ast.Attribute) and node.attr == "Settings")
               for node in ast.walk(annotation))


def _functions(tree: ast.Module):
    """(qualified name, function) of every function, methods as `Class.method`."""
    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield f"{prefix}{child.name}", child
                yield from walk(child, f"{prefix}{child.name}.")
    yield from walk(tree, "")


def whole_settings_parameters() -> dict[str, list[str]]:
    """`path:function` -> its parameters annotated as the whole Settings, or named `settings`
    without an annotation (an unnamed group), in rollout/, serve/ and ops/."""
    found: dict[str, list[str]] = {}
    for package in ("rollout", "serve", "ops"):
        for path in sorted((ROOT / package).rglob("*.py")):
            where = path.relative_to(ROOT).as_posix()
            if where.startswith("rollout/settings/"):
                continue
            for name, function in _functions(ast.parse(path.read_text(), str(path))):
                arguments = function.args
                for arg in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs):
                    if _names_settings(arg.annotation) or (
                            arg.annotation is None and arg.arg.endswith("settings")):
                        found.setdefault(f"{where}:{name}", []).append(arg.arg)
    return found


def test_the_checker_sees_bare_quoted_and_optional_settings():
    tree = ast.parse("class A:\n    def f(self, a: Settings, b: 'Settings | None', c: int,\n"
                     "          d: rollout.Settings, e: StateSettings): pass\n")
    ((name, function),) = list(_functions(tree))
    assert name == "A.f"
    assert [arg.arg for arg in function.args.args if _names_settings(arg.annotation)] == [
        "a", "b", "d"]


def test_only_composition_roots_take_the_whole_settings():
    found = whole_settings_parameters()
    unexpected = {where: args for where, args in found.items()
                  if where not in WHOLE_SETTINGS
                  and not where.startswith(tuple(WHOLE_SETTINGS_PACKAGES))}
    assert not unexpected, (
        f"take the group(s) you read, e.g. `settings: ShadowSettings` (rollout.settings), or "
        f"add the function to WHOLE_SETTINGS with a reason: {unexpected}")
    stale = set(WHOLE_SETTINGS) - set(found)
    assert not stale, f"these no longer take the whole Settings: drop them here: {stale}"

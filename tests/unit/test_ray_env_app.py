"""`serve run serve.config:app` by hand: the application builder sets Ray's environment for the
gateway (serve.ray_env) as defaults before `serve run` starts Ray, never over a value already
set, and leaves it alone when Ray is already up. Ray is never started here."""

import os

import pytest

from serve import config, ray_env


@pytest.fixture
def built(monkeypatch):
    """`app` with `build` replaced by the settings it would build from; the environment
    without Ray's variables for the gateway (restored afterwards)."""
    for name in (*ray_env.RAY_ENV, *ray_env.HAPROXY_PORTS):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(config, "build", lambda settings: settings)
    return monkeypatch


def test_before_ray_starts_the_defaults_are_set_and_the_users_values_win(built):
    built.setattr(config.ray, "is_initialized", lambda: False)
    built.setenv("RAY_SERVE_ENABLE_HA_PROXY", "0")
    settings = config.app({"max_batch_size": "32"})
    assert settings.max_batch_size == 32
    assert {name: os.environ[name] for name in ray_env.RAY_ENV} == {
        **ray_env.RAY_ENV, "RAY_SERVE_ENABLE_HA_PROXY": "0"}
    assert not set(ray_env.HAPROXY_PORTS) & set(os.environ)  # fixed ports, as ops/run.sh


def test_with_ray_already_up_the_environment_is_left_alone(built):
    built.setattr(config.ray, "is_initialized", lambda: True)
    config.app({})
    assert not set(ray_env.RAY_ENV) & set(os.environ)

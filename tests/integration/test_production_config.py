"""ops/serve-production.yaml is a valid Serve config whose args are valid settings."""

from pathlib import Path

import yaml

from rollout import Settings

CONFIG = Path(__file__).resolve().parents[2] / "ops" / "serve-production.yaml"


def test_production_config_is_valid():
    from ray.serve.schema import ServeDeploySchema

    raw = yaml.safe_load(CONFIG.read_text())
    schema = ServeDeploySchema.model_validate(raw)
    (application,) = schema.applications
    assert application.import_path == "serve.config:app"
    assert {d.name for d in application.deployments} == {
        "gateway", "baseline", "optimized", "ramp-controller"}
    settings = Settings(**application.args)
    assert settings.model_num_gpus == 0.25
    # its model deployments are the remote topology's
    assert settings.topology == "remote"
    # every model replica at its maximum fits on the node's one GPU
    models = [d for d in application.deployments if d.name in ("baseline", "optimized")]
    assert sum(d.autoscaling_config["max_replicas"] * d.ray_actor_options.num_gpus
               for d in models) <= 1

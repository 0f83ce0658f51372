"""The LitServe peer of `python -m ops.bench --peer` for real: started on loopback with the
packaged model, it answers one embedding, the gateway's own (its fp32 variant), and stops with
its whole process group. Needs the `peers` extra (`pip install -e '.[peers]'`; ops/setup.sh
--tests installs it)."""

import importlib.util
import os
from pathlib import Path

import httpx
import pytest

from ops.bench.peers import process
from ops.bench.peers.registry import PEERS, Launch
from serve.ray_env import free_port

pytestmark = pytest.mark.skipif(importlib.util.find_spec("litserve") is None,
                                reason="LitServe is not installed: pip install -e '.[peers]'")


def test_litserve_serves_the_packaged_model_as_the_gateway_embeds_it(tmp_path):
    import torch

    from rollout import Settings
    from serve.recipes.source import model_dir
    from serve.recipes.variants import Variant
    from tests.variant_settings import groups

    settings = Settings()
    peer, folder = PEERS["litserve"], model_dir(settings)
    text = "the canary answers like the baseline"
    with process.server(peer, Launch(folder, free_port(), Path("/none")),
                        tmp_path / "litserve.log") as running:
        answer = httpx.post(running.url + peer.route, json=peer.body([text]), timeout=30)
        group = os.getpgid(running.pid)
    assert answer.status_code == 200
    [row] = peer.vectors(answer.json())
    ours = Variant(groups(settings), "baseline", recipe="fp32").rows([text])[0]
    assert len(row) == ours.shape[0] == 384
    assert torch.nn.functional.cosine_similarity(torch.tensor(row), ours, dim=0) > 0.9999
    assert not process.group_alive(group)  # nothing of it is left

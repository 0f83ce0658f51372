"""The plan of `serve/`: a few composition modules at the top, the rest in wings by process
(the gateway's, the model replica's, the recipes, the control plane) over what both processes
share, each wing importing only the layers below its own; and no module or class grown past what
a reader takes in at once."""

from __future__ import annotations

import ast

import pytest

from tests.unit.test_imports import ROOT, import_graph

# Each part of serve/ and its layer: a module imports only modules of its own part or of a lower
# layer. The composition (serve.config) builds the application from every wing; the gateway
# calls the replicas (its colocated topology loads them), the control plane and the doors;
# recipes build what a replica runs (`auto` for a causal LM measures with the decode loop), and
# a causal LM's decode loop is what it runs per arm; telemetry and what both processes share sit
# below all.
LAYERS = {
    "serve.config": 6,
    "serve.gateway": 5,
    "serve.replica": 4,
    "serve.control_plane": 4,
    "serve.dashboard": 4,
    "serve.recipes": 3,
    "serve.telemetry": 2,
    "serve.generative": 2,
    "serve.local_start": 2,
    "serve.common": 1,
    "serve.ray_env": 1,
    "serve.haproxy_launcher": 1,
    "serve": 0,
}
MAX_TOP_LEVEL_MODULES = 8
MAX_MODULE_LINES = 500
MAX_GATEWAY_METHODS = 20


def part_of(module: str) -> str:
    """The entry of LAYERS a serve module belongs to (its wing, or itself at the top)."""
    parts = module.split(".")
    for size in range(len(parts), 1, -1):
        if ".".join(parts[:size]) in LAYERS:
            return ".".join(parts[:size])
    if module == "serve":
        return module
    raise KeyError(f"{module}: no layer in LAYERS (test_wings.py) holds it")


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """`a -> b` for every serve module importing a serve module of another part that is not in
    a lower layer."""
    found = []
    for module, targets in graph.items():
        if not module.startswith("serve"):
            continue
        mine = part_of(module)
        for target in sorted(t for t in targets if t.startswith("serve")):
            theirs = part_of(target)
            if theirs != mine and LAYERS[theirs] >= LAYERS[mine]:
                found.append(f"{module} -> {target}")
    return found


def test_the_upward_import_finder_finds_one():
    assert upward_imports({"serve.common.errors": {"serve.gateway.schemas"},
                           "serve.gateway.schemas": {"serve.common.errors"},
                           "serve.replica.model_server": {"serve.control_plane.notify"}}) == [
        "serve.common.errors -> serve.gateway.schemas",
        "serve.replica.model_server -> serve.control_plane.notify"]


def test_a_module_outside_every_layer_has_no_place():
    with pytest.raises(KeyError, match="serve.newwing.thing"):
        part_of("serve.newwing.thing")


def test_every_serve_module_has_a_place_in_the_layers():
    for module in import_graph():
        if module.startswith("serve"):
            part_of(module)  # raises for a new top-level module or wing nobody placed


def test_serve_wings_import_only_downward():
    found = upward_imports(import_graph())
    assert not found, "move what both use down a layer (serve.common), or the importer up: " + \
        "; ".join(found)


def test_serve_top_level_holds_few_modules_besides_its_wings():
    modules = sorted(p.name for p in (ROOT / "serve").glob("*.py"))
    assert len(modules) <= MAX_TOP_LEVEL_MODULES, modules


def test_no_module_is_longer_than_five_hundred_lines():
    long = {f"{path.relative_to(ROOT)}": lines
            for package in ("rollout", "serve", "ops") for path in (ROOT / package).rglob("*.py")
            if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, long


def test_the_gateway_has_few_methods():
    tree = ast.parse((ROOT / "serve" / "gateway" / "deployment.py").read_text())
    (gateway,) = [node for node in tree.body
                  if isinstance(node, ast.ClassDef) and node.name == "Gateway"]
    methods = [node.name for node in gateway.body
               if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)]
    assert len(methods) <= MAX_GATEWAY_METHODS, methods

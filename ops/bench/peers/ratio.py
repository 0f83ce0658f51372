"""The gateway against the fastest peer, cell by cell (`--peer`).

A *cell* is one request size at one concurrency, measured in the same run, with the same load
generator, on every peer, on plain Serve when `--plain` is given, and on each arm of the
gateway. Per cell:

- each side's texts/s answered 200 over the measured window and refused share (requests not
  answered 200 / sent: ops.bench.anchor), None when it sent nothing in the window;
- the fastest side of each recipe: `fp32` (LitServe, Infinity's torch engine, plain Serve) and
  `int8` (Infinity's ONNX engine and its int8 file);
- `baseline ÷ fastest fp32` (the 0 % arm serves the same fp32 model), and `optimized ÷ int8`
  and `optimized ÷ fastest fp32` (the 100 % arm serves the optimized recipe): above 1 the
  gateway is faster. None when either side answered nothing.

`geomeans`: the geometric mean of each ratio over the cells that have it.
"""

from __future__ import annotations

import math

from ops.bench import anchor

# the recipes each arm is compared with, in the table's order
COMPARED = {"baseline": ("fp32",), "optimized": ("int8", "fp32")}
PLAIN = "plain"


def _side(level: dict) -> dict:
    measured = level.get("sent") != 0
    return {"inputs_per_s": level["inputs_per_s"] if measured else None,
            "refused_share": anchor.refused_share(level)}


def _fastest(sides: dict[str, dict], names: list[str]) -> str | None:
    measured = [n for n in names if n in sides and sides[n]["inputs_per_s"]]
    return max(measured, key=lambda n: sides[n]["inputs_per_s"]) if measured else None


def recipes(result: dict) -> dict[str, str]:
    """The recipe of every peer side of `result`, plain Serve's (fp32) included."""
    found = {name: info["recipe"] for name, info in (result["meta"].get("peers") or {}).items()}
    if result.get("plain"):
        found[PLAIN] = "fp32"
    return found


def compare(result: dict) -> list[dict]:
    """One row per cell of the gateway's levels, in their order (module docstring)."""
    if not result.get("peers"):
        return []
    size = result["meta"]["inputs_per_request"]
    peers = {**result["peers"], **({PLAIN: result["plain"]} if result.get("plain") else {})}
    recipe = recipes(result)
    gateway = result.get("gateway") or {}
    keys = list(dict.fromkeys(anchor.cell(lv, size) for levels in gateway.values()
                              for lv in levels))
    rows = []
    for key in keys:
        sides = {name: _side(lv) for name, levels in peers.items() for lv in levels
                 if anchor.cell(lv, size) == key}
        arms = {arm: _side(lv) for arm, levels in gateway.items() for lv in levels
                if anchor.cell(lv, size) == key}
        fastest = {r: _fastest(sides, [n for n in sides if recipe.get(n) == r])
                   for r in ("fp32", "int8")}
        ratios = {}
        for arm, compared in COMPARED.items():
            if arm in arms:
                ratios[arm] = {r: _ratio(arms[arm], sides.get(fastest[r])) for r in compared}
        rows.append({"inputs_per_request": key[0], "concurrency": key[1], "sides": sides,
                     "arms": arms, "fastest": fastest, "ratios": ratios})
    return rows


def _ratio(arm: dict, side: dict | None) -> float | None:
    if not side or not side["inputs_per_s"] or arm["inputs_per_s"] is None:
        return None
    return arm["inputs_per_s"] / side["inputs_per_s"]


def geomeans(rows: list[dict]) -> dict[str, float]:
    """`<arm> ÷ <recipe>`: the geometric mean of that ratio over the cells that have one."""
    found: dict[str, list[float]] = {}
    for row in rows:
        for arm, by_recipe in row["ratios"].items():
            for r, value in by_recipe.items():
                if value:
                    found.setdefault(f"{arm} ÷ {r}", []).append(value)
    return {name: math.exp(sum(map(math.log, values)) / len(values))
            for name, values in found.items()}


def _f(value) -> str:
    return "–" if value is None else f"{value:,.1f}"


def _times(value, who: str | None = None) -> str:
    if value is None:
        return "–"
    return f"{value:.2f}×" + (f" ({who})" if who else "")


def table(result: dict) -> list[str]:
    """The markdown lines of the comparison (none without peers)."""
    rows = result["summary"].get("versus_peers") or []
    if not rows:
        return []
    names = list(dict.fromkeys(n for row in rows for n in row["sides"]))
    arms = [arm for arm in COMPARED if any(arm in row["arms"] for row in rows)]
    ratio_heads = [(arm, r) for arm in arms for r in COMPARED[arm]]
    head = (["request", "conc.", *(f"{n} texts/s" for n in names),
             *(f"{arm} texts/s" for arm in arms),
             *(f"{arm} ÷ {'fastest fp32' if r == 'fp32' else r}" for arm, r in ratio_heads),
             "most refused"])
    servers = result["meta"].get("peers") or {}
    out = ["", "Gateway ÷ the fastest peer: the same model in the same run with the same load "
           "generator; texts/s answered 200; fp32 peers for baseline, the int8 peer and the "
           "fastest fp32 peer for optimized; most refused: the largest refused share of any "
           "side of the cell. Peers: " + "; ".join(f"`{n}` {info['server']}"
                                                    for n, info in servers.items()) + ".",
           "", "| " + " | ".join(head) + " |", "| --- " * len(head) + "|"]
    for row in rows:
        refused = [s["refused_share"] for s in (*row["sides"].values(), *row["arms"].values())
                   if s["refused_share"] is not None]
        out.append("| " + " | ".join([
            f"{row['inputs_per_request']} text{'s' * (row['inputs_per_request'] > 1)}",
            str(row["concurrency"]),
            *(_f(row["sides"].get(n, {}).get("inputs_per_s")) for n in names),
            *(_f(row["arms"].get(arm, {}).get("inputs_per_s")) for arm in arms),
            *(_times(row["ratios"].get(arm, {}).get(r),
                     row["fastest"][r] if r == "fp32" else None) for arm, r in ratio_heads),
            f"{max(refused) * 100:.1f} %" if refused else "–"]) + " |")
    means = geomeans(rows)
    if means:
        out += ["", "Geometric means over the cells: "
                + ", ".join(f"{name} {value:.2f}×" for name, value in means.items()) + "."]
    return out

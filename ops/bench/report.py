"""The benchmark's figures from its raw measurements, and its three outputs: JSON, a markdown
table, a PNG chart.

Derived figures (per arm unless said otherwise):

- *saturation*: the concurrency level with the most inputs per second;
- *efficiency*: inputs/s at saturation / the in-process pipeline's best inputs/s at a batch size
  up to the gateway's `max_batch_size` (the most the gateway could merge), same machine, same run;
- *added latency*: gateway p50 at concurrency 1 - in-process p50 of one request's work (the
  batch size equal to the inputs per request);
- *bottleneck*: at saturation, each stage's share of one request's time: `preprocess`,
  `model / mean batch` (a forward is shared by its batch), `postprocess`, `gateway` (routing and
  transport between replicas), `http` (proxy, HTTP, client); the largest one is named. Queue
  wait is reported but is a symptom, not a stage that does work;
- *speedup* (optimized / baseline): in process per batch size (the whole pipeline, and the
  forward alone: on a GPU the tokenizer dominates the pipeline), at saturation, and at the same
  p99 bound (the best throughput of each arm over the levels whose p99 is within the bound;
  the bound defaults to the baseline's p99 at its saturation);
- *gateway ÷ plain* per request size, concurrency and arm, with each side's refused share, when
  the run also measured a plain Ray Serve deployment of the same model (ops.bench.anchor);
- *gateway ÷ the fastest peer* per cell, when the run also measured peer servers
  (ops.bench.peers.ratio);
- *CPU per request* of each process on a cell's path, and what the gateway adds beyond its
  model replicas (ops.bench.cpu).

A run that sweeps request sizes (`--inputs-per-request 1,8`) derives the per-arm figures above
from its first size, the one `meta.inputs_per_request` names; the tables show every size.
"""

from __future__ import annotations

import json
from pathlib import Path

from ops.bench import anchor
from ops.bench.peers import ratio

ARMS = ("baseline", "optimized")
PLAIN = "plain"  # the plain deployment's rows in the tables


def _ratio(a, b):
    return a / b if a is not None and b else None


def _best_under(levels: list[dict], bound: float) -> float | None:
    fits = [lv["inputs_per_s"] for lv in levels
            if lv["p99_ms"] is not None and lv["p99_ms"] <= bound]
    return max(fits) if fits else None


def _ray_env(meta: dict) -> str:
    found = meta.get("ray_env")
    if not found:
        return "unknown (a running gateway)" if meta.get("mode") == "url" else "Serve's defaults"
    return ", ".join(f"`{k}={v}`" for k, v in sorted(found.items()))


def bottleneck(level: dict) -> dict:
    stages = level["stages_ms"]
    cost = {
        "preprocess": stages.get("preprocess"),
        "model": stages["model"] / level["mean_batch"] if "model" in stages and level["mean_batch"]
        else None,
        "postprocess": stages.get("postprocess"), "gateway": stages.get("gateway"),
        "http": level.get("http_ms"),
    }
    cost = {k: round(v, 3) for k, v in cost.items() if v is not None}
    stage = max(cost, key=cost.get) if cost else None
    return {"stage": stage, "per_request_ms": cost, "queue_p50_ms": level["queue_p50_ms"]}


def _sized(levels: list[dict], size: int) -> list[dict]:
    """The levels of request size `size` (a level without one has the run's first size)."""
    return [lv for lv in levels if anchor.cell(lv, size)[0] == size]


def derive(result: dict, *, p99_bound_ms: float | None = None) -> dict:
    """The summary of a result (see the module docstring); missing parts give None."""
    inproc = result.get("inprocess") or []
    meta = result["meta"]
    per_request, max_batch = meta["inputs_per_request"], meta["max_batch_size"]
    gateway = {arm: _sized(levels, per_request)
               for arm, levels in (result.get("gateway") or {}).items()}
    summary: dict = {"arms": {}, "speedup": {}}
    for arm in ARMS:
        rows = [r for r in inproc if r["arm"] == arm]
        eligible = [r for r in rows if r["batch"] <= max_batch] or rows
        ref = max(eligible, key=lambda r: r["throughput"]) if eligible else None
        one = next((r for r in rows if r["batch"] == per_request), None)
        levels = [lv for lv in gateway.get(arm, []) if lv["ok"]]
        sat = max(levels, key=lambda lv: lv["inputs_per_s"]) if levels else None
        c1 = next((lv for lv in levels if lv["concurrency"] == 1), None)
        summary["arms"][arm] = {
            "inprocess_best": ref and {"batch": ref["batch"], "throughput": ref["throughput"]},
            "saturation": sat and {"concurrency": sat["concurrency"],
                                   "inputs_per_s": sat["inputs_per_s"], "p99_ms": sat["p99_ms"]},
            "efficiency": _ratio(sat and sat["inputs_per_s"], ref and ref["throughput"]),
            "added_latency_ms": (c1["p50_ms"] - one["p50_ms"]) if c1 and one else None,
            "bottleneck": bottleneck(sat) if sat else None,
        }
    by_batch, forward = {}, {}
    for r in inproc:
        if r["arm"] == "optimized":
            base = next((b for b in inproc if b["arm"] == "baseline" and b["batch"] == r["batch"]),
                        None)
            if base:
                by_batch[str(r["batch"])] = r["throughput"] / base["throughput"]
                forward[str(r["batch"])] = _ratio(base["stages_ms"]["model"],
                                                  r["stages_ms"]["model"])
    summary["speedup"]["inprocess"] = by_batch
    summary["speedup"]["forward"] = forward  # the forward alone: no tokenizer, no postprocess
    sat = {arm: summary["arms"][arm]["saturation"] for arm in ARMS}
    if sat["baseline"] and sat["optimized"]:
        summary["speedup"]["saturation"] = (sat["optimized"]["inputs_per_s"]
                                            / sat["baseline"]["inputs_per_s"])
        bound = p99_bound_ms or sat["baseline"]["p99_ms"]
        best = {arm: _best_under([lv for lv in gateway[arm] if lv["ok"]], bound) for arm in ARMS}
        summary["speedup"]["at_p99_bound"] = {
            "bound_ms": bound, **best, "ratio": _ratio(best["optimized"], best["baseline"])}
    summary["versus_plain"] = anchor.compare(result)
    summary["versus_peers"] = ratio.compare(result)
    summary["versus_peers_geomeans"] = ratio.geomeans(summary["versus_peers"])
    return summary


def write_json(result: dict, path: Path) -> None:
    path.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")


def _f(value, digits=1) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def _pct(value) -> str:
    return "–" if value is None else f"{value * 100:.1f} %"


def _times(value) -> str:
    return "–" if value is None else f"{value:.2f}×"


def _sizes(meta: dict) -> list[int]:
    return meta.get("request_sizes") or [meta["inputs_per_request"]]


def _size_cell(meta: dict, level: dict) -> str:
    """The request-size cell of a detail row: only in a run that swept sizes."""
    if len(_sizes(meta)) < 2:
        return ""
    return f" {anchor.cell(level, meta['inputs_per_request'])[0]} |"


def _end_to_end(result: dict) -> list[tuple[str, dict]]:
    """(arm, PLAIN or peer name, level) of every end-to-end level: each arm's, then the plain
    ones, then each peer's."""
    return ([(arm, lv) for arm, levels in (result.get("gateway") or {}).items() for lv in levels]
            + [(PLAIN, lv) for lv in result.get("plain") or []]
            + [(name, lv) for name, levels in (result.get("peers") or {}).items()
               for lv in levels])


def markdown(result: dict) -> str:
    """The report: every table of the run, the comparison with plain Ray Serve last."""
    out = _header(result["meta"])
    for part in (_inprocess_table, _end_to_end_table, _summary_table, _speedup_line,
                 _cpu_table, _memory_line, _versus_plain_table, ratio.table):
        out += part(result)
    return "\n".join(out) + "\n"


def _header(meta: dict) -> list[str]:
    sizes = _sizes(meta)
    per_request = (f"{sizes[0]} input(s) per request" if len(sizes) < 2 else
                   f"{', '.join(map(str, sizes))} inputs per request (the per-arm figures: "
                   f"{sizes[0]})")
    return [f"Run {meta['date']} on {meta['hardware']}; model `{meta['model']}`, "
            f"workload {meta.get('workload', 'mixed')}, task {meta.get('task', 'classify')}, "
            f"{per_request}, max_batch_size "
            f"{meta['max_batch_size']}, batch_wait_ms {meta['batch_wait_ms']}, torch threads "
            f"{meta['replica_threads']} per model replica and {meta['inprocess_threads']} in "
            f"process; settings {meta['settings'] or 'default'}; Ray environment "
            f"{_ray_env(meta)}.", ""]


def _inprocess_table(result: dict) -> list[str]:
    if not result.get("inprocess"):
        return []
    out = ["In process (tokenize + forward + postprocess, no server):", "",
           "| arm | recipe | batch | inputs/s | p50 ms / batch | tokenize ms | forward ms "
           "| postprocess ms |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in result["inprocess"]:
        s = r["stages_ms"]
        out.append(f"| {r['arm']} | {r['recipe']} | {r['batch']} | {_f(r['throughput'])} | "
                   f"{_f(r['p50_ms'], 2)} | {_f(s['preprocess'], 2)} | {_f(s['model'], 2)} | "
                   f"{_f(s['postprocess'], 2)} |")
    return [*out, ""]


def _end_to_end_table(result: dict) -> list[str]:
    rows, meta = _end_to_end(result), result["meta"]
    if not rows:
        return []
    swept = len(_sizes(meta)) > 1
    out = ["Gateway end to end (closed loop over loopback HTTP; stage means from "
           "`Server-Timing`" + ("; `plain`: plain Ray Serve, no `Server-Timing`" if
                                result.get("plain") else "")
           + ("; the peer servers send no `Server-Timing`" if result.get("peers") else "")
           + "):", "",
           "| arm | conc. |" + (" texts/req |" if swept else "") + " req/s | inputs/s | p50 ms "
           "| p95 ms | p99 ms | preprocess | queue | model | postprocess | gateway | http "
           "| mean batch | queue p99 | failed |",
           "| --- " * (16 + swept) + "|"]
    for who, lv in rows:
        s = lv["stages_ms"]
        out.append(
            f"| {who} | {lv['concurrency']} |{_size_cell(meta, lv)} {_f(lv['rps'])} | "
            f"{_f(lv['inputs_per_s'])} | {_f(lv['p50_ms'])} | {_f(lv['p95_ms'])} | "
            f"{_f(lv['p99_ms'])} | "
            + " | ".join(_f(s.get(k), 2) for k in ("preprocess", "queue", "model",
                                                   "postprocess", "gateway"))
            + f" | {_f(lv['http_ms'], 2)} | {_f(lv['mean_batch'], 2)} | "
            f"{_f(lv['queue_p99_ms'])} | {sum(lv['failed'].values())} |")
    return [*out, ""]


def _summary_table(result: dict) -> list[str]:
    out = ["| arm | efficiency | added latency at c=1 | saturation | bottleneck |",
           "| --- | --- | --- | --- | --- |"]
    for arm, s in result["summary"]["arms"].items():
        sat, neck = s["saturation"], s["bottleneck"]
        out.append(
            f"| {arm} | {_f(s['efficiency'], 2)} | {_f(s['added_latency_ms'], 2)} ms | "
            + (f"{_f(sat['inputs_per_s'])} inputs/s at c={sat['concurrency']}" if sat else "–")
            + " | " + (f"{neck['stage']} ({_f(neck['per_request_ms'][neck['stage']], 2)} ms of "
                       f"each request)" if neck and neck["stage"] else "–") + " |")
    return out


def _speedup_line(result: dict) -> list[str]:
    speed = result["summary"]["speedup"]
    line = ("Optimized / baseline: in process "
            + ", ".join(f"batch {b}: {_f(v, 2)}×" for b, v in speed["inprocess"].items())
            + " (forward alone: "
            + ", ".join(f"{_f(v, 2)}×" for v in speed.get("forward", {}).values()) + ")")
    if "saturation" in speed:
        bound = speed["at_p99_bound"]
        line += (f"; end to end at saturation {_f(speed['saturation'], 2)}×, at p99 ≤ "
                 f"{_f(bound['bound_ms'])} ms {_f(bound['ratio'], 2)}×.")
    return ["", line]


def _cpu_table(result: dict) -> list[str]:
    """CPU ms per answered request, by role, of every level that measured it (ops.bench.cpu)."""
    meta = result["meta"]
    cpu = [(who, lv) for who, lv in _end_to_end(result) if lv.get("cpu")]
    if not cpu:
        return []
    swept = len(_sizes(meta)) > 1
    topology = {lv["cpu"]["topology"] for _, lv in cpu if lv["cpu"].get("topology")}
    out = ["", "CPU ms per answered request, each process on the cell's path (user + system "
           "from /proc over the measured window; replicas of one deployment summed; the load "
           "client is the benchmark process, on the same cores); added: the gateway path's "
           "total minus its model replicas'; loop: the gateway replicas' busiest thread, "
           "their event loop (remote topology)" + (
               f"; gateway topology {', '.join(sorted(topology))}" if topology else "")
           + (" (colocated: both models in the gateway replicas, so the total per process "
              "only)" if "colocated" in topology else "") + ":", "",
           "| side | conc. |" + (" texts/req |" if swept else "")
           + " per process (ms / request; by pid where several) | server total | added "
           "| loop | load client |",
           "| --- " * (7 + swept) + "|"]
    for who, lv in cpu:
        c = lv["cpu"]
        parts = ", ".join(f"{role} {ms:.2f}{_each_process(c, role)}"
                          for role, ms in c["roles"].items() if role != "client")
        out.append(f"| {who} | {lv['concurrency']} |{_size_cell(meta, lv)} {parts or '–'} | "
                   f"{_f(c['server_ms'], 2)} | {_f(c.get('added_ms'), 2)} | "
                   f"{_f(c.get('loop_ms'), 2)} | {_f(c.get('client_ms'), 2)} |")
    return out


def _each_process(cpu: dict, role: str) -> str:
    """` (pid ms, ...)` of a role that more than one process spent CPU in, else nothing."""
    spent = [p for p in cpu.get("processes", ()) if p["role"] == role and p["ms_per_request"]]
    if len(spent) < 2:
        return ""
    return " (" + ", ".join(f"{p['pid']}: {p['ms_per_request']:.2f}"
                            for p in sorted(spent, key=lambda p: -p["ms_per_request"])) + ")"


def _memory_line(result: dict) -> list[str]:
    mem = result.get("memory", {})
    if not mem:
        return []
    return ["", "Memory: bench process (in-process models) "
            f"{_f(mem.get('bench_process_mib'))} MiB RSS; GPU peak "
            f"{_f(mem.get('gpu_peak_mib'))} MiB; serve processes (MiB RSS): "
            + ", ".join(f"{k} {v}" for k, v in sorted(mem.get("serve", {}).items()))]


def _versus_plain_table(result: dict) -> list[str]:
    """Gateway ÷ plain Ray Serve per cell (ops.bench.anchor)."""
    rows = result["summary"].get("versus_plain") or []
    if not rows:
        return []
    arms = [arm for arm in ARMS if any(arm in row["arms"] for row in rows)]
    plain = result["meta"].get("plain") or {}
    head = (["request size", "conc.", "plain texts/s", "plain refused"]
            + [f"{arm} texts/s" for arm in arms] + [f"{arm} refused" for arm in arms]
            + [f"{arm} ÷ plain" for arm in arms])
    out = ["", f"Gateway ÷ plain Ray Serve: the same model ({plain.get('recipe', 'fp32')}, "
           f"`@serve.batch`, {plain.get('threads', 'all')} torch threads) in the same run with "
           "the same load generator; texts/s answered 200; refused: not answered 200 / sent:",
           "", "| " + " | ".join(head) + " |", "| --- " * len(head) + "|"]
    for row in rows:
        sides = [row["arms"].get(arm, {}) for arm in arms]
        out.append(
            f"| {row['inputs_per_request']} | {row['concurrency']} | "
            f"{_f(row['plain']['inputs_per_s'])} | {_pct(row['plain']['refused_share'])} | "
            + " | ".join([_f(side.get("inputs_per_s")) for side in sides]
                         + [_pct(side.get("refused_share")) for side in sides]
                         + [_times(side.get("ratio")) for side in sides]) + " |")
    if any(side["inputs_per_s"] is None for row in rows
           for side in (row["plain"], *row["arms"].values())):
        out += ["", "–: nothing sent in the measured window (each request took longer): "
                "lengthen --seconds."]
    return out


def chart(result: dict, path: Path) -> None:
    """Latency (p50 solid, p99 dashed) against inputs/s per arm (and plain Ray Serve when
    measured), one point per concurrency, at the run's first request size; the in-process best
    throughput of each arm as a dotted vertical line."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=90)
    colors = {"baseline": "tab:blue", "optimized": "tab:orange", PLAIN: "tab:gray"}
    others = iter(("tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink"))
    size = result["meta"]["inputs_per_request"]
    curves = {**(result.get("gateway") or {}), **({PLAIN: result["plain"]}
                                                  if result.get("plain") else {}),
              **(result.get("peers") or {})}
    for arm, levels in curves.items():
        levels = [lv for lv in _sized(levels, size) if lv["ok"]]
        x = [lv["inputs_per_s"] for lv in levels]
        color = colors.get(arm) or colors.setdefault(arm, next(others, "black"))
        ax.plot(x, [lv["p50_ms"] for lv in levels], "o-", color=color, label=f"{arm} p50")
        ax.plot(x, [lv["p99_ms"] for lv in levels], "s--", color=color, label=f"{arm} p99")
        for lv in levels:
            ax.annotate(f"c={lv['concurrency']}", (lv["inputs_per_s"], lv["p99_ms"]),
                        textcoords="offset points", xytext=(3, 4), fontsize=7)
    for arm, s in result["summary"]["arms"].items():
        if s["inprocess_best"]:
            ax.axvline(s["inprocess_best"]["throughput"], color=colors[arm], linestyle=":",
                       label=f"{arm} in process, batch {s['inprocess_best']['batch']}")
    ax.set_xlabel("throughput (inputs/s)")
    ax.set_ylabel("latency (ms)")
    ax.set_yscale("log")
    ax.set_title(f"Gateway latency vs throughput ({result['meta']['hardware']})", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)

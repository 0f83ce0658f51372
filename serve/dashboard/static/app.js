// The rollout dashboard: polls the gateway's /v1/ API and renders it; actions go through
// POST /v1/rollout/<kind> with the operator token. Text from the store (actors, reasons, span
// attributes) is only ever set as textContent, never parsed as HTML.
"use strict";

const STATUS_EVERY_MS = 2000;
const SERIES_EVERY_MS = 5000;
const ARMS = ["baseline", "optimized"];
const $ = id => document.getElementById(id);
// the gateway's root as this page sees it: "" at /dashboard, "/<prefix>" behind a route prefix
// (a Serve application's, or a proxy's); the page's assets are relative to it too
const BASE = location.pathname.replace(/\/dashboard\/?$/, "");
const view = { revision: null, actions: false, trace: null, pending: null, openAudit: new Set() };
// shown where a cost would read 0 only because no price is configured
const UNPRICED = "no device price set: CANARY_DEVICE_HOUR_PRICE";

const pct = v => (v === null || v === undefined) ? "–" : (v * 100).toFixed(v < 0.1 ? 2 : 1) + " %";
const num = (v, d = 1) => (v === null || v === undefined) ? "–" : Number(v).toFixed(d);
const when = ts => new Date(ts * 1000).toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
const share = p => (p === null || p === undefined) ? "–" : `${+p.toFixed(2)} %`;

async function getJSON(url) {
  const reply = await fetch(url, { cache: "no-store" });
  const body = await reply.json();
  if (!reply.ok) throw new Error(body.error ? body.error.message : `HTTP ${reply.status}`);
  return body;
}

// opts.wrap: indexes of free-text cells that wrap (the others stay on one line)
function row(cells, opts = {}) {
  const tr = document.createElement("tr");
  cells.forEach((cell, i) => {
    const td = document.createElement(opts.head ? "th" : "td");
    td.textContent = cell === null || cell === undefined ? "–" : String(cell);
    if (opts.wrap && opts.wrap.includes(i)) td.className = "wrap";
    tr.appendChild(td);
  });
  return tr;
}

function fill(table, headers, rows) {
  table.replaceChildren(row(headers, { head: true }), ...rows);
}

// --- status ---------------------------------------------------------------------------------

const CPU_HINT = "CPU seconds of the arm's forwards per 1,000 inputs, as its replicas measured them (GPU seconds on a CUDA replica)";

// measured forward seconds per 1,000 inputs ("gpu" after it on a CUDA replica)
function cpuPer1k(x) {
  if (x.cpu_per_1k === null || x.cpu_per_1k === undefined) return "–";
  const device = x.cpu && x.cpu.device !== "cpu" ? ` ${x.cpu.device}` : "";
  return `${+x.cpu_per_1k.toPrecision(4)}${device}`;
}

// without a device price the cost column shows CPU seconds per 1,000 inputs, never 0
function unpricedCost(x) {
  const cpu = cpuPer1k(x);
  return cpu === "–" ? "no price" : `${cpu} cpu-s`;
}

// the realized speedup: baseline ÷ optimized CPU seconds per input, with its 95 % interval
function speedupText(e) {
  const counts = `${e.baseline_n} baseline, ${e.optimized_n} optimized requests`;
  const lead = "realized speedup (baseline ÷ optimized CPU s per input): ";
  if (e.ratio === null) return `${lead}– (${e.note}; ${counts})`;
  if (e.lower === null) return `${lead}${+e.ratio.toPrecision(3)}× (${e.note}; ${counts})`;
  const level = `${+(e.confidence * 100).toPrecision(4)} %`;
  return `${lead}${+e.ratio.toPrecision(3)}× (${level} CI ${+e.lower.toPrecision(3)}–` +
    `${+e.upper.toPrecision(3)}; ${counts})`;
}

function renderStatus(s) {
  view.revision = s.revision;
  view.actions = s.actions;
  $("share").textContent = share(s.canary_percent);
  $("effective").textContent = share(s.routing.effective_percent);
  $("kill").textContent = s.kill ? "ON" : "off";
  $("kill").className = "value" + (s.kill ? " on" : "");
  $("revision").textContent = s.revision;
  const routing = s.routing;
  $("routing").textContent = "this gateway routes: " + routing.routing +
    (routing.stale ? ` (state stale: ${routing.store_error || "no recent refresh"})` : "");
  $("routing").className = "routing" + (routing.stale || s.kill ? " warn" : "");
  $("versions").textContent =
    `share bound to optimized ${s.optimized_version || "(none)"}, baseline ${s.baseline_version || "(none)"}` +
    (s.revision ? ` · last change ${when(s.updated_at)} by ${s.updated_by}: ${s.reason}` : "");
  $("actions-mode").textContent = s.actions
    ? "Actions need the operator token; each asks for a reason and lands in the audit log."
    : "Read-only: this gateway has no operator token configured (CANARY_OPERATOR_TOKEN).";
  for (const id of ["set-share", "kill-button", "unkill-button", "route-add", "route-remove"]) {
    $(id).disabled = !s.actions;
  }

  const traffic = s.traffic || {};
  const arms = traffic.arms || {};
  fill($("arms"), ["arm", "req/s", "success", "errors", "timeouts", "retries", "p50 ms", "p99 ms", "queue", "batch", "cpu s/1k", "cost/1k"],
    ARMS.filter(a => arms[a]).map(a => {
      const x = arms[a];
      const unpriced = s.device_hour_price === 0;
      const tr = row([a, num(x.request_rate, 2), pct(x.success_rate), pct(x.error_rate), pct(x.timeout_rate),
        pct(x.retry_rate), num(x.p50_ms), num(x.p99_ms), num(x.queue_mean), num(x.batch_mean),
        cpuPer1k(x), unpriced ? unpricedCost(x) : x.cost_per_1k === null ? "–" : x.cost_per_1k.toFixed(6)]);
      tr.children[10].title = CPU_HINT;
      if (unpriced) tr.lastChild.title = UNPRICED;
      return tr;
    }));
  if (traffic.efficiency) $("arms").appendChild(row([speedupText(traffic.efficiency)], { wrap: [0] }));
  if (traffic.error) $("arms").appendChild(row([`telemetry unavailable: ${traffic.error}`], { wrap: [0] }));
  renderGeneration(arms);

  // header routes (`rollout route add|list|remove`), tried in id order before the share
  const applied = s.routing.routes_applied ? "applied" : "not applied (kill switch or stale state)";
  fill($("routes"), ["id", "header", "values", "arm", "added", "by", "reason", "here"],
    (s.routes || []).map(r => row([r.id, r.header, r.values.join(", "), r.arm, when(r.created_at),
      r.created_by, r.reason, applied], { wrap: [1, 2, 5, 6, 7] })));
  if (!(s.routes || []).length) $("routes").appendChild(row(["none: every request is routed by the share"]));

  fill($("gateways"), ["gateway", "optimized", "baseline", "revision", "seen", "note"],
    (s.gateways || []).map(g => row([g.gateway, g.optimized_version, g.baseline_version, g.state_revision,
      `${Math.round(g.age_s)} s ago`,
      [g.silent ? "silent" : "", g.version_mismatch ? "serves another optimized version: routes 0 %" : "",
       ...(g.events || [])].filter(Boolean).join("; ")], { wrap: [0, 1, 2, 5] })));
  renderAgreement(s.traffic ? s.traffic.shadow : null);
}

// a generative arm's answers over the window (rollout.telemetry.window_stats `generation`):
// the table shows only where an arm generated
function renderGeneration(arms) {
  const generated = ARMS.filter(a => arms[a] && arms[a].generation);
  fill($("generation"), ["generated", "answers", "tokens/s", "first token p50 ms",
    "first token p99 ms", "ms between tokens"],
    generated.map(a => {
      const g = arms[a].generation;
      return row([a, g.answers, num(g.tokens_per_s), num(g.first_token_p50_ms),
        num(g.first_token_p99_ms), num(g.inter_token_ms, 2)]);
    }));
  $("generation").hidden = !generated.length;
}

// generated answers the shadow scored (rollout.shadow `token_*`): per token, averaged per answer
function tokenFidelity(a, minutes) {
  const text = document.createElement("p");
  text.id = "token-fidelity";
  text.textContent = `generated answers: ${a.token_responses} scored (${a.token_tokens} tokens), ` +
    `KL divergence ${num(a.token_kld, 5)} nats per token, top-1 token agreement ` +
    `${pct(a.token_agreement)}, last ${minutes} min (shed ${a.shed}, errors ${a.errors})`;
  const rows = Object.entries(a.token_slices || {}).sort((x, y) => x[1].agreement - y[1].agreement);
  const t = document.createElement("table");
  t.id = "token-slices";
  fill(t, ["slice", "answers", "KL divergence", "top-1 agreement"],
    rows.slice(0, SLICE_ROWS).map(([key, r]) => row([key, r.responses, num(r.kld, 5),
      pct(r.agreement)], { wrap: [0] })));
  if (rows.length > SLICE_ROWS) t.appendChild(row([`… and ${rows.length - SLICE_ROWS} more slices`]));
  t.hidden = !rows.length;
  return [text, t];
}

function renderAgreement(a) {
  const body = $("agreement-body");
  body.replaceChildren();
  const minutes = a ? Math.round(a.seconds / 60) : 0;
  if (a && a.token_responses) {
    body.append(...tokenFidelity(a, minutes));
    if (!a.pairs) return;
  }
  if (a && !a.pairs && a.cosine_n) {
    const recall = a.recall_queries ? `, recall@10 of neighbours ${pct(a.recall_at_10)} ` +
      `over ${a.recall_queries} pairs` : "";
    body.textContent = `embeddings: cosine mean ${num(a.cosine_mean, 6)}, p1 ≥ ${num(a.cosine_p1, 6)} ` +
      `over ${a.cosine_n} inputs${recall}, last ${minutes} min (shed ${a.shed}, errors ${a.errors})`;
    return;
  }
  if (!a || !a.pairs) {
    body.textContent = a ? `no shadow comparisons in the last ${minutes} min` :
      "not measured by this gateway (no shadow comparisons)";
    return;
  }
  const text = document.createElement("p");
  text.textContent = `${pct(a.agreement)} of ${a.pairs} shadow pairs agree ` +
    `(95 % confidence ${pct(a.lower_bound)}–${pct(a.upper_bound ?? a.agreement)}), ` +
    `last ${minutes} min (shed ${a.shed}, errors ${a.errors})`;
  const band = document.createElement("div");
  band.className = "band";
  const range = document.createElement("div");
  range.className = "range";
  const lo = Math.max(0, a.lower_bound), hi = a.upper_bound ?? a.agreement;
  range.style.left = `${lo * 100}%`;
  range.style.width = `${Math.max(0.5, (hi - lo) * 100)}%`;
  const point = document.createElement("div");
  point.className = "point";
  point.style.left = `${a.agreement * 100}%`;
  band.append(range, point);
  body.append(text, band, sliceTable(a.slice_table || []));
}

// the slice table (rollout.slices), worst first: the worst SLICE_ROWS rows and a count of the rest
const SLICE_ROWS = 10;

function sliceTable(rows) {
  const t = document.createElement("table");
  t.id = "agreement-slices";
  fill(t, ["slice", "pairs", "flips", "confident flips", "agreement", "95 % lower", ""],
    rows.slice(0, SLICE_ROWS).map(r => row([r.slice, r.n, r.n - r.agreed, r.confident_flips,
      pct(r.agreement), pct(r.lower_bound), r.judged ? "" : "small"], { wrap: [0] })));
  if (rows.length > SLICE_ROWS) t.appendChild(row([`… and ${rows.length - SLICE_ROWS} more slices`]));
  t.hidden = !rows.length;
  return t;
}

// the worst_slice_agreement gate's slices: each judged slice's anytime-valid sequence
function gateSliceTable(gates) {
  const rows = (gates.find(g => g.rows && g.rows.length) || { rows: [] }).rows;
  const t = document.createElement("table");
  t.id = "ramp-slices";
  const end = v => v === null || v === undefined ? "–" : Number(v).toFixed(4);
  fill(t, ["slice", "pairs", "agreement", "CS lower", "CS upper", ""],
    rows.slice(0, SLICE_ROWS).map(r => row([r.slice, r.pairs, pct(r.agreement), end(r.lower),
      end(r.upper), r.judged ? "" : "not judged"], { wrap: [0] })));
  if (rows.length > SLICE_ROWS) t.appendChild(row([`… and ${rows.length - SLICE_ROWS} more slices`]));
  t.hidden = !rows.length;
  return t;
}

// --- ramp: `rollout ramp status --json` plus `active` ----------------------------------------

const GATE_OPS = { agreement_lower_bound: "≥", realized_speedup: "≥", worst_slice_agreement: "≥",
  min_recall_at_10: "≥", min_token_agreement: "≥" };
// what the two shadow gates' values are (their notes give the counts and the window)
const GATE_HINTS = {
  agreement_lower_bound: "agreement: lower end of an anytime-valid 95 % confidence sequence over the step",
  confident_flip_rate: "flips / pairs at baseline margin ≥ min_margin over the step",
  realized_speedup: "baseline ÷ optimized CPU seconds per input over the window, judged on its 99.9 % interval",
  worst_slice_agreement: "the worst slice's lower end of an anytime-valid confidence sequence (alpha split across slices) over the step",
  min_recall_at_10: "embeddings: share of the baseline's top-10 neighbours in the shadow's reservoir the canary also finds, lower end of an anytime-valid 95 % confidence sequence over the step",
  max_kld: "generated answers: mean KL divergence (baseline ‖ optimized) per token, nats, upper end of an anytime-valid 95 % confidence sequence over the step's scored answers",
  min_token_agreement: "generated answers: share of positions whose most likely tokens agree, lower end of an anytime-valid 95 % confidence sequence over the step's scored answers",
};

function renderRamp(r) {
  const body = $("ramp-body");
  body.replaceChildren();
  const ramp = r.ramp;
  $("ramp-state").textContent = ramp ? ramp.status : "none";
  for (const id of ["ramp-pause", "ramp-resume", "ramp-approve", "ramp-abort"]) {
    $(id).disabled = !view.actions || !r.active;
  }
  $("ramp-actions").hidden = !ramp;
  if (!ramp) {
    body.textContent = r.message ? `no ramp (${r.message})` : "no ramp has been started";
    return;
  }
  const head = document.createElement("p");
  head.textContent = `${ramp.status}, step ${ramp.step + 1} of ${ramp.plan.steps.length}` +
    (r.time_in_step_s === null ? "" : `, ${Math.round(r.time_in_step_s)} s in step`) +
    ` · started by ${ramp.started_by}: ${ramp.reason}` +
    (ramp.forced ? " (forced: no verify verdict needed)" : "") +
    ` · failures ${ramp.failures} of ${ramp.plan.failures_tolerated} tolerated` +
    (ramp.plan.progress_deadline_s ? ` · deadline ${ramp.plan.progress_deadline_s} s past the soak, ` +
      `then ${ramp.plan.on_deadline}` : "");
  const steps = document.createElement("table");
  steps.id = "ramp-steps";
  fill(steps, ["step", "share", "soak", "samples", "approval", ""], ramp.plan.steps.map((st, i) => {
    const tr = row([i + 1, share(st.percent), `${st.min_duration_s} s`, st.min_samples,
      st.approval ? (ramp.approved.includes(i) ? "approved" : "needed") : "",
      i === ramp.step ? "◀ current" : (i < ramp.step ? "done" : "")]);
    if (i === ramp.step) tr.className = "selected";
    return tr;
  }));
  const last = r.last_evaluation;
  const gates = document.createElement("table");
  gates.id = "ramp-gates";
  fill(gates, ["gate", "value", "", "threshold", "status"], ((last && last.gates) || []).map(g => {
    const tr = row([g.name, g.value === null ? "–" : +(+g.value).toPrecision(4), GATE_OPS[g.name] || "≤",
      g.threshold === null ? "–" : +(+g.threshold).toPrecision(4), g.status + (g.note ? ` (${g.note})` : "")],
      { wrap: [4] });
    tr.className = "gate " + (g.status === "fail" ? "fail" : g.status === "pass" ? "pass" : "");
    if (GATE_HINTS[g.name]) tr.firstChild.title = GATE_HINTS[g.name];
    return tr;
  }));
  // HTTP checks (plan `checks`): shown with the gates, their threshold is a text ("status 200")
  const checks = document.createElement("table");
  checks.id = "ramp-checks";
  fill(checks, ["check", "value", "expected", "status"], ((last && last.checks) || []).map(c => {
    const tr = row([c.name, c.value === null ? "–" : +(+c.value).toPrecision(4), c.threshold,
      c.status + (c.note ? ` (${c.note})` : "")], { wrap: [2, 3] });
    tr.className = "gate " + (c.status === "fail" ? "fail" : c.status === "pass" ? "pass" : "");
    return tr;
  }));
  checks.hidden = !(last && last.checks && last.checks.length);
  const note = document.createElement("p");
  note.className = "muted";
  note.textContent = last ? `last evaluation ${when(last.ts)}: ${last.reason}` +
    (r.controller ? ` (controller ${r.controller})` : " (no controller holds the lease)")
    : "not evaluated yet";
  body.append(head, steps, gates, gateSliceTable((last && last.gates) || []), checks, note);
}

// --- charts -----------------------------------------------------------------------------------

const METRICS = [
  ["request_rate", "requests / s", v => v.toFixed(2)],
  ["error_rate", "error rate", pct],
  ["timeout_rate", "timeout rate", pct],
  ["p50_ms", "p50 latency (ms)", v => v.toFixed(1)],
  ["p99_ms", "p99 latency (ms)", v => v.toFixed(1)],
  ["queue_mean", "queue length", v => v.toFixed(1)],
  ["batch_mean", "batch size", v => v.toFixed(1)],
  ["cost_per_1k", "cost per 1,000 requests", v => v.toFixed(5),
    s => s.device_hour_price === 0 ? UNPRICED : null],
];

function renderSeries(series) {
  for (const [key, title, format, noteOf] of METRICS) {
    Charts.draw($("charts"), {
      id: key, title, format, starts: series.starts, note: noteOf ? noteOf(series) : null,
      lines: ARMS.map(arm => ({ name: arm, values: series.arms[arm][key] })),
    });
  }
}

// --- audit and traces -------------------------------------------------------------------------

// A reason shows at most two lines (ramp evaluations write long ones); the full text is its
// title, and a click expands it (kept across refreshes by entry id).
function renderAudit(entries) {
  fill($("audit"), ["time", "actor", "action", "revision", "reason"],
    entries.map(e => {
      const tr = row([when(e.ts), e.actor, e.action, e.revision, null], { wrap: [1] });
      const reason = document.createElement("div");
      reason.className = "clamp" + (view.openAudit.has(e.id) ? " open" : "");
      reason.textContent = e.reason;
      reason.title = e.reason;
      reason.addEventListener("click", () => {
        if (!reason.classList.toggle("open")) view.openAudit.delete(e.id);
        else view.openAudit.add(e.id);
      });
      tr.lastChild.className = "reason";
      tr.lastChild.replaceChildren(reason);
      return tr;
    }));
}

function renderTraces(traces) {
  fill($("traces"), ["time", "trace", "arm", "status", "ms", "spans", ""],
    traces.map(t => {
      const tr = row([when(t.start), t.trace_id.slice(0, 12) + "…", t.arm, t.status,
        num(t.duration_ms), t.spans, t.fallback ? "fallback" : ""]);
      tr.className = "clickable" + (t.trace_id === view.trace ? " selected" : "");
      tr.dataset.trace = t.trace_id;
      tr.addEventListener("click", () => showTrace(t.trace_id));
      return tr;
    }));
}

async function showTrace(id) {
  view.trace = id;
  const box = $("waterfall");
  try {
    const { spans } = await getJSON(`${BASE}/v1/traces/${id}`);
    const start = Math.min(...spans.map(s => s.start));
    const total = Math.max(Math.max(...spans.map(s => s.end)) - start, 1e-9);
    const ids = new Set(spans.map(s => s.span_id));
    const depth = s => { let d = 0, p = s; while (p && ids.has(p.parent_id) && d < 20) {
      p = spans.find(x => x.span_id === p.parent_id); d++; } return d; };
    const title = document.createElement("p");
    title.textContent = `trace ${id}: ${spans.length} spans, ${(total * 1000).toFixed(2)} ms`;
    const rows = spans.map(s => {
      const div = document.createElement("div");
      div.className = "row";
      const name = document.createElement("span");
      name.className = "name";
      name.style.paddingLeft = `${depth(s)}em`;
      name.textContent = s.name;
      name.title = JSON.stringify(s.attrs || {});
      const service = document.createElement("span");
      service.className = "muted";
      service.textContent = s.service || "";
      const track = document.createElement("div");
      track.className = "track";
      const bar = document.createElement("div");
      bar.className = "bar" + (s.status === "error" ? " error" : "");
      bar.style.left = `${(s.start - start) / total * 100}%`;
      bar.style.width = `${(s.end - s.start) / total * 100}%`;
      track.appendChild(bar);
      const ms = document.createElement("span");
      ms.textContent = `${((s.end - s.start) * 1000).toFixed(2)} ms`;
      div.append(name, service, track, ms);
      return div;
    });
    box.replaceChildren(title, ...rows);
  } catch (err) {
    box.textContent = `trace ${id}: ${err.message}`;
  }
}

// --- actions ----------------------------------------------------------------------------------

function say(text, kind) {
  $("action-result").textContent = text;
  $("action-result").className = kind;
}

async function act(kind, extra = {}, confirmed = false, base = `${BASE}/v1/rollout/`) {
  const reason = $("reason").value.trim();
  if (!reason) { say("give a reason: it is recorded in the audit log", "error"); return; }
  sessionStorage.setItem("canary-token", $("token").value);
  localStorage.setItem("canary-actor", $("actor").value);
  const body = { reason, expected_revision: view.revision, confirm: confirmed, ...extra };
  if ($("actor").value.trim()) body.actor = $("actor").value.trim();
  if (kind === "kill" || kind.startsWith("ramp/")) { delete body.expected_revision; delete body.confirm; }
  let reply, answer;
  try {
    reply = await fetch(base + kind, {
      method: "POST", cache: "no-store",
      headers: { "Content-Type": "application/json", "Authorization": `Bearer ${$("token").value}` },
      body: JSON.stringify(body),
    });
    answer = await reply.json();
  } catch (err) { say(`${kind}: ${err.message}`, "error"); return; }
  if (reply.status === 428) {
    view.pending = () => act(kind, extra, true, base);
    $("confirm-question").textContent = answer.error.message;
    $("confirm").hidden = false;
    return;
  }
  if (!reply.ok) { say(`${kind} refused (${reply.status}): ${answer.error.message}`, "error"); return; }
  say(answer.message, "done");
  $("reason").value = "";
  refresh();
}

function wireActions() {
  $("token").value = sessionStorage.getItem("canary-token") || "";
  $("actor").value = localStorage.getItem("canary-actor") || "";
  $("set-share").addEventListener("click", () => {
    const percent = $("percent").value.trim();
    if (!percent) { say("give the new share in percent", "error"); return; }
    act("canary", { percent });
  });
  $("kill-button").addEventListener("click", () => act("kill"));
  for (const what of ["pause", "resume", "approve", "abort"]) {
    $(`ramp-${what}`).addEventListener("click", () => act(`ramp/${what}`, {}, false, `${BASE}/v1/`));
  }
  $("unkill-button").addEventListener("click", () => act("unkill"));
  $("route-add").addEventListener("click", () => {
    const spec = $("route-header").value, at = spec.indexOf("=");
    if (at < 1) { say("give the header as NAME=VALUE[,VALUE...]", "error"); return; }
    act("route-add", { header: spec.slice(0, at).trim(), arm: $("route-arm").value,
      values: spec.slice(at + 1).split(",").map(v => v.trim()) });
  });
  $("route-remove").addEventListener("click", () => {
    const id = $("route-id").value.trim();
    if (!id) { say("give the id of the route to remove (e.g. r1)", "error"); return; }
    act("route-remove", { id });
  });
  $("confirm-yes").addEventListener("click", () => {
    $("confirm").hidden = true; const next = view.pending; view.pending = null; if (next) next();
  });
  $("confirm-no").addEventListener("click", () => {
    $("confirm").hidden = true; view.pending = null; say("cancelled: nothing was changed", "");
  });
}

// --- polling ----------------------------------------------------------------------------------

function live(ok, text) {
  $("live").textContent = text;
  $("live").className = "badge " + (ok ? "ok" : "bad");
}

async function refresh() {
  try {
    const [status, ramp, audit, traces] = await Promise.all([
      getJSON(`${BASE}/v1/status`), getJSON(`${BASE}/v1/ramp`), getJSON(`${BASE}/v1/audit?last=30`),
      getJSON(`${BASE}/v1/traces?last=15`),
    ]);
    renderStatus(status);
    renderRamp(ramp);
    renderAudit(audit.entries);
    renderTraces(traces.traces);
    live(true, "live");
    $("updated").textContent = "updated " + new Date().toLocaleTimeString();
  } catch (err) {
    live(false, `not updating: ${err.message}`);
  }
}

async function refreshSeries() {
  const [last, step] = $("range").value.split("/");
  try { renderSeries(await getJSON(`${BASE}/v1/series?last_s=${last}&step_s=${step}`)); }
  catch (err) { live(false, `charts not updating: ${err.message}`); }
}

wireActions();
$("range").addEventListener("change", refreshSeries);
refresh();
refreshSeries();
setInterval(refresh, STATUS_EVERY_MS);
setInterval(refreshSeries, SERIES_EVERY_MS);

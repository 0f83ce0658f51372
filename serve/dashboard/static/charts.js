// Small SVG line charts: one chart per metric, one line per arm, gaps where a step had no data.
"use strict";

const Charts = (() => {
  const NS = "http://www.w3.org/2000/svg";
  const W = 320, H = 130, LEFT = 42, RIGHT = 6, TOP = 8, BOTTOM = 18;

  function el(name, attrs, text) {
    const node = document.createElementNS(NS, name);
    for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  // A path through the non-null points; a null breaks the line; a lone point is a dot.
  function pathOf(xs, ys, x, y) {
    const segments = [[]];
    let count = 0;
    for (let i = 0; i < ys.length; i++) {
      if (ys[i] === null || ys[i] === undefined || !isFinite(ys[i])) { segments.push([]); continue; }
      segments[segments.length - 1].push(x(xs[i]).toFixed(1) + " " + y(ys[i]).toFixed(1));
      count++;
    }
    const d = segments.filter(s => s.length)
      .map(s => "M" + s.join(" L") + (s.length === 1 ? " L" + s[0] : "")).join(" ");
    return { d, count };
  }

  // A chart whose figures mean nothing yet (nothing configured): the note instead of lines.
  function noteOnly(box, note) {
    const svg = el("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": note });
    svg.appendChild(el("text", { class: "note", x: W / 2, y: H / 2, "text-anchor": "middle" }, note));
    box.dataset.points = 0;
    box.dataset.note = note;
    box.appendChild(svg);
  }

  // spec: {id, title, format(v), starts: [epoch s], lines: [{name, values}], note?}
  // With `note` (e.g. "no device price set: ..."), the chart shows the note and no lines.
  function draw(container, spec) {
    let box = container.querySelector(`[data-chart="${spec.id}"]`);
    if (!box) {
      box = document.createElement("div");
      box.className = "chart";
      box.dataset.chart = spec.id;
      container.appendChild(box);
    }
    box.replaceChildren();
    delete box.dataset.note;
    const head = document.createElement("h3");
    head.textContent = spec.title;
    const last = document.createElement("span");
    last.className = "last";
    box.appendChild(head);
    if (spec.note) {
      last.textContent = "–";
      head.appendChild(last);
      noteOnly(box, spec.note);
      return;
    }
    last.textContent = spec.lines
      .map(l => { const v = [...l.values].reverse().find(v => v !== null); return v === undefined ? "–" : spec.format(v); })
      .join(" / ");
    head.appendChild(last);

    const xs = spec.starts;
    const all = spec.lines.flatMap(l => l.values).filter(v => v !== null && isFinite(v));
    const top = Math.max(...all, 0) * 1.1 || 1;
    const x0 = xs[0], x1 = Math.max(xs[xs.length - 1], x0 + 1);
    const x = t => LEFT + (t - x0) / (x1 - x0) * (W - LEFT - RIGHT);
    const y = v => TOP + (1 - v / top) * (H - TOP - BOTTOM);

    const svg = el("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": spec.title });
    svg.appendChild(el("line", { class: "axis", x1: LEFT, y1: y(0), x2: W - RIGHT, y2: y(0) }));
    svg.appendChild(el("line", { class: "axis", x1: LEFT, y1: TOP, x2: LEFT, y2: y(0) }));
    svg.appendChild(el("text", { x: LEFT - 3, y: TOP + 8, "text-anchor": "end" }, spec.format(top)));
    svg.appendChild(el("text", { x: LEFT - 3, y: y(0), "text-anchor": "end" }, "0"));
    svg.appendChild(el("text", { x: LEFT, y: H - 4 }, `-${Math.round((x1 - x0) / 60)} min`));
    svg.appendChild(el("text", { x: W - RIGHT, y: H - 4, "text-anchor": "end" }, "now"));
    let points = 0;
    for (const line of spec.lines) {
      const { d, count } = pathOf(xs, line.values, x, y);
      points += count;
      if (!count) continue;
      svg.appendChild(el("path", { class: line.name, d, "stroke-linecap": "round", "data-points": count }));
      const i = line.values.map(v => v !== null && isFinite(v)).lastIndexOf(true);
      svg.appendChild(el("circle", { class: line.name + " dot", cx: x(xs[i]), cy: y(line.values[i]), r: 2.5 }));
    }
    box.dataset.points = points;
    box.appendChild(svg);
  }

  return { draw };
})();

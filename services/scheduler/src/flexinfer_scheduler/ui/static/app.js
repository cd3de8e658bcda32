// The FlexInfer status page: draws the document the scheduler pushes over server-sent events (no polling; the
// lease countdowns tick in the browser). Everything is built with DOM calls and textContent: no HTML from data.

const SVG = "http://www.w3.org/2000/svg";
const COLOURS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f"];
const colourOf = new Map();
let latest = null;

function colour(model) {
  if (!colourOf.has(model)) colourOf.set(model, COLOURS[colourOf.size % COLOURS.length]);
  return colourOf.get(model);
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else if (k.startsWith("data-")) node.setAttribute(k, v);
    else if (k === "onclick") node.addEventListener("click", v);
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function svg(tag, attrs = {}, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

function ago(iso) {
  if (!iso) return "never";
  const seconds = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
  if (seconds < 60) return `${Math.round(seconds)} s ago`;
  if (seconds < 3600) return `${Math.round(seconds / 60)} min ago`;
  return `${(seconds / 3600).toFixed(1)} h ago`;
}

function duration(seconds) {
  seconds = Math.max(0, Math.round(seconds));
  const m = Math.floor(seconds / 60), s = seconds % 60;
  return m ? `${m} min ${s} s` : `${s} s`;
}

function bytes(n) {
  if (n === null || n === undefined) return "?";
  const gi = n / 1024 ** 3;
  return gi >= 1 ? `${gi.toFixed(1)} GiB` : `${(n / 1024 ** 2).toFixed(0)} MiB`;
}

function notice(text, error = false) {
  const node = document.getElementById("notice");
  node.textContent = text;
  node.className = error ? "notice error" : "notice";
}

async function act(path, label) {
  try {
    const answer = await fetch(path, { method: "POST", credentials: "same-origin" });
    const body = await answer.json().catch(() => ({}));
    if (!answer.ok) throw new Error(body?.error?.message || `${answer.status}`);
    notice(body.message || `${label}: done`);
  } catch (exc) {
    notice(`${label} failed: ${exc.message}`, true);
  }
}

function actionButton(id, text, label, path) {
  return el("button", { type: "button", "data-id": id, "aria-label": label, onclick: () => act(path, label) }, text);
}

function renderGroups(doc) {
  const root = document.getElementById("groups");
  root.replaceChildren();
  if (!doc.groups.length) root.append(el("p", { class: "empty" }, "No model is configured."));
  for (const g of doc.groups) {
    const holders = g.holders.length ? g.holders.join(", ") : "nothing";
    const parts = [`${g.state}`, `holding the card: ${holders}`];
    if (g.memory) parts.push(`memory ${bytes(g.memory.usedBytes)}${g.memory.capacityBytes ? " of " + bytes(g.memory.capacityBytes) : ""}`);
    if (g.cooldownRemainingSeconds > 0) parts.push(`cooldown ${duration(g.cooldownRemainingSeconds)} left`);
    if (g.lease) parts.push(`leased by ${g.lease.owner}`);
    const table = el("table", { "aria-label": `models of group ${g.name}` },
      el("thead", {}, el("tr", {}, ...["model", "priority", "phase", "state", "waiting", "in flight", "restarts",
        "last active", "why / message", "actions"].map((h) => el("th", { scope: "col" }, h)))));
    const body = el("tbody");
    for (const m of g.members) {
      const state = m.state ? m.state + (m.queuePosition ? ` #${m.queuePosition}` : "") : "";
      body.append(el("tr", { class: m.holdsCard ? "holds" : null, "data-model": m.key },
        el("td", {}, m.key),
        el("td", { class: "num" }, m.priority),
        el("td", {}, el("span", { class: `badge phase-${m.phase}` }, m.phase)),
        el("td", {}, state),
        el("td", { class: "num", "data-field": "waiting" }, m.waiting),
        el("td", { class: "num" }, m.inFlight),
        el("td", { class: "num", "data-field": "restarts" }, m.restarts),
        el("td", {}, ago(m.lastActiveTime)),
        el("td", { class: "message", "data-field": "message" }, m.message || (m.preemptedBy ? `preempted by ${m.preemptedBy}` : "")),
        el("td", {},
          actionButton(`promote:${m.key}`, "Promote", `Promote ${m.key}`, `/ui/api/models/${m.namespace}/${m.name}/promote`),
          " ",
          actionButton(`park:${m.key}`, "Park", `Park ${m.key}`, `/ui/api/models/${m.namespace}/${m.name}/park`))));
    }
    table.append(body);
    root.append(el("article", { class: "group", "data-group": g.name, "aria-labelledby": `group-${g.name}` },
      el("h3", { id: `group-${g.name}` }, `Group ${g.name}`),
      el("p", { class: "summary", "data-field": "summary" }, parts.join(" · ")),
      ...(g.memory && g.memory.devices ? [renderDevices(g)] : []),
      table));
  }
}

// A group with a capacity: one line per card, with a meter of what its models hold and what is free.
function renderDevices(g) {
  const list = el("ul", { class: "devices", "aria-label": `cards of group ${g.name}` });
  for (const d of g.memory.devices) {
    const total = d.usedBytes + d.freeBytes;
    const who = d.models.length ? d.models.join(", ") : "no model";
    const text = `card ${d.index}: ${bytes(d.usedBytes)} used, ${bytes(d.freeBytes)} free of ${bytes(total)} (${who})`;
    list.append(el("li", { "data-device": String(d.index) },
      el("meter", { min: "0", max: String(total), value: String(d.usedBytes), "aria-label": `card ${d.index} memory in use` }),
      " ", el("span", { "data-field": "device" }, text)));
  }
  return list;
}

function axis(root, x0, x1, top, height, start, end) {
  const span = Date.parse(end) - Date.parse(start);
  for (let i = 0; i <= 6; i++) {
    const x = x0 + ((x1 - x0) * i) / 6;
    const minutes = Math.round((span / 60000) * (1 - i / 6));
    root.append(svg("line", { x1: x, x2: x, y1: top, y2: top + height, stroke: "#eee" }));
    root.append(svg("text", { x, y: top + height + 14, "text-anchor": "middle", fill: "#666", "font-size": 11 },
      minutes ? `-${minutes} min` : "now"));
  }
}

function renderTimeline(doc) {
  const root = document.getElementById("timeline");
  root.replaceChildren();
  const t = doc.timeline;
  const lanes = [];
  for (const g of doc.groups) for (const m of g.members) lanes.push([g.name, m.key]);
  if (!lanes.length) { root.append(el("p", { class: "empty" }, "No swap yet.")); return; }
  const width = 1000, left = 220, right = 20, lane = 18, top = 10;
  const height = top + lanes.length * (lane + 6) + 24;
  const start = Date.parse(t.start), span = Date.parse(t.end) - start;
  const xOf = (iso) => left + ((Date.parse(iso) - start) / span) * (width - left - right);
  const chart = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img",
    "aria-label": `swap timeline: ${t.segments.length} periods, ${t.marks.length} failed or aborted swaps` });
  axis(chart, left, width - right, top, lanes.length * (lane + 6), t.start, t.end);
  const yOf = new Map();
  lanes.forEach(([group, model], i) => {
    const y = top + i * (lane + 6);
    yOf.set(`${group}|${model}`, y);
    chart.append(svg("text", { x: 4, y: y + 13, "font-size": 12, fill: "#333" }, `${group}: ${model}`));
    chart.append(svg("rect", { x: left, y, width: width - left - right, height: lane, fill: "#f4f4f4" }));
  });
  const opacity = { held: 1, loading: 0.45, draining: 0.25, parking: 0.25 };
  for (const s of t.segments) {
    const y = yOf.get(`${s.group}|${s.model}`);
    if (y === undefined) continue;
    const rect = svg("rect", { x: xOf(s.start), y, width: Math.max(1, xOf(s.end) - xOf(s.start)), height: lane,
      fill: colour(s.model), "fill-opacity": opacity[s.kind] ?? 1, "data-kind": s.kind });
    rect.append(svg("title", {}, `${s.model} ${s.kind} ${s.start} – ${s.end}`));
    chart.append(rect);
  }
  for (const m of t.marks) {
    const y = yOf.get(`${m.group}|${m.model}`) ?? top;
    const x = xOf(m.time);
    const mark = svg("g", { "data-kind": m.kind, class: "mark" });
    const stroke = m.kind === "failed" ? "#b3261e" : "#9a6700";
    mark.append(svg("line", { x1: x - 5, y1: y + 2, x2: x + 5, y2: y + lane - 2, stroke, "stroke-width": 2.5 }));
    mark.append(svg("line", { x1: x - 5, y1: y + lane - 2, x2: x + 5, y2: y + 2, stroke, "stroke-width": 2.5 }));
    mark.append(svg("title", {}, `${m.kind}: ${m.text}`));
    chart.append(mark);
  }
  root.append(chart);
  root.append(el("p", { class: "empty" }, "Solid: holds the card · lighter: loading · faint: draining or parking · ✕: a swap that failed (red) or was aborted."));
}

function renderQueues(doc) {
  const root = document.getElementById("queues");
  root.replaceChildren();
  const q = doc.queues;
  if (!q.series.length) { root.append(el("p", { class: "empty" }, "No request waited in the last hour.")); return; }
  const width = 1000, left = 220, right = 20, height = 140, top = 10, plot = height - top - 24;
  const start = Date.parse(q.start), span = Date.parse(q.end) - start;
  const peak = Math.max(1, q.peak);
  const chart = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img",
    "aria-label": `requests waiting per model, peak ${q.peak}` });
  axis(chart, left, width - right, top, plot, q.start, q.end);
  chart.append(svg("text", { x: 4, y: top + 12, "font-size": 11, fill: "#666" }, `peak ${q.peak}`));
  q.series.forEach((s, i) => {
    const points = s.points.map(([t, n]) =>
      `${(left + ((Date.parse(t) - start) / span) * (width - left - right)).toFixed(1)},${(top + plot - (n / peak) * plot).toFixed(1)}`);
    const last = s.points[s.points.length - 1];
    points.push(`${width - right},${(top + plot - (last[1] / peak) * plot).toFixed(1)}`);
    chart.append(svg("polyline", { points: points.join(" "), fill: "none", stroke: colour(s.model), "stroke-width": 1.5 }));
    chart.append(svg("text", { x: 4, y: top + 28 + i * 14, "font-size": 11, fill: colour(s.model) }, s.model));
  });
  root.append(chart);
}

function renderLeases(doc) {
  const root = document.getElementById("leases");
  root.replaceChildren();
  if (!doc.leases.length) { root.append(el("p", { class: "empty" }, "No lease holds a group.")); return; }
  const table = el("table", { "aria-label": "GPU leases" },
    el("thead", {}, el("tr", {}, ...["lease", "group", "owner", "expires in", ""].map((h) => el("th", { scope: "col" }, h)))));
  const body = el("tbody");
  for (const l of doc.leases) {
    body.append(el("tr", { "data-lease": l.name },
      el("td", {}, l.name), el("td", {}, l.group), el("td", {}, l.owner),
      el("td", { "data-expires": l.expiresAt, class: "num" }, duration(l.remainingSeconds)),
      el("td", {}, actionButton(`release:${l.name}`, "Release", `Release lease ${l.name}`, `/ui/api/leases/${encodeURIComponent(l.name)}/release`))));
  }
  table.append(body);
  root.append(table);
}

function renderEvents(doc) {
  const root = document.getElementById("events");
  root.replaceChildren();
  if (!doc.events.length) root.append(el("li", { class: "empty" }, "Nothing happened in the last hour."));
  for (const e of doc.events) {
    root.append(el("li", { class: e.severity, "data-kind": e.kind },
      el("time", { datetime: e.time }, new Date(e.time).toLocaleTimeString()),
      el("span", { class: "kind" }, e.kind),
      e.group ? `[${e.group}] ` : "",
      e.text));
  }
}

function render(doc) {
  latest = doc;
  const focused = document.activeElement?.dataset?.id; // keep the keyboard where it was across a redraw
  renderGroups(doc);
  renderTimeline(doc);
  renderQueues(doc);
  renderLeases(doc);
  renderEvents(doc);
  if (focused) document.querySelector(`[data-id="${CSS.escape(focused)}"]`)?.focus();
  document.body.dataset.updated = doc.now;
}

function tick() {
  for (const node of document.querySelectorAll("[data-expires]")) {
    node.textContent = duration((Date.parse(node.dataset.expires) - Date.now()) / 1000);
  }
}

function connect() {
  const status = document.getElementById("connection");
  const source = new EventSource("/ui/api/events");
  source.addEventListener("state", (event) => {
    status.textContent = "live";
    status.className = "connection live";
    render(JSON.parse(event.data));
  });
  source.addEventListener("error", () => {
    status.textContent = "reconnecting…";
    status.className = "connection down";
  });
}

connect();
setInterval(tick, 1000);
export { render, latest };

// setl status page: polls /api/status every second and /api/history every two, draws SVG graphs.
// No framework, no build step: every element is built with the DOM API (text never becomes markup).
"use strict";

const COLORS = ["#2f6fd0", "#1f9d55", "#d68a00", "#9b4dca", "#d33a2c", "#138a8a", "#b8860b", "#5a6b7f"];
const WINDOW = 3600; // seconds of history shown
const history = { times: [], pipelines: {} };
let lastHistoryTime = null;
const colorOf = {};

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "class") node.className = value; else node.setAttribute(key, value);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function svg(tag, attrs) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
  return node;
}

function seconds(value) {
  if (value === null || value === undefined) return "–";
  if (value < 1) return `${Math.round(value * 1000)} ms`;
  if (value < 120) return `${value.toFixed(1)} s`;
  if (value < 7200) return `${(value / 60).toFixed(1)} min`;
  return `${(value / 3600).toFixed(1)} h`;
}

function bytes(value) {
  if (value === null || value === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (value >= 1024 && i < units.length - 1) { value /= 1024; i += 1; }
  return `${i ? value.toFixed(1) : value} ${units[i]}`;
}

function count(value) {
  if (value === null || value === undefined) return "–";
  if (value >= 1e6) return `${(value / 1e6).toFixed(2)} M`;
  if (value >= 1e4) return `${(value / 1e3).toFixed(1)} k`;
  return String(Math.round(value));
}

function position(value) {
  if (value === null || value === undefined) return "–";
  if (typeof value === "string") return value;
  let text = `${value.log}:${value.offset}`;
  if (value.row) text += `+${value.row}`;
  if (value.gtid) text += ` (gtid ${value.gtid})`;
  return text;
}

function ago(epochSeconds, now) {
  if (!epochSeconds) return "never";
  return `${seconds(Math.max(0, now - epochSeconds))} ago`;
}

// What a pipeline is doing, as this node sees it: the meta store's status refined by live facts.
function stateOf(row) {
  if (row.status === "paused") return "paused";
  if (row.retrying) return "retrying";
  if (row.ended && row.error) return "failed";
  if (row.status === "running" && !row.running_here && row.holder !== undefined) return "standby";
  return row.status || "stopped";
}

function figure(label, value, level) {
  return el("div", { class: "figure" }, el("div", { class: "label" }, label),
    el("div", { class: "value" + (level ? " " + level : "") }, value));
}

function snapshotBars(snapshot) {
  // `snapshot` of a status row (setl.status.snapshot_rows): [{table, status, rows, estimate, chunks, ...}]
  if (!Array.isArray(snapshot) || !snapshot.length) return null;
  const box = el("div", { class: "snapshot" }, el("div", { class: "muted" }, "Snapshot"));
  for (const item of snapshot) {
    const done = item.rows ?? 0;
    const total = Math.max(item.estimate ?? 0, done);
    const finished = item.status === "done";
    const fraction = finished ? 1 : Math.max(0, Math.min(1, total ? done / total : 0));
    const label = `${item.table}: ${count(done)}${total ? " / " + count(total) : ""} rows` +
      ` (${Math.round(fraction * 100)}%) ${item.status}`;
    const fill = el("div", { style: `width:${(fraction * 100).toFixed(1)}%` });
    box.append(el("div", { class: "mono" }, label), el("div", { class: "bar", role: "progressbar",
      "aria-valuenow": String(Math.round(fraction * 100)), "aria-valuemin": "0", "aria-valuemax": "100" }, fill));
  }
  return box;
}

function verifyBox(result, now) {
  // `verify` of a status row: the last scheduled check (setl.verify.schedule), or null
  if (!result) return null;
  const head = `Last check ${ago(result.time, now)}: `;
  let text;
  if (result.error) text = head + `no verdict: ${result.error}`;
  else if (result.equal) text = head + `${(result.tables || []).length} table(s), ${count(result.rows)} rows, equal`;
  else text = head + `${count(result.differences)} difference(s) in ` + (result.tables || []).filter(t => !t.equal)
    .map(t => `${t.table} (${t.missing} missing, ${t.extra} extra, ${t.different} different)`).join(", ");
  return el("div", { class: result.equal ? "verify muted" : "verify error-box", "data-role": "verify" }, text);
}

function quarantineBox(tables, pipeline) {
  // `quarantined` of a status row: [{table, state, cause, first_position, changes, bytes}] (docs/quarantine.md)
  if (!Array.isArray(tables) || !tables.length) return null;
  const box = el("div", { class: "error-box", "data-role": "quarantined" });
  for (const t of tables) {
    box.append(el("div", {}, `${t.table} quarantined since ${t.first_position}: ${count(t.changes)} changes ` +
      `(${bytes(t.bytes)}) kept. ${t.cause}. Fix it, then setl resume --pipeline ${pipeline} --table ${t.table}`));
  }
  return box;
}

function card(row, now) {
  const state = stateOf(row);
  const f = row.figures || {};
  const lagLevel = f.lag_seconds > 30 ? "bad" : f.lag_seconds > 5 ? "warn" : "";
  const node = el("article", { class: `card ${state}`, "data-pipeline": row.pipeline, "data-state": state },
    el("h2", {}, el("span", { class: "name" }, row.pipeline), el("span", { class: `badge ${state}` }, state),
      f.caught_up ? el("span", { class: "badge healthy" }, "caught up") : null));
  node.append(el("div", { class: "figures" },
    figure("lag", seconds(f.lag_seconds), lagLevel),
    figure("rate", f.rows_per_second === undefined ? "–" : `${count(f.rows_per_second)} rows/s`),
    figure("behind", f.bytes_behind === undefined ? "–" : bytes(f.bytes_behind)),
    figure("events behind", count(f.events_behind)),
    figure("in flight", f.in_flight === undefined ? "–" : `${f.in_flight} batches`),
    figure("acked here", count(f.acked_rows))));
  const details = el("dl", {});
  const add = (term, value, cls) => details.append(el("dt", {}, term), el("dd", cls ? { class: cls } : {}, value));
  add("position", position(f.position ?? row.position), "mono");
  add("last ack", `batch ${row.batch ?? "–"}, ${ago(row.acked_at, now)}`);
  add("epoch", row.epoch ?? "–");
  const leader = row.holder !== undefined ? (row.holder || "none") : (row.node || "–");
  add("leader", leader + (row.running_here ? " (this node)" : ""));
  if (row.standbys !== undefined) add("standbys", row.standbys.length ? row.standbys.join(", ") : "none");
  if (f.source_heard_ago !== null && f.source_heard_ago !== undefined) add("source heard", `${seconds(f.source_heard_ago)} ago`);
  node.append(details);
  if (row.retrying) {
    node.append(el("div", { class: "retry-box" }, `retrying since ${ago(row.retrying_since, now)}: ${row.retrying}`));
  }
  if (row.error) node.append(el("div", { class: "error-box", "data-role": "error" }, row.error));
  const kept = quarantineBox(row.quarantined, row.pipeline);
  if (kept) node.append(kept);
  const bars = snapshotBars(row.snapshot);
  if (bars) node.append(bars);
  const checked = verifyBox(row.verify, now);
  if (checked) node.append(checked);
  if (row.conflicts) {
    // conflicts settled by the running process, by decision (docs/conflicts.md); the record is the target's setl_conflicts
    const parts = Object.entries(row.conflicts).sort().map(([decision, n]) => `${decision} ${count(n)}`);
    const total = Object.values(row.conflicts).reduce((a, b) => a + b, 0);
    node.append(el("div", { class: "retry-box", "data-role": "conflicts" },
      `${count(total)} conflict(s) settled since it started (${parts.join(", ")}); see the target's setl_conflicts table`));
  }
  const buttons = actionButtons(row);
  if (buttons) node.append(buttons);
  if (row.recent_rollbacks && row.recent_rollbacks.length) {
    const list = el("ul", { class: "rollbacks" });
    for (const rb of row.recent_rollbacks.slice(-5).reverse()) {
      list.append(el("li", {}, `${ago(rb.time, now)}: batch ${rb.batch} (attempt ${rb.attempt}) `,
        el("span", { class: "mono" }, rb.error)));
    }
    node.append(el("div", { class: "muted" }, "Recent rollbacks"), list);
  }
  return node;
}

function render(status) {
  const now = status.time;
  document.getElementById("node").textContent = `node ${status.node}`;
  const health = document.getElementById("health");
  health.textContent = status.healthy ? "healthy" : "unhealthy";
  health.className = `badge ${status.healthy ? "healthy" : "unhealthy"}`;
  document.getElementById("proc").textContent =
    `${status.threads} threads · ${bytes((status.rss_bytes || 0) + (status.jvm_rss_bytes || 0))} RSS` +
    (status.jvm_rss_bytes ? ` (Spark JVM ${bytes(status.jvm_rss_bytes)})` : "");
  document.getElementById("updated").textContent = `updated ${new Date(now * 1000).toLocaleTimeString()}`;
  const box = document.getElementById("pipelines");
  box.replaceChildren(...status.pipelines.map((row) => card(row, now)));
  renderCluster(status.cluster, now);
}

// The whole cluster (nodes sharing one ZooKeeper), as every node sees it: docs/cluster.md.
function renderCluster(cluster, now) {
  const box = document.getElementById("cluster");
  if (!cluster || !cluster.nodes) { box.hidden = true; return; }
  box.hidden = false;
  const last = cluster.last_rebalance;
  const head = el("h2", {}, "Cluster ", el("span", { class: "muted" },
    `coordinator ${cluster.coordinator || "–"} · ${cluster.moves} moves` +
    (last ? ` · last: ${last.pipeline} ${last.from || "–"} → ${last.to || "–"} (${last.reason}), ${ago(last.time, now)}` : "")));
  const table = el("table", { class: "cluster-nodes" },
    el("tr", {}, ...["node", "live", "capacity", "weight", "pipelines"].map((h) => el("th", {}, h))));
  for (const [name, node] of Object.entries(cluster.nodes)) {
    table.append(el("tr", { "data-node": name },
      el("td", {}, name), el("td", {}, node.live ? (node.draining ? "draining" : "yes") : "lost"),
      el("td", {}, node.capacity === null ? "–" : String(node.capacity)), el("td", {}, String(node.weight)),
      el("td", { class: "mono" }, node.pipelines.join(", ") ||
        (node.lost_pipelines && node.lost_pipelines.length ? `(had ${node.lost_pipelines.join(", ")})` : "–")),
      api.role === "operator" && node.live && !node.draining
        ? el("td", {}, actionButton("Drain", "drain", `Drain node ${name}: move every pipeline it runs away?`,
          () => act("POST", `/cluster/nodes/${encodeURIComponent(name)}/drain`, {}, `drain ${name}`))) : null));
  }
  box.replaceChildren(head, table);
}

function mergeHistory(part) {
  const start = history.times.length;
  history.times.push(...part.times);
  for (const [name, series] of Object.entries(part.pipelines)) {
    if (!history.pipelines[name]) {
      history.pipelines[name] = { lag: new Array(start).fill(null), rate: new Array(start).fill(null) };
    }
    const mine = history.pipelines[name];
    mine.lag.push(...series.lag);
    mine.rate.push(...series.rate);
  }
  for (const mine of Object.values(history.pipelines)) {
    while (mine.lag.length < history.times.length) { mine.lag.push(null); mine.rate.push(null); }
  }
  const newest = history.times[history.times.length - 1];
  let drop = 0;
  while (drop < history.times.length && history.times[drop] < newest - WINDOW) drop += 1;
  if (drop) {
    history.times.splice(0, drop);
    for (const mine of Object.values(history.pipelines)) { mine.lag.splice(0, drop); mine.rate.splice(0, drop); }
  }
  if (part.times.length) lastHistoryTime = part.times[part.times.length - 1];
}

function niceMax(value) {
  if (!(value > 0)) return 1;
  const power = Math.pow(10, Math.floor(Math.log10(value)));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * power >= value) return m * power;
  return 10 * power;
}

function drawGraph(node) {
  const key = node.dataset.series;
  const unit = node.dataset.unit;
  const W = 600, H = 200, left = 44, bottom = 18, top = 6, right = 6;
  const times = history.times;
  const names = Object.keys(history.pipelines).sort();
  let max = 0;
  for (const name of names) for (const v of history.pipelines[name][key]) if (v !== null && v > max) max = v;
  max = niceMax(max);
  const newest = times.length ? times[times.length - 1] : Date.now() / 1000;
  // The shortest of 5, 15, 30 and 60 minutes that holds what was sampled, so a young node's graph is readable.
  const span = times.length ? newest - times[0] : 0;
  const shown = [300, 900, 1800, WINDOW].find((w) => w >= span) || WINDOW;
  const x = (t) => left + (W - left - right) * (1 - (newest - t) / shown);
  const y = (v) => top + (H - top - bottom) * (1 - v / max);
  const parts = [];
  for (let i = 0; i <= 4; i += 1) {
    const v = (max * i) / 4;
    parts.push(svg("line", { class: "grid", x1: left, x2: W - right, y1: y(v), y2: y(v) }));
    const label = svg("text", { x: left - 4, y: y(v) + 3, "text-anchor": "end" });
    label.textContent = unit === "s" ? seconds(v) : (max < 10 ? v.toFixed(v % 1 ? 1 : 0) : count(v));
    parts.push(label);
  }
  const step = { 300: 60, 900: 180, 1800: 300 }[shown] || 900;
  for (let back = shown; back >= 0; back -= step) {
    const minutes = back / 60;
    const label = svg("text", { x: x(newest - back), y: H - 4, "text-anchor": back === shown ? "start" : back === 0 ? "end" : "middle" });
    label.textContent = back ? `-${minutes} min` : "now";
    parts.push(label);
  }
  for (const name of names) {
    const values = history.pipelines[name][key];
    let points = [];
    const flush = () => {
      if (points.length) parts.push(svg("polyline", { points: points.join(" "), stroke: colorOf[name], "data-pipeline": name }));
      points = [];
    };
    for (let i = 0; i < times.length; i += 1) {
      if (values[i] === null) { flush(); continue; }
      points.push(`${x(times[i]).toFixed(1)},${y(values[i]).toFixed(1)}`);
    }
    flush();
  }
  node.dataset.points = String(names.reduce((n, name) => n + history.pipelines[name][key].filter((v) => v !== null).length, 0));
  node.dataset.max = String(max);
  node.replaceChildren(...parts);
}

function drawLegend() {
  const legend = document.getElementById("legend");
  const names = Object.keys(history.pipelines).sort();
  names.forEach((name, i) => { if (!colorOf[name]) colorOf[name] = COLORS[i % COLORS.length]; });
  legend.replaceChildren(...names.map((name) => el("span", { style: `--swatch:${colorOf[name]}` }, name)));
}

async function getJSON(url) {
  const response = await fetch(url, { cache: "no-store" });
  if (!response.ok && response.status !== 503) throw new Error(`${url}: HTTP ${response.status}`);
  return response.json();
}

function showError(error) {
  const box = document.getElementById("error");
  if (!error) { box.hidden = true; return; }
  box.textContent = `Cannot reach the node: ${error.message}`;
  box.hidden = false;
  // What the page last heard is no longer known: no badge keeps saying healthy or running.
  for (const badge of document.querySelectorAll(".badge")) {
    badge.className = "badge unknown";
    badge.textContent = "unknown";
  }
  for (const card of document.querySelectorAll("article.card")) card.dataset.state = "unknown";
}

async function pollStatus() {
  await pollOnce();
  setTimeout(pollStatus, 1000);
}

async function pollHistory() {
  try {
    const url = lastHistoryTime === null ? "/api/history" : `/api/history?since=${lastHistoryTime}`;
    mergeHistory(await getJSON(url));
    drawLegend();
    for (const node of document.querySelectorAll("svg[data-series]")) drawGraph(node);
  } catch (error) { showError(error); }
  setTimeout(pollHistory, 2000);
}

// Actions (the control API, /api/v1): for an operator's token only. The token is kept for this
// tab (sessionStorage) and sent as a bearer token; a viewer's token or none shows no button.
const api = { token: sessionStorage.getItem("setl-api-token") || "", role: null };
let lastStatus = null;

async function callApi(method, path, body) {
  const response = await fetch("/api/v1" + path, {
    method, cache: "no-store", body: body === undefined ? undefined : JSON.stringify(body),
    headers: { "Authorization": `Bearer ${api.token}`, "Content-Type": "application/json" },
  });
  const data = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(data.error || `HTTP ${response.status}`);
  return data;
}

async function signIn(token) {
  api.token = token;
  api.role = null;
  const role = document.getElementById("role");
  role.textContent = "";
  if (token) {
    try {
      api.role = (await callApi("GET", "/whoami")).role;
      sessionStorage.setItem("setl-api-token", token);
      role.textContent = api.role;
    } catch (error) {
      sessionStorage.removeItem("setl-api-token");
      role.textContent = `refused: ${error.message}`;
    }
  }
  document.body.dataset.role = api.role || "none";
  if (lastStatus) render(lastStatus);
}

function actionButton(label, action, question, run) {
  const button = el("button", { type: "button", "data-action": action }, label);
  button.addEventListener("click", () => { if (window.confirm(question)) run(); });
  return button;
}

function actionButtons(row) {
  if (api.role !== "operator") return null;
  const name = row.pipeline;
  const path = `/pipelines/${encodeURIComponent(name)}`;
  const paused = row.status === "paused";
  const recopy = el("button", { type: "button", "data-action": "snapshot" }, "Re-copy a table…");
  recopy.addEventListener("click", () => {
    const table = window.prompt(`Copy which table of ${name} again, online? (SCHEMA.TABLE)`);
    if (table && window.confirm(`Copy ${table} again into the target of ${name}?`)) {
      act("POST", `${path}/snapshot`, { tables: [table] }, `re-copy ${table}`);
    }
  });
  return el("div", { class: "actions" },
    paused
      ? actionButton("Resume", "resume", `Resume ${name}?`, () => act("POST", `${path}/resume`, {}, `resume ${name}`))
      : actionButton("Pause", "pause", `Pause ${name}? Its node stops it at a batch boundary.`,
        () => act("POST", `${path}/pause`, {}, `pause ${name}`)),
    recopy,
    actionButton("Verify", "verify", `Compare the source and target tables of ${name} now?`,
      () => act("POST", `${path}/verify`, {}, `verify ${name}`)));
}

function operationBox(title) {
  const box = el("div", { class: "operation", "data-state": "running" }, el("strong", {}, title), " ",
    el("span", { "data-role": "progress" }, "…"));
  const list = document.getElementById("operations");
  list.hidden = false;
  list.prepend(box);
  return box;
}

function progressText(op) {
  const p = op.progress || {};
  if (p.message) return p.message;
  if (p.table !== undefined) return `${p.table}: ${count(p.rows)} rows` + (p.estimate ? ` of ~${count(p.estimate)}` : "");
  if (p.tables) return p.tables.map((t) => `${t.table} ${t.status} ${count(t.rows)} rows`).join(", ");
  return op.state;
}

async function act(method, path, body, title) {
  const box = operationBox(title);
  const progress = box.querySelector("[data-role=progress]");
  const finish = (state, text, report) => {
    box.dataset.state = state;
    progress.textContent = text;
    if (report) box.append(el("pre", { "data-role": "report" }, report));
  };
  try {
    let answer = await callApi(method, path, body);
    if (answer.id && answer.state) {
      box.dataset.op = answer.id;
      while (answer.state === "running") {
        progress.textContent = progressText(answer);
        await new Promise((resolve) => setTimeout(resolve, 500));
        answer = await callApi("GET", `/operations/${answer.id}`);
      }
      if (answer.state === "failed") finish("failed", answer.error);
      else finish("done", answer.result.message || "done", (answer.result.lines || []).join("\n") || null);
    } else {
      finish("done", answer.message || "done");
    }
  } catch (error) {
    finish("failed", error.message);
  }
  pollOnce();
}

async function pollOnce() {
  try { lastStatus = await getJSON("/api/status"); render(lastStatus); showError(null); } catch (error) { showError(error); }
}

document.getElementById("signin").addEventListener("submit", (event) => {
  event.preventDefault();
  signIn(document.getElementById("token").value.trim());
});
document.body.dataset.role = "none";
if (api.token) signIn(api.token);

// The status the page was served with: shown at once, before the first request for one.
const initial = document.getElementById("initial-status");
if (initial) {
  try { lastStatus = JSON.parse(initial.textContent); render(lastStatus); } catch (error) { showError(error); }
}
pollStatus();
pollHistory();

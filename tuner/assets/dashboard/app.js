// nestor dashboard: one page, no build step. It asks the server for the
// experiment list, one experiment's table, and the points it has not seen.
// Whatever an experiment holds (names, config keys and values, metric
// names, logs) reaches the page as text, never as markup: every element is
// built with h() below, none from HTML strings.
"use strict";
const STATES = ["RUNNING", "TERMINATED", "PAUSED", "ERROR", "PENDING"];
const COLORS = { RUNNING: "#2563eb", TERMINATED: "#9ca3af", PAUSED: "#d97706", ERROR: "#dc2626", PENDING: "#d1d5db" };

const st = {
  exp: 0, info: null, rows: [], curves: new Map(), after: 0, epoch: -1, version: -1, metric: null,
  sort: { key: "c:id", dir: 1 }, states: new Set(STATES), selected: null, plot: null, painted: false, updates: 0,
};

const $ = (id) => document.getElementById(id);

// An element: h("td", { class: "x", "data-id": id }, "text", child, ...). Strings become text nodes.
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === false || v === null || v === undefined) continue;
    el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat(Infinity)) el.append(c instanceof Node ? c : String(c ?? ""));
  return el;
}

// Replaces what `el` holds.
function fill(el, ...children) {
  el.replaceChildren(...children.flat(Infinity).map((c) => (c instanceof Node ? c : String(c ?? ""))));
}

// The token travels in an HttpOnly cookie set by the first load; the page never sees it.
async function api(path) {
  const r = await fetch("api/" + path, { credentials: "same-origin" });
  if (!r.ok) throw new Error(path + ": " + r.status + " " + (await r.text()));
  return r.json();
}

function fmt(x) {
  if (x === null || x === undefined || Number.isNaN(x)) return "";
  if (typeof x !== "number") return String(x);
  if (Number.isInteger(x) && Math.abs(x) < 1e9) return String(x);
  const a = Math.abs(x);
  if (a !== 0 && (a < 1e-3 || a >= 1e6)) return x.toExponential(3);
  return String(+x.toFixed(4));
}

function flat(obj, prefix = "", out = {}) {
  if (obj && typeof obj === "object" && !Array.isArray(obj)) {
    for (const [k, v] of Object.entries(obj)) flat(v, prefix ? prefix + "." + k : k, out);
  } else if (prefix) out[prefix] = obj;
  return out;
}

function duration(s) {
  s = Math.max(0, Math.round(s));
  if (s < 60) return s + "s";
  if (s < 3600) return Math.floor(s / 60) + "m" + String(s % 60).padStart(2, "0") + "s";
  return Math.floor(s / 3600) + "h" + String(Math.floor((s % 3600) / 60)).padStart(2, "0") + "m";
}

// Each trial's score: its best value of the metric under the mode.
function scores() {
  const max = st.info && st.info.mode === "max";
  const out = new Map();
  for (const [id, c] of st.curves) {
    let best = null;
    for (const v of c.val) if (v !== null && Number.isFinite(v) && (best === null || (max ? v > best : v < best))) best = v;
    if (best !== null) out.set(id, best);
  }
  return out;
}

function bestTrial(sc) {
  const max = st.info && st.info.mode === "max";
  let best = null;
  for (const [id, v] of sc) if (best === null || (max ? v > best[1] : v < best[1])) best = [id, v];
  return best;
}

function visibleRows() {
  const q = $("filter").value.trim().toLowerCase();
  return st.rows.filter((r) => st.states.has(r.status) && (!q || r.id.includes(q) || JSON.stringify(r.config).toLowerCase().includes(q)));
}

function topIds(sc) {
  const k = +$("topk").value || 0;
  if (!k) return null;
  const max = st.info && st.info.mode === "max";
  const ids = [...sc.entries()].sort((a, b) => (max ? b[1] - a[1] : a[1] - b[1])).slice(0, k).map((e) => e[0]);
  return new Set(ids);
}

function renderHeader() {
  const i = st.info;
  fill($("badge"), i.live ? h("span", { class: "live" }, "live") : h("span", { class: "done" }, "finished"));
  const c = i.counts;
  const pending = i.status ? i.status.pending : c.PENDING;
  const trials = i.status ? `${i.trials} of ${i.status.planned}` : `${i.trials}`;
  let s = `${trials} trials: ${c.RUNNING} running, ${c.TERMINATED} terminated, ${c.ERROR} error, ${c.PAUSED} paused, ${pending} pending · ${i.points} results`;
  if (i.status) {
    s += ` · ${duration(i.status.elapsed_s)}`;
    if (i.status.eta_s !== null && i.status.eta_s !== undefined) s += `, ETA ${duration(i.status.eta_s)}`;
  }
  const b = bestTrial(scores());
  if (b) s += ` · best ${st.metric}=${fmt(b[1])} (${b[0]})`;
  $("summary").textContent = s;
}

function renderCurves() {
  const sc = scores();
  const best = bestTrial(sc);
  const top = topIds(sc);
  const shown = new Set(visibleRows().map((r) => r.id));
  const byId = new Map(st.rows.map((r) => [r.id, r]));
  const useTime = $("xaxis").value === "time";
  const data = [null];
  const series = [{}];
  const ordered = [...st.curves.keys()].filter((id) => shown.has(id) && (!top || top.has(id)));
  // The best is drawn last, on top.
  ordered.sort((a, b) => (best && a === best[0]) - (best && b === best[0]));
  for (const id of ordered) {
    const c = st.curves.get(id);
    const xs = [], ys = [];
    for (let k = 0; k < c.val.length; k++) {
      const x = useTime ? c.time[k] : c.iter[k];
      const y = c.val[k];
      if (x === null || y === null) continue;
      if ($("logy").checked && !(y > 0)) continue;
      xs.push(x); ys.push(y);
    }
    data.push([xs, ys]);
    const isBest = best && id === best[0];
    const status = (byId.get(id) || {}).status || "PENDING";
    series.push({
      label: id, stroke: isBest ? "#16a34a" : COLORS[status], width: isBest ? 3 : 1,
      paths: uPlot.paths.linear(), points: { show: false },
    });
  }
  const el = $("curves");
  const width = Math.max(300, el.clientWidth);
  const opts = {
    mode: 2, width, height: 320, legend: { show: false }, cursor: { drag: { x: true, y: true } },
    scales: { x: { time: false, auto: true }, y: { auto: true, distr: $("logy").checked ? 3 : 1 } },
    axes: [{ label: useTime ? "time_total_s" : "training_iteration" }, { label: st.metric || "" }],
    series,
  };
  if (st.plot) st.plot.destroy();
  fill(el);
  st.plot = new uPlot(opts, data, el);
  el.dataset.series = String(ordered.length);
  el.dataset.points = String(data.slice(1).reduce((n, s) => n + s[0].length, 0));
}

function renderParcoords() {
  const canvas = $("parcoords");
  const width = Math.max(300, canvas.parentElement.clientWidth - 24);
  const ratio = window.devicePixelRatio || 1;
  canvas.width = width * ratio; canvas.height = 300 * ratio; canvas.style.width = width + "px"; canvas.style.height = "300px";
  const ctx = canvas.getContext("2d");
  ctx.scale(ratio, ratio);
  ctx.clearRect(0, 0, width, 300);
  const sc = scores();
  const shown = new Set(visibleRows().map((r) => r.id));
  const rows = st.rows.filter((r) => shown.has(r.id) && sc.has(r.id));
  const configs = rows.map((r) => flat(r.config));
  const keys = [...new Set(configs.flatMap((c) => Object.keys(c)))].filter((k) => new Set(configs.map((c) => JSON.stringify(c[k]))).size > 1);
  const axes = keys.map((k) => {
    const vals = configs.map((c) => c[k]);
    const numeric = vals.every((v) => typeof v === "number");
    const log = numeric && st.info.log_params.includes(k) && vals.every((v) => v > 0);
    if (numeric) {
      const t = vals.map((v) => (log ? Math.log10(v) : v));
      return { name: k, pos: t, min: Math.min(...t), max: Math.max(...t), log };
    }
    const cats = [...new Set(vals.map((v) => JSON.stringify(v)))].sort();
    return { name: k, pos: vals.map((v) => cats.indexOf(JSON.stringify(v))), min: 0, max: Math.max(1, cats.length - 1), cats };
  });
  const m = rows.map((r) => sc.get(r.id));
  axes.push({ name: st.metric || "metric", pos: m, min: Math.min(...m), max: Math.max(...m), metric: true });
  const left = 40, right = 60, top = 24, bottom = 20, h = 300 - top - bottom;
  const step = axes.length > 1 ? (width - left - right) / (axes.length - 1) : 0;
  const y = (a, v) => top + h - (a.max === a.min ? 0.5 : (v - a.min) / (a.max - a.min)) * h;
  const max = st.info.mode === "max";
  const best = bestTrial(sc);
  const color = (v, a) => {
    let t = a.max === a.min ? 0.5 : (v - a.min) / (a.max - a.min);
    if (!max) t = 1 - t;
    return `hsl(${220 - 180 * t}, 70%, ${45 + 10 * t}%)`;
  };
  const mAxis = axes[axes.length - 1];
  ctx.globalAlpha = rows.length > 200 ? 0.35 : 0.7;
  rows.forEach((r, i) => {
    ctx.beginPath();
    axes.forEach((a, j) => (j ? ctx.lineTo : ctx.moveTo).call(ctx, left + j * step, y(a, a.pos[i])));
    ctx.strokeStyle = best && r.id === best[0] ? "#16a34a" : color(m[i], mAxis);
    ctx.lineWidth = best && r.id === best[0] ? 3 : 1;
    ctx.stroke();
  });
  ctx.globalAlpha = 1;
  ctx.fillStyle = "#1d2430"; ctx.strokeStyle = "#111827"; ctx.font = "11px system-ui"; ctx.textAlign = "center";
  axes.forEach((a, j) => {
    const x = left + j * step;
    ctx.beginPath(); ctx.moveTo(x, top); ctx.lineTo(x, top + h); ctx.lineWidth = 1; ctx.stroke();
    ctx.fillText(a.name + (a.log ? " (log)" : ""), x, 14);
    const lab = (v) => (a.cats ? JSON.parse(a.cats[Math.round(v)] ?? "null") : fmt(a.log ? 10 ** v : v));
    ctx.fillText(String(lab(a.max)), x, top - 2 + 12 > top ? top + 10 : top);
    ctx.fillText(String(lab(a.min)), x, top + h + 14);
  });
  canvas.dataset.lines = String(rows.length);
  canvas.dataset.axes = axes.map((a) => a.name + (a.log ? " (log)" : "")).join(",");
}

function renderStates() {
  const counts = {};
  for (const r of st.rows) counts[r.status] = (counts[r.status] || 0) + 1;
  fill($("states"), STATES.map((s) => [h("label", {},
    h("input", { type: "checkbox", "data-state": s, checked: st.states.has(s) }), " ", h("span", { class: "s-" + s }, s), " ", String(counts[s] || 0)), " "]));
  for (const cb of $("states").querySelectorAll("input")) {
    cb.onchange = () => { cb.checked ? st.states.add(cb.dataset.state) : st.states.delete(cb.dataset.state); renderAll(); };
  }
}

// A trial's GPU figures (the driver's sampler adds them to its results
// where it holds GPUs), as `nestor status` words them; "" without them.
const GPU_UTIL_MEAN = "gpu_util_mean_percent", GPU_UTIL_PEAK = "gpu_util_peak_percent";
const GPU_MEM_MEAN = "gpu_memory_mean_bytes", GPU_MEM_PEAK = "gpu_memory_peak_bytes";
function gpuText(m, long) {
  if (!m || !(GPU_UTIL_MEAN in m)) return "";
  const pct = (k) => (m[k] ?? NaN).toFixed(0) + "%";
  const gib = (k) => ((m[k] ?? NaN) / 2 ** 30).toFixed(1) + " GiB";
  return long
    ? `utilisation mean ${pct(GPU_UTIL_MEAN)} (peak ${pct(GPU_UTIL_PEAK)}), memory mean ${gib(GPU_MEM_MEAN)} (peak ${gib(GPU_MEM_PEAK)})`
    : `${pct(GPU_UTIL_MEAN)} (${pct(GPU_UTIL_PEAK)}) · ${gib(GPU_MEM_MEAN)}`;
}

function renderTable() {
  const sc = scores();
  const best = bestTrial(sc);
  const params = [...new Set(st.rows.flatMap((r) => Object.keys(flat(r.config))))];
  // A GPU column where any trial has GPU figures: mean (peak) utilisation, mean memory.
  const gpu = st.rows.some((r) => r.metrics && GPU_UTIL_MEAN in r.metrics);
  // Each column's key is its kind and name ("c:" nestor's own, "p:" a config
  // parameter's), so a parameter named "GPU" or "status" sorts as itself.
  const col = (key, label, get) => ({ key, label, get });
  const cols = [
    col("c:id", "id", (r) => r.id),
    col("c:status", "status", (r) => r.status),
    col("c:iteration", "iteration", (r) => r.iteration),
    col("c:metric", st.metric, (r) => sc.get(r.id)),
    ...(gpu ? [col("c:gpu", "GPU", (r) => r.metrics && r.metrics[GPU_UTIL_MEAN])] : []),
    col("c:restarts", "restarts", (r) => r.restarts),
    ...params.map((p) => col("p:" + p, p, (r) => flat(r.config)[p])),
  ];
  fill($("trials").tHead, h("tr", {}, cols.map((c) => h("th", { "data-key": c.key }, c.label + (st.sort.key === c.key ? (st.sort.dir > 0 ? " ▲" : " ▼") : "")))));
  for (const th of $("trials").tHead.querySelectorAll("th")) {
    th.onclick = () => { st.sort = { key: th.dataset.key, dir: st.sort.key === th.dataset.key ? -st.sort.dir : 1 }; renderTable(); };
  }
  const sortBy = cols.find((c) => c.key === st.sort.key) || cols[0];
  const value = (r) => sortBy.get(r);
  const rows = visibleRows().sort((a, b) => {
    const x = value(a), y = value(b);
    if (x === y) return 0;
    if (x === undefined || x === null) return 1;
    if (y === undefined || y === null) return -1;
    return (x < y ? -1 : 1) * st.sort.dir;
  });
  $("shown").textContent = `${rows.length} of ${st.rows.length} shown`;
  fill($("trials").tBodies[0], rows.map((r) => {
    const cf = flat(r.config);
    const cls = [best && r.id === best[0] ? "best" : "", st.selected === r.id ? "selected" : ""].join(" ");
    const cells = [r.id, h("span", { class: "s-" + r.status }, r.status), r.iteration, fmt(sc.get(r.id)),
      ...(gpu ? [h("span", { class: "gpu", title: gpuText(r.metrics, true) }, gpuText(r.metrics, false))] : []),
      r.restarts, ...params.map((p) => fmt(cf[p]))];
    return h("tr", { class: cls, "data-id": r.id }, cells.map((c) => h("td", {}, c)));
  }));
  for (const tr of $("trials").tBodies[0].rows) tr.onclick = () => showTrial(tr.dataset.id);
}

async function renderImportance() {
  if (!st.metric) return;
  const imp = await api(`experiments/${st.exp}/importance?metric=${encodeURIComponent(st.metric)}`);
  if (!imp.importance.length) return fill($("importance"), h("span", { class: "muted" }, "Too few trials with results yet."));
  fill($("importance"), imp.importance.map((p) => {
    const bar = h("div", { class: "bar" });
    bar.style.width = (100 * p.importance).toFixed(1) + "%";
    return h("div", { class: "imp" }, h("span", { title: p.param }, p.param), bar, h("span", {}, (100 * p.importance).toFixed(0) + "%"));
  }), h("p", { class: "muted" }, `Share of the ${st.metric} spread over ${imp.trials} trials explained by each parameter (eta squared).`));
}

async function showTrial(id) {
  st.selected = id;
  renderTable();
  const d = await api(`experiments/${st.exp}/trials/${encodeURIComponent(id)}`);
  const t = d.trial;
  const item = (term, value, cls) => [h("dt", {}, term), h("dd", { class: cls }, value)];
  const parts = [
    h("dl", {},
      item("trial", t.id), item("status", t.status, "s-" + t.status),
      item("iteration", `${t.iteration} (${d.points} results)`), item("restarts", `${t.restarts} (${t.failures} failures)`),
      item("exploits", t.exploits), item("nodes", t.nodes.join(", ") || "-"),
      gpuText(t.metrics, true) ? item("GPU", gpuText(t.metrics, true)) : [],
      item("checkpoints", t.checkpoints.map((c) => c.split("/").pop()).join(", ") || "-")),
    h("h2", { class: "gap" }, "Config"), h("pre", {}, JSON.stringify(t.config, null, 2)),
  ];
  if (t.error) parts.push(h("h2", {}, "Error"), h("pre", {}, t.error));
  for (const e of d.exploits) parts.push(h("p", {}, `${e.trial_id} took ${e.donor}'s checkpoint at iteration ${e.iteration}`));
  for (const [name, text] of Object.entries(d.logs)) parts.push(h("h2", {}, name), h("pre", {}, text));
  fill($("detail"), parts);
  $("detail").classList.remove("muted");
}

function renderAll() {
  renderHeader();
  renderStates();
  renderTable();
  renderCurves();
  renderParcoords();
}

async function fetchCurves() {
  const c = await api(`experiments/${st.exp}/curves?metric=${encodeURIComponent(st.metric || "")}&after=${st.after}`);
  if (c.epoch !== st.epoch) return false;
  for (const [id, [iter, time, val]] of Object.entries(c.trials)) {
    const cur = st.curves.get(id) || { iter: [], time: [], val: [] };
    cur.iter.push(...iter); cur.time.push(...time); cur.val.push(...val);
    st.curves.set(id, cur);
  }
  st.after = c.next;
  return true;
}

async function loadExperiment(reset) {
  const info = await api(`experiments/${st.exp}`);
  if (reset || info.epoch !== st.epoch) {
    st.curves = new Map(); st.after = 0; st.epoch = info.epoch;
    if (!st.metric || !info.metrics.includes(st.metric)) st.metric = info.metric && info.metrics.includes(info.metric) ? info.metric : info.metrics[0] || null;
    fill($("metric"), info.metrics.map((m) => h("option", { selected: m === st.metric }, m)));
  }
  st.info = info; st.rows = info.trials_table; st.version = info.version;
  if (!(await fetchCurves())) return loadExperiment(true);
  renderAll();
  renderImportance();
  if (!st.painted) {
    st.painted = true;
    $("paint").dataset.ms = String(Math.round(performance.now()));
    document.body.dataset.ready = "1";
  } else {
    st.updates += 1;
    $("paint").dataset.updates = String(st.updates);
  }
}

async function loadList() {
  const list = await api("experiments");
  const sel = $("experiment");
  if (sel.options.length !== list.length) {
    fill(sel, list.map((e) => h("option", { value: e.index }, e.name)));
    sel.value = String(st.exp);
  }
  $("all").hidden = list.length < 2;
  if (list.length > 1) {
    fill($("experiments").tBodies[0], list.map((e) => {
      const c = e.counts || {};
      const b = e.status && e.status.best ? fmt(e.status.best.value) : "";
      const cells = [e.name, e.waiting ? "starting" : e.live ? "live" : "finished", e.trials, c.RUNNING, c.TERMINATED, c.ERROR, e.points, b];
      return h("tr", { "data-i": e.index }, cells.map((v) => h("td", {}, v ?? "")));
    }));
    for (const tr of $("experiments").tBodies[0].rows) tr.onclick = () => { sel.value = tr.dataset.i; sel.onchange(); };
  }
  return list;
}

async function poll() {
  try {
    const list = await loadList();
    const e = list[st.exp];
    if (e && !e.waiting && (e.version !== st.version || e.epoch !== st.epoch)) await loadExperiment(e.epoch !== st.epoch);
  } catch (err) {
    $("summary").textContent = String(err);
  }
  setTimeout(poll, 1000);
}

$("experiment").onchange = () => { st.exp = +$("experiment").value; st.metric = null; st.epoch = -1; st.version = -1; st.selected = null; };
$("metric").onchange = () => { st.metric = $("metric").value; loadExperiment(true); };
for (const id of ["xaxis", "logy", "topk"]) $(id).onchange = renderCurves;
$("filter").oninput = () => { renderTable(); renderCurves(); renderParcoords(); };
window.onresize = () => { if (st.info) { renderCurves(); renderParcoords(); } };
poll();

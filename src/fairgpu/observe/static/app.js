// The fairgpu dashboard: plain DOM, inline SVG and canvas; every figure comes from the JSON API.
"use strict";

const state = { info: null, t: null, playing: false, resource: "gpu", timer: null };
const COLORS = ["#2f6fde", "#12b76a", "#f79009", "#9e77ed", "#ee46bc", "#06aed4", "#f04438", "#667085"];
const SVGNS = "http://www.w3.org/2000/svg";

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "style") el.style.cssText = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v);
  }
  for (const c of children.flat()) el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return el;
}

function s(tag, attrs) {
  const el = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, v);
  return el;
}

function fmt(x, digits = 1) {
  return x === null || x === undefined ? "—" : Number(x).toFixed(digits);
}

function fmtTime(t) {
  if (t === null || t === undefined) return "unknown";
  const hrs = Math.floor(t / 3600), min = Math.floor((t % 3600) / 60), sec = Math.floor(t % 60);
  return `t=${t.toFixed(0)}s (${hrs}h${String(min).padStart(2, "0")}m${String(sec).padStart(2, "0")}s)`;
}

async function api(path) {
  const sep = path.includes("?") ? "&" : "?";
  const url = state.t === null ? path : `${path}${sep}t=${state.t}`;
  const resp = await fetch(url);
  const doc = await resp.json();
  if (!resp.ok) throw new Error(doc.error || resp.statusText);
  return doc;
}

function colorOf(queue) {
  const i = state.info.queues.indexOf(queue);  // by place in the tree, so colours stay put between views
  return COLORS[(i < 0 ? 0 : i) % COLORS.length];
}

// ---- cluster view -----------------------------------------------------------------------------
function card(label, value, id) {
  return h("div", { class: "card" }, h("div", { class: "value", "data-testid": id }, value), h("div", { class: "label" }, label));
}

function heatmap(doc, key, title) {
  const hm = doc.heatmap, cols = Math.max(1, ...hm[key].map((r) => r.length));
  const perRow = Math.max(1, Math.min(hm.nodes.length, Math.floor(1200 / (cols * 4 + 3))));
  const cell = hm.nodes.length > 200 ? 4 : 12;
  const rows = Math.ceil(hm.nodes.length / perRow);
  const canvas = h("canvas", { width: perRow * (cols * cell + 3), height: rows * (cell + 3), "data-testid": `heatmap-${key}`,
    title: `${title}: one row of cells per node, one cell per GPU; click a node` });
  const ctx = canvas.getContext("2d");
  hm[key].forEach((slots, n) => {
    const x0 = (n % perRow) * (cols * cell + 3), y0 = Math.floor(n / perRow) * (cell + 3);
    slots.forEach((v, j) => {
      if (v < 0) return;
      const a = v / 100;  // light grey (nothing allocated, still visible as a GPU) to blue (all of it)
      ctx.fillStyle = `rgb(${Math.round(228 - 181 * a)},${Math.round(231 - 120 * a)},${Math.round(236 - 14 * a)})`;
      ctx.fillRect(x0 + j * cell, y0, cell - 1, cell);
    });
  });
  canvas.addEventListener("click", (ev) => {
    const rect = canvas.getBoundingClientRect();
    const x = (ev.clientX - rect.left) * (canvas.width / rect.width), y = (ev.clientY - rect.top) * (canvas.height / rect.height);
    const n = Math.floor(y / (cell + 3)) * perRow + Math.floor(x / (cols * cell + 3));
    if (n < hm.nodes.length) location.hash = `#/node/${encodeURIComponent(hm.nodes[n])}`;
  });
  return h("div", {}, h("h3", {}, title), canvas, h("div", { class: "legend" }, "grey: 0 % allocated · blue: 100 % · no cell: no GPU in that slot"));
}

async function clusterView(root) {
  const doc = await api("/api/cluster");
  const t = doc.totals;
  const models = Object.entries(doc.models).map(([m, x]) =>
    h("tr", { "data-model": m }, h("td", {}, m), h("td", {}, x.gpus), h("td", { "data-testid": `model-allocated-${m}` }, fmt(x.allocated, 2)),
      h("td", {}, fmt(x.free, 0)), h("td", {}, fmt(x.fragmented, 2)),
      h("td", {}, `${fmt(x.memory_allocated_mib / 1024, 0)} / ${fmt(x.memory_total_mib / 1024, 0)}`)));
  const nodes = h("select", { "aria-label": "node", onchange: (e) => { location.hash = `#/node/${encodeURIComponent(e.target.value)}`; } },
    h("option", {}, "open a node…"), doc.heatmap.nodes.map((n) => h("option", { value: n }, n)));
  root.replaceChildren(
    h("h2", {}, "Cluster"),
    h("div", { class: "cards" },
      card("nodes", t.nodes, "total-nodes"), card("GPUs", t.gpus, "total-gpus"),
      card("allocated GPUs", fmt(t.allocated_gpus, 2), "allocated-gpus"), card("free GPUs", fmt(t.free_gpus, 0), "free-gpus"),
      card("fragmented GPUs", fmt(t.fragmented_gpus, 2), "fragmented-gpus"),
      card("running workloads", t.running_workloads, "running-workloads"), card("pending workloads", t.pending_workloads, "pending-workloads")),
    h("h3", {}, "Per GPU model"),
    h("table", { "data-testid": "models" },
      h("tr", {}, ["model", "GPUs", "allocated", "free", "fragmented", "GPU memory GiB (allocated / total)"].map((c) => h("th", {}, c))),
      models),
    h("div", { class: "heat" }, heatmap(doc, "cores_pct", "GPU cores allocated"), heatmap(doc, "memory_pct", "GPU memory allocated")),
    h("p", {}, nodes));
}

// ---- node view --------------------------------------------------------------------------------
function bar(parts, total, testid) {
  return h("div", { class: "bar", "data-testid": testid },
    parts.map((p) => h("span", { style: `width:${(100 * p.value) / total}%;background:${colorOf(p.queue)}`, title: `${p.label}` })));
}

async function nodeView(root, name) {
  const doc = await api(`/api/nodes/${encodeURIComponent(name)}`);
  const gpus = doc.gpus.map((g) => {
    const queue = (p) => p.queue ?? "no workload";  // a pod a live scheduler pinned where it runs (not its own workload)
    const pods = g.pods.map((p) => ({ queue: p.queue, value: p.cores, label: `${p.pod} (${queue(p)}) ${p.cores}% cores` }));
    const mem = g.pods.map((p) => ({ queue: p.queue, value: p.memory_mib, label: `${p.pod} (${queue(p)}) ${p.memory_mib} MiB` }));
    return h("div", { class: "gpu", "data-testid": "gpu", "data-index": g.index, "data-cores": g.cores_allocated, "data-pods": g.pods.length },
      h("strong", {}, `GPU ${g.index}`), ` ${g.model} · ${g.uuid}${g.healthy ? "" : " · unhealthy"} · `,
      h("span", { "data-testid": "gpu-cores" }, `${g.cores_allocated}% cores`), ` · ${g.memory_allocated_mib} / ${g.memory_total_mib} MiB`,
      h("div", { class: "legend" }, "cores"), bar(pods, 100, "cores-bar"),
      h("div", { class: "legend" }, "memory"), bar(mem, Math.max(1, g.memory_total_mib), "memory-bar"),
      h("div", { class: "pods" }, g.pods.length ? g.pods.map((p) => `${p.pod} [${queue(p)}] ${p.cores}%, ${p.memory_mib} MiB`).join(" · ") : "no pods"));
  });
  root.replaceChildren(
    h("h2", { "data-testid": "node-name" }, `Node ${doc.node}`),
    h("p", {}, `CPU ${fmt(doc.cpu_m.allocated / 1000, 1)} / ${fmt(doc.cpu_m.total / 1000, 0)} cores · memory ${fmt(doc.memory_mib.allocated / 1024, 0)} / ${fmt(doc.memory_mib.total / 1024, 0)} GiB`
      + (doc.schedulable ? "" : " · cordoned")),
    h("p", { class: "legend" }, state.info.queues.map((q) => h("span", { style: `color:${colorOf(q)}` }, `■ ${q} `))),
    ...gpus,
    doc.cpu_only_pods.length ? h("p", { class: "pods" }, `CPU-only pods: ${doc.cpu_only_pods.map((p) => p.pod).join(", ")}`) : "");
}

// ---- queue view -------------------------------------------------------------------------------
function stepPath(times, values, x, y, now) {
  let d = "";
  values.forEach((v, i) => {
    const px = x(times[i]).toFixed(1), py = y(v).toFixed(1);
    d += i === 0 ? `M${px},${py}` : `H${px}V${py}`;
  });
  return d + (times.length ? `H${x(now).toFixed(1)}` : "");  // the last sample holds until now
}

function queueChart(doc, q, res) {
  const W = 420, H = 160, L = 48, B = 20, times = doc.times;
  const hist = q.history[res];
  const guar = q.guaranteed[res], lim = q.limit[res];
  const tmax = Math.max(1, state.info.horizon ?? times[times.length - 1] ?? 1);
  const vmax = Math.max(1e-9, ...hist.usage, ...hist.fair_share, guar ?? 0) * 1.1;
  const x = (t) => L + ((W - L - 8) * t) / tmax, y = (v) => H - B - ((H - B - 8) * v) / vmax;
  const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": `${q.name} ${res}` });
  svg.append(s("line", { x1: L, y1: H - B, x2: W - 8, y2: H - B, stroke: "#98a2b3" }), s("line", { x1: L, y1: 8, x2: L, y2: H - B, stroke: "#98a2b3" }));
  for (const [v, label] of [[0, "0"], [vmax / 1.1, fmt(vmax / 1.1, res === "gpu" ? 1 : 0)]]) {
    const tx = s("text", { x: L - 4, y: y(v) + 4, "text-anchor": "end", "font-size": 10, fill: "#667085" });
    tx.textContent = label;
    svg.append(tx);
  }
  const end = s("text", { x: W - 8, y: H - 4, "text-anchor": "end", "font-size": 10, fill: "#667085" });
  end.textContent = `${(tmax / 3600).toFixed(1)} h`;
  svg.append(end);
  if (guar) svg.append(s("line", { x1: L, x2: W - 8, y1: y(guar), y2: y(guar), stroke: "#12b76a", "stroke-dasharray": "2 3" }));
  svg.append(s("path", { d: stepPath(times, hist.fair_share, x, y, doc.time), fill: "none", stroke: "#f79009", "stroke-width": 1.5, "stroke-dasharray": "5 3" }));
  svg.append(s("path", { d: stepPath(times, hist.usage, x, y, doc.time), fill: "none", stroke: "#2f6fde", "stroke-width": 1.5 }));
  svg.append(s("line", { x1: x(doc.time), x2: x(doc.time), y1: 8, y2: H - B, stroke: "#f04438" }));
  return h("div", { class: "chart", "data-testid": "queue-chart", "data-queue": q.name },
    h("strong", {}, q.name), ` — ${res}: usage `, h("span", { "data-testid": "queue-usage" }, fmt(q.usage[res], 2)),
    ` · fair share `, h("span", { "data-testid": "queue-fair-share" }, fmt(q.fair_share[res], 2)),
    ` · guarantee ${fmt(guar, 2)}${lim === null ? "" : ` · limit ${fmt(lim, 2)}`} · pending ${q.pending_workloads}`,
    svg, h("div", { class: "legend" }, "blue: usage · orange dashed: fair share · green dotted: guarantee"));
}

function treeList(doc, names) {
  const byName = Object.fromEntries(doc.queues.map((q) => [q.name, q]));
  return h("ul", {}, names.map((n) => {
    const q = byName[n];
    return h("li", { "data-testid": "tree-queue" }, `${n} (w ${q.weight}) ${fmt(100 * q.usage_dominant, 0)}% / ${fmt(100 * q.fair_share_dominant, 0)}%`,
      q.children.length ? treeList(doc, q.children) : "");
  }));
}

async function queuesView(root) {
  const doc = await api("/api/queues");
  const picker = h("select", { "aria-label": "resource", onchange: (e) => { state.resource = e.target.value; render(); } },
    doc.resources.map((r) => h("option", r === state.resource ? { value: r, selected: "" } : { value: r }, r)));
  root.replaceChildren(h("h2", {}, "Queues"),
    h("div", { class: "queues" },
      h("div", { class: "tree" }, h("h3", {}, "Tree (usage / fair share, dominant)"), treeList(doc, doc.roots)),
      h("div", {}, h("p", {}, "Resource ", picker, " (gpu in GPUs, gpumem and memory in MiB, cpu in millicores)"),
        h("div", { class: "charts" }, doc.queues.map((q) => queueChart(doc, q, state.resource))))));
}

// ---- workload view ----------------------------------------------------------------------------
async function workloadsView(root, name) {
  const list = await api("/api/workloads");
  const picker = h("div", { class: "picker", "data-testid": "workload-list" },
    h("div", {}, h("strong", {}, `pending ${list.pending_total} · running ${list.running_total}`)),
    [...list.pending, ...list.running].map((w) =>
      h("a", { href: `#/workload/${encodeURIComponent(w.workload)}` }, `${w.workload} [${w.queue}] ${w.state}${w.placed ? ` ${w.placed}/${w.pods}` : ""}`)));
  const detail = h("div", { "data-testid": "workload-detail" });
  root.replaceChildren(h("h2", {}, "Workloads"), h("div", { class: "workloads" }, picker, detail));
  if (!name) {
    detail.append(h("p", {}, "Pick a workload to see why it waits, where it stands and when it should start."));
    return;
  }
  let e;
  try {
    e = await api(`/api/workloads/${encodeURIComponent(name)}`);
  } catch (err) {
    detail.append(h("p", {}, `${name}: not known to the scheduler at this time (finished, or not submitted yet).`));
    return;
  }
  detail.append(h("h3", { "data-testid": "workload-name" }, `${e.workload} (queue ${e.queue}): `, h("span", { "data-testid": "workload-state" }, e.state)),
    h("p", {}, `submitted ${fmtTime(e.submitted)}`));
  if (e.state === "running") {
    detail.append(h("p", {}, `started ${fmtTime(e.started)}`));
    return;
  }
  detail.append(h("ul", { class: "reasons", "data-testid": "reasons" }, e.reasons.map((r) => h("li", {}, r))),
    h("table", {},
      h("tr", {}, h("td", {}, "position in queue"), h("td", { "data-testid": "position-in-queue" }, `${e.position_in_queue} of ${e.queue_pending}`)),
      h("tr", {}, h("td", {}, "position in cluster"), h("td", { "data-testid": "position-in-cluster" }, `${e.position_in_cluster ?? ">10000"} of ${e.cluster_pending}`)),
      h("tr", {}, h("td", {}, "estimated start"), h("td", { "data-testid": "estimated-start" }, fmtTime(e.estimated_start)))));
}

// ---- routing and the clock --------------------------------------------------------------------
async function render() {
  const root = document.getElementById("view");
  const [, view, arg] = (location.hash || "#/cluster").split("/");
  document.querySelectorAll("nav a").forEach((a) => a.classList.toggle("active", a.dataset.view === (view === "node" ? "cluster" : view === "workload" ? "workloads" : view)));
  try {
    if (view === "node") await nodeView(root, decodeURIComponent(arg));
    else if (view === "queues") await queuesView(root);
    else if (view === "workloads" || view === "workload") await workloadsView(root, arg && decodeURIComponent(arg));
    else await clusterView(root);
    root.dataset.loadedAt = String(state.t);
  } catch (err) {
    root.replaceChildren(h("p", { class: "error" }, String(err.message || err)));
  }
  document.getElementById("time-label").textContent = fmtTime(state.t);
}

function setTime(t) {
  state.t = Math.min(state.info.horizon, Math.max(0, t));
  document.getElementById("time").value = String(state.t);
  history.replaceState(null, "", `${location.pathname}?t=${state.t}${location.hash}`);
}

async function tick() {
  if (!state.playing) return;
  setTime(state.t + state.info.horizon / 200);
  await render();
  if (state.t >= state.info.horizon) togglePlay();
  else state.timer = setTimeout(tick, 500);
}

function togglePlay() {
  state.playing = !state.playing;
  document.getElementById("play").textContent = state.playing ? "⏸" : "▶";
  clearTimeout(state.timer);
  if (state.playing) tick();
}

async function main() {
  const info = await (await fetch("/api/info")).json();
  state.info = info;
  document.getElementById("source").textContent = `${info.name} · profile ${info.profile}`;
  if (info.horizon !== null) {
    const slider = document.getElementById("time");
    slider.max = String(info.horizon);
    document.getElementById("clock").hidden = false;
    const asked = Number(new URLSearchParams(location.search).get("t"));
    setTime(Number.isFinite(asked) && asked > 0 ? asked : info.time);
    slider.addEventListener("change", () => { setTime(Number(slider.value)); render(); });
    document.getElementById("play").addEventListener("click", togglePlay);
  }
  window.addEventListener("hashchange", render);
  await render();
}

main();

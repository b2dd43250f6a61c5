// The fairgpu dashboard: plain DOM, Vega-Lite charts (vendored) and a canvas heat map; every figure comes
// from the JSON API.
"use strict";

const state = { info: null, t: null, playing: false, resource: "gpu", timer: null,
  wl: { queue: "", search: "", offset: 0 } };
const PAGE = 50;  // workloads per page of the picker
const COLORS = ["#2f6fde", "#12b76a", "#f79009", "#9e77ed", "#ee46bc", "#06aed4", "#f04438", "#667085"];

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

function fmt(x, digits = 1) {
  return x === null || x === undefined ? "—" : Number(x).toFixed(digits);
}

function fmtTime(t) {
  if (t === null || t === undefined) return "unknown";
  const hrs = Math.floor(t / 3600), min = Math.floor((t % 3600) / 60), sec = Math.floor(t % 60);
  return `t=${t.toFixed(0)}s (${hrs}h${String(min).padStart(2, "0")}m${String(sec).padStart(2, "0")}s)`;
}

function embed(el, spec) {  // a Vega-Lite chart; resolves when it is drawn (SVG, so tests can read it)
  return vegaEmbed(el, spec, { actions: false, renderer: "svg" }).then(() => { el.dataset.rendered = "true"; });
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

function heatmap(doc, key, title, width) {
  // Fits the width it is given: one row per node with its name while they fit on screen, else as many
  // nodes per row as fit; hovering names the node, the GPU and what is allocated on it.
  const hm = doc.heatmap, n = hm.nodes.length, cols = Math.max(1, ...hm[key].map((r) => r.length));
  const labelled = n <= 48;
  const label = labelled ? Math.min(160, 8 + 7 * Math.max(...hm.nodes.map((x) => x.length))) : 0;
  const gap = labelled ? 0 : 3;
  // the largest cell (14 px down to 3) with which every node fits the width and about 480 px of height
  const fit = (c) => Math.max(1, Math.min(n, Math.floor((width - label) / (cols * c + gap))));
  let cell = labelled ? Math.max(3, Math.min(14, Math.floor((width - label) / cols))) : 3;
  for (let c = 14; !labelled && c > 3; c--) {
    if (Math.ceil(n / fit(c)) * (c + 2) <= 480) { cell = c; break; }
  }
  const blockW = cols * cell + gap;
  const perRow = labelled ? 1 : fit(cell);
  const rows = Math.ceil(n / perRow);
  const canvas = h("canvas", { width: label + perRow * blockW, height: rows * (cell + 2), "data-testid": `heatmap-${key}`,
    "data-nodes-per-row": perRow, "data-cell": cell, role: "img", "aria-label": `${title}, one cell per GPU` });
  const ctx = canvas.getContext("2d");
  ctx.font = "11px system-ui, sans-serif";
  ctx.textBaseline = "middle";
  hm[key].forEach((slots, i) => {
    const x0 = label + (i % perRow) * blockW, y0 = Math.floor(i / perRow) * (cell + 2);
    if (labelled) { ctx.fillStyle = "#475467"; ctx.fillText(hm.nodes[i], 2, y0 + cell / 2, label - 6); }
    slots.forEach((v, j) => {
      if (v < 0) return;
      const a = v / 100;  // light grey (nothing allocated, still visible as a GPU) to blue (all of it)
      ctx.fillStyle = `rgb(${Math.round(228 - 181 * a)},${Math.round(231 - 120 * a)},${Math.round(236 - 14 * a)})`;
      ctx.fillRect(x0 + j * cell, y0, cell - 1, cell);
    });
  });
  const tip = h("div", { class: "tip", "data-testid": `heatmap-tip-${key}`, hidden: "" });
  const at = (ev) => {
    const rect = canvas.getBoundingClientRect();
    const x = (ev.clientX - rect.left) * (canvas.width / rect.width) - label, y = (ev.clientY - rect.top) * (canvas.height / rect.height);
    if (x < 0 && !labelled) return null;
    const i = Math.floor(y / (cell + 2)) * perRow + (labelled ? 0 : Math.floor(x / blockW));
    const gpu = labelled ? Math.floor(x / cell) : Math.floor((x % blockW) / cell);
    return i < n ? { node: hm.nodes[i], gpu: gpu >= 0 && gpu < hm[key][i].length ? gpu : null, i } : null;
  };
  canvas.addEventListener("mousemove", (ev) => {
    const hit = at(ev);
    if (!hit) { tip.hidden = true; return; }
    const v = hit.gpu === null ? null : hm[key][hit.i][hit.gpu];
    tip.textContent = hit.gpu === null || v < 0 ? hit.node : `${hit.node} · GPU ${hit.gpu}: ${v}% ${key === "cores_pct" ? "cores" : "memory"} allocated`;
    tip.style.left = `${ev.offsetX + 12}px`;
    tip.style.top = `${ev.offsetY + 12}px`;
    tip.hidden = false;
  });
  canvas.addEventListener("mouseleave", () => { tip.hidden = true; });
  canvas.addEventListener("click", (ev) => {
    const hit = at(ev);
    if (hit) location.hash = `#/node/${encodeURIComponent(hit.node)}`;
  });
  return h("div", { class: "heatmap" }, h("h3", {}, title), h("div", { class: "heatwrap" }, canvas, tip),
    h("div", { class: "legend" }, "grey: 0 % allocated · blue: 100 % · no cell: no GPU in that slot · hover for the node, click to open it"));
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
    h("div", { class: "heat" }, ...[["cores_pct", "GPU cores allocated"], ["memory_pct", "GPU memory allocated"]].map(([k, title]) =>
      heatmap(doc, k, title, Math.max(240, Math.floor((root.clientWidth - 24) / 2) - 4)))),
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
function queueChart(doc, q, res) {
  const hist = q.history[res];
  const guar = q.guaranteed[res], lim = q.limit[res];
  const tmax = Math.max(1, state.info.horizon ?? doc.time ?? 1);
  const hours = (t) => t / 3600;
  const values = [];
  doc.times.forEach((t, i) => {
    values.push({ hours: hours(t), value: hist.usage[i], series: "usage" }, { hours: hours(t), value: hist.fair_share[i], series: "fair share" });
  });
  if (doc.times.length) {  // the last sample holds until now
    const last = doc.times.length - 1;
    values.push({ hours: hours(doc.time), value: hist.usage[last], series: "usage" }, { hours: hours(doc.time), value: hist.fair_share[last], series: "fair share" });
  }
  const rules = [];
  if (guar) rules.push({ value: guar, series: "guarantee" });
  if (lim !== null) rules.push({ value: lim, series: "limit" });
  const color = { field: "series", type: "nominal", title: null,
    scale: { domain: ["usage", "fair share", "guarantee", "limit"], range: ["#2f6fde", "#f79009", "#12b76a", "#f04438"] } };
  const spec = {
    width: "container", height: 140, autosize: { type: "fit-x", contains: "padding" },
    layer: [
      { data: { values }, mark: { type: "line", interpolate: "step-after" },
        encoding: { x: { field: "hours", type: "quantitative", title: "hours", scale: { domain: [0, hours(tmax)] } },
          y: { field: "value", type: "quantitative", title: res },
          color, strokeDash: { field: "series", type: "nominal", legend: null, scale: { domain: ["usage", "fair share"], range: [[1, 0], [5, 3]] } },
          tooltip: [{ field: "series" }, { field: "hours", format: ".2f" }, { field: "value", format: ".2f" }] } },
      { data: { values: rules }, mark: { type: "rule", strokeDash: [2, 3] },
        encoding: { y: { field: "value", type: "quantitative" }, color, tooltip: [{ field: "series" }, { field: "value" }] } },
      { data: { values: [{ hours: hours(doc.time) }] }, mark: { type: "rule", color: "#98a2b3" }, encoding: { x: { field: "hours", type: "quantitative" } } },
    ],
  };
  const plot = h("div", { class: "plot", "data-testid": "queue-plot" });
  const box = h("div", { class: "chart", "data-testid": "queue-chart", "data-queue": q.name },
    h("strong", {}, q.name), ` — ${res}: usage `, h("span", { "data-testid": "queue-usage" }, fmt(q.usage[res], 2)),
    ` · fair share `, h("span", { "data-testid": "queue-fair-share" }, fmt(q.fair_share[res], 2)),
    ` · guarantee ${fmt(guar, 2)}${lim === null ? "" : ` · limit ${fmt(lim, 2)}`} · pending ${q.pending_workloads}`, plot);
  return { box, draw: () => embed(plot, spec) };
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
  const made = doc.queues.map((q) => queueChart(doc, q, state.resource));
  const charts = h("div", { class: "charts" }, made.map((c) => c.box));
  const picker = h("select", { "aria-label": "resource", onchange: (e) => { state.resource = e.target.value; render(); } },
    doc.resources.map((r) => h("option", r === state.resource ? { value: r, selected: "" } : { value: r }, r)));
  root.replaceChildren(h("h2", {}, "Queues"),
    h("div", { class: "queues" },
      h("div", { class: "tree" }, h("h3", {}, "Tree (usage / fair share, dominant)"), treeList(doc, doc.roots)),
      h("div", {}, h("p", {}, "Resource ", picker, " (gpu in GPUs, gpumem and memory in MiB, cpu in millicores)"),
        charts)));
  await Promise.all(made.map((c) => c.draw()));  // drawn once in the page, so "container" has a width
}

// ---- workload view ----------------------------------------------------------------------------
async function workloadsView(root, name) {
  const wl = state.wl;
  const query = new URLSearchParams({ offset: wl.offset, limit: PAGE, search: wl.search });
  if (wl.queue) query.set("queue", wl.queue);
  const list = await api(`/api/workloads?${query}`);
  const most = Math.max(list.pending_total, list.running_total);
  const go = (change) => { Object.assign(state.wl, change); render(); };
  const search = h("input", { type: "search", placeholder: "search names", value: wl.search, "aria-label": "search workloads",
    "data-testid": "workload-search", onchange: (e) => go({ search: e.target.value, offset: 0 }) });
  const queue = h("select", { "aria-label": "queue", "data-testid": "workload-queue", onchange: (e) => go({ queue: e.target.value, offset: 0 }) },
    h("option", { value: "" }, "all queues"),
    state.info.queues.map((q) => h("option", q === wl.queue ? { value: q, selected: "" } : { value: q }, q)));
  const pager = h("div", { class: "pager" },
    h("button", { type: "button", "data-testid": "page-prev", ...(wl.offset === 0 ? { disabled: "" } : {}), onclick: () => go({ offset: Math.max(0, wl.offset - PAGE) }) }, "‹ prev"),
    h("span", { "data-testid": "page-label" }, most ? ` ${wl.offset + 1}–${Math.min(most, wl.offset + PAGE)} of ${most} ` : " none "),
    h("button", { type: "button", "data-testid": "page-next", ...(wl.offset + PAGE >= most ? { disabled: "" } : {}), onclick: () => go({ offset: wl.offset + PAGE }) }, "next ›"));
  const picker = h("div", { class: "picker", "data-testid": "workload-list" },
    h("div", { class: "filters" }, search, queue),
    h("div", {}, h("strong", { "data-testid": "workload-totals" }, `pending ${list.pending_total} · running ${list.running_total}`),
      wl.queue || wl.search ? " matching" : ""),
    pager,
    [...list.pending, ...list.running].map((w) =>
      h("a", { href: `#/workload/${encodeURIComponent(w.workload)}`, "data-testid": "workload-item" }, `${w.workload} [${w.queue}] ${w.state}${w.placed ? ` ${w.placed}/${w.pods}` : ""}`)));
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
  const loading = document.getElementById("loading");
  const shown = setTimeout(() => { loading.hidden = false; }, 150);  // only when the answer is slow
  root.setAttribute("aria-busy", "true");
  try {
    if (view === "node") await nodeView(root, decodeURIComponent(arg));
    else if (view === "queues") await queuesView(root);
    else if (view === "workloads" || view === "workload") await workloadsView(root, arg && decodeURIComponent(arg));
    else await clusterView(root);
    root.dataset.loadedAt = String(state.t);
  } catch (err) {
    root.replaceChildren(h("p", { class: "error" }, String(err.message || err)));
  }
  clearTimeout(shown);
  loading.hidden = true;
  root.removeAttribute("aria-busy");
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

// The swarm dashboard: polls /api/node/<i> every 2 s and draws with plain SVG.
// Everything that came from peers or models is inserted as text, never as markup.
"use strict";

const POLL_MS = 2000;
const COLORS = ["#2b6cb0", "#d69e2e", "#38a169", "#c53030", "#805ad5", "#dd6b20", "#319795", "#b83280", "#4a5568", "#718096"];
const SVG = "http://www.w3.org/2000/svg";
let current = 0;

function el(tag, attrs, text) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

function svgEl(tag, attrs) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  return node;
}

function short(peer) { return peer.length > 14 ? peer.slice(0, 6) + "…" + peer.slice(-6) : peer; }
function fmt(x, digits = 3) { return x === null || x === undefined ? "-" : Number(x).toFixed(digits); }

// series: [{name, xs, ys, color, dots}]
function lineChart(svg, series, opts = {}) {
  svg.replaceChildren();
  const box = svg.getBoundingClientRect();
  const W = Math.max(box.width, 200), H = Math.max(box.height, 80), L = 38, R = 8, T = 8, B = 18;
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  const xs = series.flatMap(s => s.xs), ys = series.flatMap(s => s.ys);
  if (!xs.length) { const t = svgEl("text", {x: L, y: H / 2}); t.textContent = "no data yet"; svg.append(t); return; }
  const x0 = Math.min(...xs), x1 = Math.max(...xs, x0 + 1);
  const y0 = opts.y0 !== undefined ? opts.y0 : Math.min(...ys), y1 = Math.max(opts.y1 !== undefined ? opts.y1 : -Infinity, ...ys, y0 + 1e-9);
  const px = x => L + (x - x0) / (x1 - x0) * (W - L - R), py = y => H - B - (y - y0) / (y1 - y0) * (H - T - B);
  for (const y of [y0, (y0 + y1) / 2, y1]) {
    svg.append(svgEl("line", {x1: L, x2: W - R, y1: py(y), y2: py(y), stroke: "#e2e6ee"}));
    const t = svgEl("text", {x: 2, y: py(y) + 3}); t.textContent = fmt(y, y1 - y0 < 10 ? 2 : 0); svg.append(t);
  }
  for (const x of [x0, x1]) {
    const t = svgEl("text", {x: px(x), y: H - 4, "text-anchor": x === x1 ? "end" : "start"}); t.textContent = "round " + x; svg.append(t);
  }
  for (const s of series) {
    if (s.dots) {
      s.xs.forEach((x, i) => svg.append(svgEl("circle", {cx: px(x), cy: py(s.ys[i]), r: 3, fill: s.color})));
    } else if (s.xs.length) {
      const d = s.xs.map((x, i) => `${i ? "L" : "M"}${px(x).toFixed(1)},${py(s.ys[i]).toFixed(1)}`).join("");
      svg.append(svgEl("path", {d, fill: "none", stroke: s.color, "stroke-width": s.width || 1.5, "stroke-opacity": s.opacity || 1}));
    }
  }
}

function legend(div, series) {
  div.replaceChildren(...series.map(s => {
    const span = el("span"); const i = el("i"); i.style.background = s.color; span.append(i, document.createTextNode(s.name)); return span;
  }));
}

function bars(div, entries, unit) {
  const max = Math.max(...entries.map(e => e[1]), 1e-9);
  div.replaceChildren(...entries.map(([name, value]) => {
    const row = el("div", {class: "row"});
    const bar = el("div", {class: "bar"}); bar.style.width = (100 * value / max).toFixed(1) + "%";
    const wrap = el("div"); wrap.append(bar);
    row.append(el("span", {class: "name", title: name}, name), wrap, el("span", {}, unit(value)));
    return row;
  }));
  if (!entries.length) div.replaceChildren(el("span", {class: "muted"}, "none yet"));
}

function drawHeadline(view) {
  const section = document.getElementById("headline");
  section.replaceChildren(...view.headline.map(h => {
    const card = el("div", {class: "card", "data-key": h.key});
    card.append(el("div", {class: "label"}, h.label), el("div", {class: "value"}, h.value));
    return card;
  }));
}

function drawCharts(view) {
  const series = [{name: "own reward", xs: view.reward.round, ys: view.reward.value, color: COLORS[0], width: 2}];
  if (view.eval.length) series.push({name: "held-out accuracy", xs: view.eval.map(p => p[0]), ys: view.eval.map(p => p[1]), color: COLORS[3], dots: true});
  Object.entries(view.peer_reward).slice(0, 6).forEach(([peer, s], i) =>
    series.push({name: "peer " + short(peer), xs: s.round, ys: s.value, color: COLORS[4 + i], opacity: 0.6}));
  lineChart(document.getElementById("chart-reward"), series, {y0: 0, y1: 1});
  legend(document.getElementById("legend-reward"), series);

  const reasons = Object.entries(view.refusals.by_reason);
  const refusalSeries = reasons.map(([reason, counts], i) => ({name: reason, xs: view.refusals.round, ys: counts, color: COLORS[i % COLORS.length]}));
  lineChart(document.getElementById("chart-refusals"), refusalSeries, {y0: 0});
  legend(document.getElementById("legend-refusals"), refusalSeries);

  bars(document.getElementById("time-split"), Object.entries(view.time_split), v => v.toFixed(3) + " s");
  lineChart(document.getElementById("chart-seconds"), [{name: "round seconds", xs: view.round_seconds.round, ys: view.round_seconds.value, color: COLORS[2]}], {y0: 0});
  bars(document.getElementById("used-by-peer"), Object.entries(view.used_by_peer).slice(0, 20), v => String(v));
}

function claims(c) {
  const rounds = c.rounds === undefined ? "-" : String(Math.round(c.rounds));
  return `${rounds} · ${fmt(c.reward)} · ${fmt(c.eval)}`;
}

function drawPeers(view) {
  const body = document.querySelector("#peers tbody");
  const table = view.peers;
  document.getElementById("peers-note").textContent = table ? `(as of round ${table.round}; model, family, version and claims are the peers' own word)` : "(no peers.json yet)";
  body.replaceChildren(...(table ? table.peers : []).map(p => {
    const tr = el("tr", {class: p.ignored ? "ignored" : ""});
    tr.append(
      el("td", {class: "mono", title: p.peer}, short(p.peer)), el("td", {}, p.model_id), el("td", {class: "mono"}, p.model_family.slice(0, 12)),
      el("td", {}, String(p.policy_version)), el("td", {}, p.link), el("td", {}, fmt(p.score, 2) + (p.ignored ? " (ignored)" : "")),
      el("td", {}, fmt(p.reward)), el("td", {}, String(p.verified_groups)), el("td", {}, claims(p.claimed || {})),
      el("td", {}, p.last_seen_s.toFixed(1) + " s ago"));
    return tr;
  }));
}

function drawSamples(view) {
  const div = document.getElementById("samples");
  div.replaceChildren(...view.samples.map(group => {
    const box = el("div", {class: "sample"});
    box.append(el("div", {class: "muted"}, `round ${group.round} · ${group.task}`), el("pre", {}, group.prompt));
    for (const c of group.completions) {
      const line = el("div");
      line.append(el("span", {class: "reward"}, fmt(c.reward)), document.createTextNode(c.text + (c.finished === false ? " [cut]" : "")));
      box.append(line);
    }
    return box;
  }));
}

async function refresh() {
  try {
    const response = await fetch(`/api/node/${current}`);
    const view = await response.json();
    document.getElementById("empty").hidden = view.rounds > 0;
    document.getElementById("updated").textContent = `${view.name} · ${view.data_dir} · round ${view.rounds} · updated ${new Date().toLocaleTimeString()}`;
    if (view.rounds > 0) { drawHeadline(view); drawCharts(view); drawPeers(view); drawSamples(view); }
    document.body.dataset.round = String(view.rounds);
  } catch (error) {
    document.getElementById("updated").textContent = "cannot reach the dashboard server: " + error;
  }
}

async function start() {
  const nodes = await (await fetch("/api/nodes")).json();
  const nav = document.getElementById("nodes");
  const select = index => { current = index; [...nav.children].forEach((b, i) => b.classList.toggle("active", i === index)); refresh(); };
  nav.replaceChildren(...nodes.map(n => { const b = el("button", {}, n.name); b.onclick = () => select(n.index); return b; }));
  select(Number(new URLSearchParams(location.search).get("node") || 0));
  setInterval(refresh, POLL_MS);
}

start();

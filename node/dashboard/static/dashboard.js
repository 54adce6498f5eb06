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
// A peer as the page names it: its name where this dashboard knows it (a node it follows), with its short id.
function label(view, peer) { const name = (view.peer_names || {})[peer]; return name ? `${name} (${short(peer)})` : short(peer); }
function fmt(x, digits = 3) { return x === null || x === undefined ? "-" : Number(x).toFixed(digits); }
function duration(s) {
  if (s === null || s === undefined) return "-";
  if (s < 60) return `${s.toFixed(0)} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${Math.floor(s % 60)} s`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.floor(s % 3600 / 60)} min`;
  return `${Math.floor(s / 86400)} d ${Math.floor(s % 86400 / 3600)} h`;
}

// series: [{name, xs, ys, color, dots, breaks}]; breaks: indices where the line starts anew
// (the node was not running before that point). opts: y0, y1, unit (the y axis'), restarts
// (rounds where the node started again: dashed vertical lines).
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
    const t = svgEl("text", {x: 2, y: py(y) + 3}); t.textContent = fmt(y, y1 - y0 < 10 ? 2 : 0) + (opts.unit ? " " + opts.unit : ""); svg.append(t);
  }
  for (const r of opts.restarts || []) {
    if (r < x0 || r > x1) continue;
    svg.append(svgEl("line", {x1: px(r), x2: px(r), y1: T, y2: H - B, stroke: "#a0a7b4", "stroke-dasharray": "3,3", class: "restart"}));
  }
  for (const x of [x0, x1]) {
    const t = svgEl("text", {x: px(x), y: H - 4, "text-anchor": x === x1 ? "end" : "start"}); t.textContent = "round " + x; svg.append(t);
  }
  for (const s of series) {
    if (s.dots) {
      s.xs.forEach((x, i) => svg.append(svgEl("circle", {cx: px(x), cy: py(s.ys[i]), r: 3, fill: s.color})));
    } else if (s.xs.length) {
      const breaks = new Set(s.breaks || []);
      const d = s.xs.map((x, i) => `${i && !breaks.has(i) ? "L" : "M"}${px(x).toFixed(1)},${py(s.ys[i]).toFixed(1)}`).join("");
      svg.append(svgEl("path", {d, fill: "none", stroke: s.color, "stroke-width": s.width || 1.5, "stroke-opacity": s.opacity || 1}));
    }
  }
}

function legend(div, series, restarts) {
  const items = series.map(s => {
    const span = el("span"); const i = el("i"); i.style.background = s.color; span.append(i, document.createTextNode(s.name)); return span;
  });
  if (restarts && restarts.length) items.push(el("span", {class: "restart-key"}, "┆ node started again (line broken: not running before)"));
  div.replaceChildren(...items);
}

// The round's parts as one stacked bar (they add up to the mean round), then the work beside it.
function timeSplit(div, split) {
  const total = Math.max(split.total, 1e-9);
  const parts = Object.entries(split.parts);
  const bar = el("div", {class: "stack"});
  const key = el("div", {class: "legend"});
  parts.forEach(([name, value], i) => {
    const seg = el("div", {title: `${name}: ${value.toFixed(3)} s`}); seg.style.width = (100 * value / total).toFixed(2) + "%"; seg.style.background = COLORS[i % COLORS.length];
    bar.append(seg);
    const span = el("span"); const sw = el("i"); sw.style.background = COLORS[i % COLORS.length];
    span.append(sw, document.createTextNode(`${name} ${value.toFixed(3)} s (${(100 * value / total).toFixed(0)}%)`)); key.append(span);
  });
  const head = el("div", {}, `mean round ${split.total.toFixed(3)} s over the last ${split.rounds} rounds; its parts:`);
  const beside = Object.entries(split.overlapping);
  const note = el("div", {class: "muted"}, beside.length
    ? "run ahead of the round or beside it (prefetch, sampler.overlap), not part of it: " + beside.map(([n, v]) => `${n} ${v.toFixed(3)} s`).join(", ")
    : "");
  div.replaceChildren(head, bar, key, note);
}

// entries: [name, value, title?]
function bars(div, entries, unit) {
  const max = Math.max(...entries.map(e => e[1]), 1e-9);
  div.replaceChildren(...entries.map(([name, value, title]) => {
    const row = el("div", {class: "row"});
    const bar = el("div", {class: "bar"}); bar.style.width = (100 * value / max).toFixed(1) + "%";
    const wrap = el("div"); wrap.append(bar);
    row.append(el("span", {class: "name", title: title || name}, name), wrap, el("span", {}, unit(value)));
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
  const restarts = view.self.restarts.map(r => r.round);
  const series = [{name: "own reward", xs: view.reward.round, ys: view.reward.value, breaks: view.reward.breaks, color: COLORS[0], width: 2}];
  if (view.eval.length) series.push({name: "held-out accuracy", xs: view.eval.map(p => p[0]), ys: view.eval.map(p => p[1]), color: COLORS[3], dots: true});
  Object.entries(view.peer_reward).slice(0, 6).forEach(([peer, s], i) =>
    series.push({name: "peer " + label(view, peer), xs: s.round, ys: s.value, breaks: s.breaks, color: COLORS[4 + i], opacity: 0.6}));
  lineChart(document.getElementById("chart-reward"), series, {y0: 0, y1: 1, restarts});
  legend(document.getElementById("legend-reward"), series, restarts);

  const reasons = Object.entries(view.refusals.by_reason);
  const refusalSeries = reasons.map(([reason, counts], i) => ({name: reason, xs: view.refusals.round, ys: counts, breaks: view.refusals.breaks, color: COLORS[i % COLORS.length]}));
  lineChart(document.getElementById("chart-refusals"), refusalSeries, {y0: 0, restarts});
  legend(document.getElementById("legend-refusals"), refusalSeries, restarts);

  timeSplit(document.getElementById("time-split"), view.time_split);
  const seconds = [{name: "round time, seconds (mean per bin of rounds)", xs: view.round_seconds.round, ys: view.round_seconds.value, breaks: view.round_seconds.breaks, color: COLORS[2]}];
  lineChart(document.getElementById("chart-seconds"), seconds, {y0: 0, unit: "s", restarts});
  legend(document.getElementById("legend-seconds"), seconds, restarts);
  const used = Object.entries(view.used_by_peer).slice(0, 20).map(([peer, n]) => [label(view, peer), n, peer]);
  bars(document.getElementById("used-by-peer"), used, v => String(v));
}

// Who the node is: peer id, listen addresses, how long it has run since it last started.
function drawSelf(view) {
  const me = view.self, up = me.uptime, parts = [];
  parts.push(el("span", {class: "mono", title: me.peer_id || ""}, me.peer_id ? "peer id " + me.peer_id : "peer id unknown (no node-info.json or node.key in the data dir)"));
  parts.push(el("span", {}, me.listen.length ? "listening on " + me.listen.join(", ") : "listen addresses not recorded"));
  if (up) {
    // Not running, by the look of it: no round for a minute, or three mean rounds if longer.
    const ago = view.seen_ago_s, slow = Math.max(60, 3 * ((view.time_split || {}).total || 0));
    const stale = ago === null || ago === undefined || ago > slow;
    const since = `since round ${up.since_round}` + (me.restarts.length ? ` (${me.restarts.length} restart${me.restarts.length > 1 ? "s" : ""} in the run)` : "");
    parts.push(el("span", {}, stale
      ? `ran ${duration(up.up_s)} ${since}; last round ${ago === null || ago === undefined ? "at an unknown time" : duration(ago) + " ago: not running?"}`
      : `up ${duration(up.up_s + ago)} ${since}; last round ${duration(ago)} ago`));
  }
  document.getElementById("self").replaceChildren(...parts.flatMap((p, i) => i ? [document.createTextNode(" · "), p] : [p]));
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
      el("td", {class: "mono", title: p.peer}, label(view, p.peer)), el("td", {}, p.model_id), el("td", {class: "mono"}, p.model_family.slice(0, 12)),
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
      line.append(el("span", {class: "reward"}, fmt(c.reward)), document.createTextNode(c.text));
      if (c.end) line.append(el("span", {class: "end", title: c.finished ? "ended with the stop token" : "cut at the token budget"}, " " + c.end));
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
    drawSelf(view);
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

// The GBroker fleet dashboard (gbroker/daemon/dashboard.py says what it shows and why).
// Plain script, no build step: it polls /api/v1/fleet, draws the neighbourhood graph as SVG,
// plots with uPlot (vendored), and sets every value as text, never as HTML.
"use strict";
(function () {
  const POLL_MS = 2000;
  const MOVE_SECONDS = 30;
  const BUCKET = 10; // seconds per plotted bucket
  const WINDOW = 600; // seconds plotted
  const SVG = "http://www.w3.org/2000/svg";
  const state = { selected: null, plots: null, data: null };
  const $ = (id) => document.getElementById(id);

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (key === "class") node.className = value;
      else node.setAttribute(key, value);
    }
    for (const child of children) {
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function svg(tag, attrs, text) {
    const node = document.createElementNS(SVG, tag);
    for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function localTime(t) {
    if (t === null || t === undefined) return "-";
    const d = new Date(t * 1000);
    const now = new Date();
    if (d.toDateString() === now.toDateString()) {
      return d.toLocaleTimeString([], { hour12: false });
    }
    return d.toLocaleString([], { month: "short", day: "2-digit", hour: "2-digit",
                                  minute: "2-digit", hour12: false });
  }

  function duration(s) {
    if (s === null || s === undefined) return "-";
    s = Math.max(0, s);
    if (s < 10) return s.toFixed(1) + "s";
    s = Math.floor(s);
    if (s < 60) return s + "s";
    if (s < 3600) return Math.floor(s / 60) + "m" + String(s % 60).padStart(2, "0") + "s";
    if (s < 86400) return Math.floor(s / 3600) + "h" + String(Math.floor(s % 3600 / 60)).padStart(2, "0") + "m";
    return Math.floor(s / 86400) + "d" + String(Math.floor(s % 86400 / 3600)).padStart(2, "0") + "h";
  }

  const TERMINAL = new Set(["done", "failed", "cancelled"]);
  function waited(job, now) {
    if (job.started_at != null) return job.started_at - job.submitted_at;
    return TERMINAL.has(job.state) ? null : now - job.submitted_at;
  }
  function ran(job, now) { // to now while it runs; unknown for an ended job whose end is not in
    if (job.started_at == null) return null;
    if (job.ended_at == null && TERMINAL.has(job.state)) return null;
    return (job.ended_at == null ? now : job.ended_at) - job.started_at;
  }
  const owner = (jobId) => jobId.split(".")[0];

  // -- polling ------------------------------------------------------------------------------------

  async function poll() {
    try {
      const response = await fetch("/api/v1/fleet", { credentials: "same-origin", cache: "no-store" });
      if (response.status === 401) { // the session ended: the page shows the sign-in form
        window.location.reload();
        return;
      }
      if (!response.ok) throw new Error("HTTP " + response.status);
      render(await response.json());
    } catch (error) {
      $("summary").textContent = "no answer from this broker (" + error.message + "); retrying";
      document.body.dataset.error = "1";
    } finally {
      window.setTimeout(poll, POLL_MS);
    }
  }

  function render(data) {
    state.data = data;
    delete document.body.dataset.error;
    const up = data.sites.filter((s) => s.alive);
    const running = data.jobs.filter((j) => j.state === "running").length;
    const queued = data.jobs.filter((j) => j.state === "queued" || j.state === "staging").length;
    $("summary").textContent = `served by ${data.served_by} · ${up.length} of ${data.sites.length} ` +
      `sites up · ${running} running, ${queued} waiting · signed in as ${data.user} · ` +
      `updated ${localTime(data.now)}`;
    drawGraph(data);
    drawSites(data);
    drawPlots(data);
    drawJobs(data);
    if (state.selected) drawStory(state.selected, false);
    document.body.dataset.updated = String(data.now);
  }

  // -- the graph ----------------------------------------------------------------------------------

  const VIEW = [600, 420]; // the drawing's least size; it grows to hold every label
  const NODE = 24, RING = 30; // radii of a site's node and of its ring of busy cores

  // Each site on a circle wide enough that neighbours' names (below their nodes) never meet.
  function layout(sites, widest) {
    const n = sites.length;
    const gap = Math.max(2 * RING, widest) + 16;
    const r = n < 2 ? 0 : Math.max(150, n === 2 ? gap / 2 : gap / (2 * Math.sin(Math.PI / n)));
    const cx = VIEW[0] / 2, cy = VIEW[1] / 2;
    const at = {};
    sites.forEach((site, k) => {
      const angle = -Math.PI / 2 + (2 * Math.PI * k) / n;
      at[site.name] = [cx + r * Math.cos(angle), cy + r * Math.sin(angle)];
    });
    return at;
  }

  function drawGraph(data) {
    const graph = $("graph");
    graph.replaceChildren();
    const defs = svg("defs");
    const marker = svg("marker", { id: "arrow", viewBox: "0 0 10 10", refX: "9", refY: "5",
                                   markerWidth: "7", markerHeight: "7", orient: "auto-start-reverse" });
    marker.append(svg("path", { d: "M 0 0 L 10 5 L 0 10 z", class: "arrowhead" }));
    defs.append(marker);
    graph.append(defs);
    const content = svg("g", { class: "content" });
    graph.append(content);
    // The names as they will be drawn, measured first: the layout makes room for them.
    const names = {};
    let widest = 0;
    for (const site of data.sites) {
      const name = svg("text", { x: 0, y: 0, class: "name" }, site.name);
      content.append(name);
      names[site.name] = name;
      widest = Math.max(widest, name.getComputedTextLength());
    }
    const at = layout(data.sites, widest);
    const drawn = new Set();
    for (const [a, b] of data.arcs) {
      const key = [a, b].sort().join("\u0000");
      if (drawn.has(key) || !at[a] || !at[b]) continue;
      drawn.add(key);
      content.insertBefore(svg("line", { x1: at[a][0], y1: at[a][1], x2: at[b][0], y2: at[b][1],
                                         class: "arc" }), content.firstChild);
    }
    const now = data.now;
    for (const job of data.jobs) {
      const from = owner(job.id), to = job.site;
      const when = job.started_at || job.submitted_at;
      if (!to || from === to || !at[from] || !at[to] || now - when > MOVE_SECONDS) continue;
      const [x1, y1] = at[from], [x2, y2] = at[to];
      const len = Math.hypot(x2 - x1, y2 - y1) || 1, back = (RING + 4) / len;
      const line = svg("line", { x1, y1, x2: x2 - (x2 - x1) * back, y2: y2 - (y2 - y1) * back,
                                 class: "move", "marker-end": "url(#arrow)", "data-job": job.id });
      line.append(svg("title", {}, `${job.id}: ${from} → ${to}`));
      content.append(line);
    }
    for (const site of data.sites) {
      const [x, y] = at[site.name];
      const group = svg("g", { class: "site " + (site.alive ? "up" : "down"), "data-site": site.name,
                               "data-alive": String(site.alive) });
      const st = site.state;
      const busy = st ? (st.total_cores - st.free_cores) / Math.max(1, st.total_cores) : 0;
      const ring = 2 * Math.PI * RING;
      group.append(svg("circle", { cx: x, cy: y, r: RING, class: "ring-bg" }));
      group.append(svg("circle", { cx: x, cy: y, r: RING, class: "ring",
                                   "stroke-dasharray": `${busy * ring} ${ring}`,
                                   transform: `rotate(-90 ${x} ${y})` }));
      group.append(svg("circle", { cx: x, cy: y, r: NODE, class: "node" }));
      group.append(svg("text", { x, y: y + 1, class: "count" }, String(site.cores)));
      group.append(svg("text", { x, y: y + 12, class: "unit" }, site.cores === 1 ? "core" : "cores"));
      const name = names[site.name]; // below the ring, dark on the page: never cut by the node
      name.setAttribute("x", x);
      name.setAttribute("y", y + RING + 16);
      group.append(name);
      const detail = !site.alive ? "down" : st ?
        `${st.free_cores} free · ${st.queued} queued · ${st.running} running` : "no state";
      group.append(svg("text", { x, y: y + RING + 30, class: "detail" }, detail));
      group.append(svg("title", {}, `${site.name} (${site.url}): ${detail}`));
      content.append(group);
    }
    // The drawing holds all of it, whatever the names: the view grows to the content's box.
    const box = content.getBBox(), margin = 8;
    const x0 = Math.min(0, box.x - margin), y0 = Math.min(0, box.y - margin);
    const x1 = Math.max(VIEW[0], box.x + box.width + margin);
    const y1 = Math.max(VIEW[1], box.y + box.height + margin);
    graph.setAttribute("viewBox", `${x0} ${y0} ${x1 - x0} ${y1 - y0}`);
  }

  // -- tables -------------------------------------------------------------------------------------

  function drawSites(data) {
    const body = $("sites").tBodies[0];
    body.replaceChildren(...data.sites.map((site) => {
      const st = site.state || {};
      const health = site.health === null || site.health === undefined ? "-" : site.health ? "ok" : "FAILING";
      return el("tr", { "data-site": site.name, class: site.alive ? "up" : "down" },
        el("td", {}, site.name), el("td", {}, site.alive ? (site.draining ? "draining" : "up") : "DOWN"),
        el("td", {}, site.cores), el("td", {}, st.free_cores ?? "-"), el("td", {}, st.queued ?? "-"),
        el("td", {}, st.running ?? "-"), el("td", {}, health));
    }));
  }

  function drawJobs(data) {
    const body = $("jobs").tBodies[0];
    const latest = data.jobs.slice(-40).reverse();
    body.replaceChildren(...latest.map((job) => {
      const row = el("tr", { "data-job": job.id, class: "state-" + job.state, tabindex: "0" },
        el("td", {}, job.id), el("td", {}, job.name || "-"), el("td", { class: "state" }, job.state),
        el("td", {}, owner(job.id)), el("td", {}, job.site || "-"), el("td", {}, localTime(job.submitted_at)),
        el("td", {}, duration(waited(job, data.now))), el("td", {}, duration(ran(job, data.now))));
      if (job.id === state.selected) row.classList.add("selected");
      const open = () => { state.selected = job.id; drawStory(job.id, true); drawJobs(state.data); };
      row.addEventListener("click", open);
      row.addEventListener("keydown", (e) => { if (e.key === "Enter") open(); });
      return row;
    }));
  }

  // -- a job's story ------------------------------------------------------------------------------

  async function drawStory(jobId, fetchHistory) {
    const data = state.data;
    const job = data.jobs.find((j) => j.id === jobId);
    $("story-panel").hidden = false;
    $("story-job").textContent = jobId;
    const story = $("story");
    let history = story.dataset.job === jobId ? state.history : null;
    const known = job ? job.state : null; // refetch while it moves, and once when it settles
    if (fetchHistory || !history || state.historyState !== known || (job && !TERMINAL.has(job.state))) {
      state.historyState = known;
      try {
        const response = await fetch(`/api/v1/jobs/${encodeURIComponent(jobId)}/history`,
                                     { credentials: "same-origin", cache: "no-store" });
        history = response.ok ? (await response.json()).transitions : [];
      } catch (error) {
        history = [];
      }
      state.history = history;
    }
    story.dataset.job = jobId;
    const parts = [];
    if (job) {
      parts.push(el("p", {}, `${job.name || "unnamed"} · ${job.state} · entered at ${owner(job.id)}` +
        ` · ran at ${job.site || "-"} · waited ${duration(waited(job, data.now))}` +
        ` · ran ${duration(ran(job, data.now))}` + (job.exit_code != null ? ` · exit ${job.exit_code}` : "") +
        (job.error ? ` · ${job.error}` : "")));
    }
    if (history && history.length) {
      const first = history[0].at;
      parts.push(el("h3", {}, "History (its owner's journal)"));
      parts.push(el("table", { class: "history" },
        el("thead", {}, el("tr", {}, el("th", {}, "at"), el("th", {}, "since submitted"),
                                     el("th", {}, "state"), el("th", {}, "site"))),
        el("tbody", {}, ...history.map((t) => el("tr", {},
          el("td", {}, localTime(t.at)), el("td", {}, "+" + duration(t.at - first)),
          el("td", {}, t.state), el("td", {}, t.site || "-"))))));
    }
    const decision = data.decisions[jobId];
    parts.push(el("h3", {}, "Why it went there: F(j) of the decision"));
    if (!decision) {
      parts.push(el("p", { class: "note" }, "Not recorded: brokers record their decisions' terms " +
        "while a dashboard is open, and this job was placed before."));
    } else {
      parts.push(el("p", {}, `${decision.entry} ranked ${decision.terms.length} feasible site(s) ` +
        `for ${decision.rank} core(s) at ${localTime(decision.at)} and chose ${decision.chosen.join(", ") || "none"}. ` +
        "F(j) = t_j/t_max, plus c_max/c_j + w_j/w_max where the job would wait; lowest wins."));
      parts.push(el("table", { class: "terms" },
        el("thead", {}, el("tr", {}, ...["site", "t_j (s)", "t_j/t_max", "c_max/c_j", "w_j/w_max", "F(j)", "starts"]
          .map((h) => el("th", {}, h)))),
        el("tbody", {}, ...decision.terms.map((t) => el("tr",
          { class: decision.chosen.includes(t.site) ? "chosen" : "", "data-site": t.site },
          el("td", {}, t.site), el("td", {}, t.transfer_time.toFixed(2)), el("td", {}, t.transfer.toFixed(3)),
          el("td", {}, t.free.toFixed(3)), el("td", {}, t.load.toFixed(3)), el("td", {}, t.value.toFixed(3)),
          el("td", {}, t.waits ? "would wait" : "at once"))))));
    }
    story.replaceChildren(...parts);
  }

  // -- plots --------------------------------------------------------------------------------------

  function buckets(data) {
    const end = Math.ceil(data.now / BUCKET) * BUCKET;
    const xs = [], ended = [], waits = [];
    for (let t = end - WINDOW; t < end; t += BUCKET) { xs.push(t + BUCKET); ended.push(0); waits.push([]); }
    const slot = (t) => Math.floor((t - (end - WINDOW)) / BUCKET);
    for (const job of data.jobs) {
      if (job.ended_at != null) { const k = slot(job.ended_at); if (k >= 0 && k < xs.length) ended[k] += 1; }
      if (job.started_at != null) {
        const k = slot(job.started_at);
        if (k >= 0 && k < xs.length) waits[k].push(job.started_at - job.submitted_at);
      }
    }
    const perMinute = ended.map((n) => (n * 60) / BUCKET);
    const meanWait = waits.map((w) => (w.length ? w.reduce((a, b) => a + b, 0) / w.length : null));
    return [xs, perMinute, meanWait];
  }

  // From zero up (to ``top`` at least: a percentage's 100), so a flat line reads as what it is.
  function plot(target, title, label, color, top) {
    const width = Math.max(280, target.clientWidth || 320);
    const y = { range: (u, min, max) => [0, Math.max(top, max || 0)] };
    return new uPlot({ title, width, height: 150, scales: { x: { time: true }, y },
                       series: [{}, { label, stroke: color, width: 2, spanGaps: false }],
                       axes: [{}, { size: 50 }] }, [[], []], target);
  }

  // What a plot shows, said on its element too: the window it covers, and its points.
  function describe(target, xs, ys) {
    const known = xs.filter((x, k) => ys[k] !== null && ys[k] !== undefined);
    target.dataset.from = String(xs[0]);
    target.dataset.to = String(xs[xs.length - 1]);
    target.dataset.known = String(known.length);
    target.dataset.earliest = known.length ? String(known[0]) : "";
    const busy = xs.filter((x, k) => ys[k] > 0);
    target.dataset.firstBusy = busy.length ? String(busy[0]) : "";
    target.dataset.peak = String(Math.max(0, ...ys.filter((y) => y !== null && y !== undefined)));
  }

  function drawPlots(data) {
    if (typeof uPlot === "undefined") return;
    if (!state.plots) {
      state.plots = {
        throughput: plot($("plot-throughput"), "Throughput (jobs ended per minute)", "jobs/min", "#2b7a4b", 1),
        wait: plot($("plot-wait"), "Mean wait of jobs started (s)", "wait s", "#b5651d", 1),
        utilization: plot($("plot-utilization"), "Utilization of the live sites' cores (%)", "busy %", "#2f5fa7", 100),
      };
    }
    const [xs, perMinute, meanWait] = buckets(data);
    state.plots.throughput.setData([xs, perMinute]);
    state.plots.wait.setData([xs, meanWait]);
    describe($("plot-throughput"), xs, perMinute);
    describe($("plot-wait"), xs, meanWait);
    // Kept by the brokers (each its own site's): the last ten minutes, from the moment it opens.
    const ux = data.utilization.map((p) => p[0]), uy = data.utilization.map((p) => p[1]);
    state.plots.utilization.setData([ux, uy]);
    describe($("plot-utilization"), ux, uy);
  }

  poll();
})();

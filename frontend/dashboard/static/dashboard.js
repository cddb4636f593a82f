// The clipstream dashboard: polls /dashboard/data once a second and draws each panel with uPlot.
// Each panel's element carries data-points (non-empty values drawn), so a headless browser
// can tell a drawn chart from an empty one.
(function () {
  "use strict";
  const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
                  "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39"];
  const grid = document.getElementById("grid");
  const status = document.getElementById("status");
  const charts = {};  // panel id -> {plot, names, el}
  const KEEP = 900;  // samples kept, as the gateway keeps them
  const state = {t: [], panels: {}};  // what the page has: it asks only for newer rows

  function absorb(d) {
    const before = state.t.length;
    state.t = state.t.concat(d.t);
    for (const p of d.panels) {
      let have = state.panels[p.id];
      if (!have) { have = state.panels[p.id] = {id: p.id, title: p.title, unit: p.unit, series: {}}; }
      const names = new Set(Object.keys(have.series).concat(Object.keys(p.series)));
      for (const n of names) {
        const old = have.series[n] || new Array(before).fill(null);
        have.series[n] = old.concat(p.series[n] || new Array(d.t.length).fill(null));
      }
    }
    const drop = Math.max(0, state.t.length - KEEP);
    if (drop) {
      state.t = state.t.slice(drop);
      for (const id in state.panels) {
        for (const n in state.panels[id].series) { state.panels[id].series[n] = state.panels[id].series[n].slice(drop); }
      }
    }
  }

  function apiKey() {
    const m = location.hash.match(/key=([^&]+)/);
    if (m) {
      sessionStorage.setItem("clipstream-key", decodeURIComponent(m[1]));
      // kept for this tab only: out of the address, so not in history or bookmarks
      history.replaceState(null, "", location.pathname + location.search);
    }
    return sessionStorage.getItem("clipstream-key");
  }

  document.getElementById("keyform").addEventListener("submit", function (ev) {
    ev.preventDefault();
    sessionStorage.setItem("clipstream-key", document.getElementById("key").value);
    document.getElementById("keyform").style.display = "none";
    poll();
  });

  function panelEl(panel) {
    let c = charts[panel.id];
    if (c) { return c; }
    const el = document.createElement("div");
    el.className = "panel";
    el.id = "panel-" + panel.id;
    el.dataset.points = "0";
    const h = document.createElement("h2");
    h.textContent = panel.title + " (" + panel.unit + ")";
    el.appendChild(h);
    const body = document.createElement("div");
    body.className = "empty";
    body.textContent = "no data yet";
    el.appendChild(body);
    grid.appendChild(el);
    c = charts[panel.id] = {el: el, body: body, plot: null, names: ""};
    return c;
  }

  function clockTime(t) {
    return new Date(t * 1000).toTimeString().slice(0, 8);
  }

  function seriesStyle(name, i) {
    const s = {label: name, stroke: COLORS[i % COLORS.length], width: 1.5, spanGaps: false};
    if (/ SLO$| limit$/.test(name)) { s.dash = [6, 4]; }
    return s;
  }

  function draw(t, panel) {
    const c = panelEl(panel);
    const names = Object.keys(panel.series);
    let points = 0;
    const data = [t];
    for (const n of names) {
      const ys = panel.series[n];
      for (const y of ys) { if (y !== null && y !== undefined) { points++; } }
      data.push(ys);
    }
    c.el.dataset.points = String(points);
    c.el.dataset.series = String(names.length);
    if (!names.length || !t.length) { return; }
    const width = Math.max(300, c.el.clientWidth - 12);
    if (c.plot === null || c.names !== names.join("\n")) {
      if (c.plot) { c.plot.destroy(); }
      c.body.textContent = "";
      c.body.className = "";
      const opts = {
        width: width, height: 200,
        scales: {x: {time: true}},
        series: [{}].concat(names.map(seriesStyle)),
        // one line per tick (HH:MM:SS): uPlot's default adds the date under the first tick,
        // which overlaps its neighbours on a panel this narrow
        axes: [{space: 70, values: (u, ticks) => ticks.map(clockTime)}, {size: 50}],
        legend: {live: false},
      };
      c.plot = new uPlot(opts, data, c.body);
      c.names = names.join("\n");
    } else {
      c.plot.setData(data);
    }
  }

  async function poll() {
    const key = apiKey();
    const headers = key ? {"X-API-Key": key} : {};
    try {
      const since = state.t.length ? "?since=" + state.t[state.t.length - 1] : "";
      const r = await fetch("/dashboard/data" + since, {headers: headers, cache: "no-store"});
      if (r.status === 401 || r.status === 403) {  // no key, or a key of some apps only
        status.textContent = r.status === 401 ? "this gateway needs an API key (or open /dashboard#key=...)"
          : "this API key may not read the dashboard (it needs a key for every app)";
        document.getElementById("keyform").style.display = "block";
        return;
      }
      if (!r.ok) { throw new Error("HTTP " + r.status); }
      const d = await r.json();
      absorb(d);
      for (const p of d.panels) { draw(state.t, state.panels[p.id]); }
      const down = Object.keys(d.errors || {});
      status.textContent = "updated " + new Date().toLocaleTimeString() + ", " + state.t.length + " samples" +
        (down.length ? "; not answering: " + down.join(", ") : "");
      document.body.dataset.updates = String(Number(document.body.dataset.updates) + 1);
    } catch (e) {
      status.textContent = "error: " + e;
    }
    setTimeout(poll, 1000);
  }
  poll();
})();

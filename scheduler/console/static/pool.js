// idlegpu console: tonight's pool as an SVG chart, redrawn from /console/pool.json every 60 s.
// Plain JS, no library: history of free GPUs (total and per service), the forecast band
// (median to the configured confidence), the idle windows, the jobs placed, and "now".
"use strict";
(function () {
  var NS = "http://www.w3.org/2000/svg";
  var root = document.getElementById("chart");
  var W = 1200, H = 380, M = { l: 48, r: 16, t: 16, b: 28 }, LANE = 12, LANES_MAX = 24;
  var HOUR = 3600 * 1000;

  function el(name, attrs, parent) {
    var node = document.createElementNS(NS, name);
    for (var k in attrs) node.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(node);
    return node;
  }
  function text(content, attrs, parent) { var t = el("text", attrs, parent); t.textContent = content; return t; }
  function fmt(ms, tz, withDay) {
    var opts = { timeZone: tz, hour: "2-digit", minute: "2-digit", hourCycle: "h23" };
    if (withDay) opts.weekday = "short";
    return new Intl.DateTimeFormat("en-GB", opts).format(new Date(ms));
  }
  function line(times, values, x, y) {
    var d = "", pen = false, n = 0;
    for (var i = 0; i < times.length; i++) {
      var v = values[i];
      if (v === null || v === undefined) { pen = false; continue; }
      d += (pen ? "L" : "M") + x(times[i]).toFixed(1) + "," + y(v).toFixed(1);
      pen = true; n++;
    }
    return { d: d, n: n };
  }
  function setStamp(node, label, when, age, stale) {
    node.textContent = label + ": " + (when || "none") + (age !== null && age !== undefined ? " (" + Math.round(age / 60) + " min ago)" : "");
    node.classList.toggle("stale", !!stale);
    if (stale) node.textContent += " — stale";
  }
  function legendItem(legend, cls, label) {
    var span = document.createElement("span");
    var sw = document.createElement("span"); sw.className = "swatch " + cls; span.appendChild(sw);
    span.appendChild(document.createTextNode(label)); legend.appendChild(span);
  }

  function draw(data) {
    var tz = data.timezone, now = data.now;
    var t0 = now - 48 * HOUR, t1 = now + 24 * HOUR;
    var jobs = data.jobs || [], lanes = Math.min(jobs.length, LANES_MAX);
    var plotH = H - M.t - M.b, total = H + (lanes ? lanes * LANE + 24 : 0);
    var ymax = data.lendable_gpus || 1;
    var x = function (t) { return M.l + (t - t0) / (t1 - t0) * (W - M.l - M.r); };
    var y = function (v) { return M.t + plotH - Math.max(0, Math.min(v, ymax)) / ymax * plotH; };
    var svg = el("svg", { viewBox: "0 0 " + W + " " + total, id: "pool-svg", "aria-hidden": "true" });
    // grid and axes
    var axis = el("g", { "class": "axis" }, svg);
    for (var g = 0; g <= 4; g++) {
      var gv = Math.round(ymax * g / 4);
      el("line", { "class": "grid", x1: M.l, x2: W - M.r, y1: y(gv), y2: y(gv) }, axis);
      text(String(gv), { x: M.l - 6, y: y(gv) + 4, "text-anchor": "end" }, axis);
    }
    var first = Math.ceil(t0 / (6 * HOUR)) * 6 * HOUR;
    for (var t = first; t <= t1; t += 6 * HOUR) {
      el("line", { "class": "grid", x1: x(t), x2: x(t), y1: M.t, y2: M.t + plotH }, axis);
      text(fmt(t, tz, true), { x: x(t), y: H - 8, "text-anchor": "middle" }, axis);
    }
    text("free GPUs", { x: M.l + 4, y: M.t - 4 }, axis);
    text("times in " + data.zone, { "class": "axis-zone", x: W - M.r, y: M.t - 4, "text-anchor": "end" }, axis);
    // idle windows
    var wins = el("g", { "class": "windows" }, svg);
    (data.windows || []).forEach(function (w) {
      var r = el("rect", { "class": "window", x: x(w.start), width: Math.max(1, x(w.end) - x(w.start)),
        y: y(w.gpus), height: y(0) - y(w.gpus) }, wins);
      el("title", {}, r).textContent = "idle window: " + w.text;
    });
    // forecast band: from the free GPUs at the confidence (the lower edge) to the median
    if (data.forecast && data.forecast.times.length) {
      var f = data.forecast, upper = "", lower = [];
      for (var i = 0; i < f.times.length; i++) {
        if (f.median[i] === null || f.band[i] === null) continue;
        upper += (upper ? "L" : "M") + x(f.times[i]).toFixed(1) + "," + y(f.median[i]).toFixed(1);
        lower.unshift("L" + x(f.times[i]).toFixed(1) + "," + y(f.band[i]).toFixed(1));
      }
      el("path", { "class": "band", d: upper + lower.join("") + "Z" }, svg);
      var med = line(f.times, f.median, x, y);
      el("path", { "class": "median", d: med.d, "data-points": med.n }, svg);
      var low = line(f.times, f.band, x, y);
      el("path", { "class": "lower", d: low.d, "data-points": low.n }, svg);
    }
    // history: per service (dashed) and the pool's total free
    var h = data.history, names = Object.keys(h.services || {});
    names.forEach(function (name, k) {
      var s = line(h.times, h.services[name].free, x, y);
      var p = el("path", { "class": "service s" + (k % 5), d: s.d, "data-service": name, "data-points": s.n }, svg);
      el("title", {}, p).textContent = name + ": free GPUs of its maximum";
    });
    var hist = line(h.times, h.free, x, y);
    el("path", { "class": "history-free", d: hist.d, "data-points": hist.n }, svg);
    // now
    el("line", { "class": "now", x1: x(now), x2: x(now), y1: M.t, y2: M.t + plotH }, svg);
    text("now " + fmt(now, tz, true) + " " + data.zone_abbr, { "class": "now-label", x: x(now) + 4, y: M.t + 12 }, svg);
    // jobs placed, one lane each under the chart
    var lane = el("g", { "class": "jobs" }, svg);
    if (lanes) text("jobs", { x: M.l - 6, y: H + 8 + LANE - 3, "text-anchor": "end" }, lane);
    jobs.slice(0, LANES_MAX).forEach(function (j, k) {
      var top = H + 8 + k * LANE, x0 = Math.max(M.l, x(j.start)), x1 = Math.min(W - M.r, x(j.end));
      var r = el("rect", { "class": "job " + j.state, x: x0, width: Math.max(2, x1 - x0), y: top, height: LANE - 3,
        "data-unit": j.id }, lane);
      el("title", {}, r).textContent = j.state + ": " + j.text;
      if (j.stops) el("line", { "class": "job-stop", x1: x1, x2: x1, y1: top, y2: top + LANE - 3 }, lane);
    });
    if (jobs.length > LANES_MAX)
      text("+" + (jobs.length - LANES_MAX) + " more jobs planned (listed below)", { x: M.l, y: total - 4 }, lane);
    root.replaceChildren(svg);
    root.setAttribute("data-drawn", String(Date.now()));

    var legend = document.getElementById("legend");
    legend.replaceChildren();
    legendItem(legend, "sw-history", "free GPUs, last 48 h");
    names.forEach(function (name, k) { legendItem(legend, "sw-s" + (k % 5), name + " (free of its max)"); });
    legendItem(legend, "sw-band", "forecast: median to the " + Math.round(data.confidence * 100) + "% bound");
    legendItem(legend, "sw-window", "idle windows");
    legendItem(legend, "sw-job", "planned jobs"); legendItem(legend, "sw-running", "running");
    legendItem(legend, "sw-now", "now");

    document.getElementById("now-text").textContent = "Now: " + data.now_text;
    setStamp(document.getElementById("forecast-age"), "forecast made", data.forecast_made_at, data.forecast_age_s, data.forecast_stale);
    setStamp(document.getElementById("signals-age"), "live signals", data.signals_at, data.signals_age_s, data.signals_stale);
    document.getElementById("plan-counts").textContent = (data.starting || 0) + " unit(s) start tonight, " + (data.waiting || 0) + " wait";
    var err = document.getElementById("chart-error");
    err.hidden = !data.forecast_error; err.textContent = data.forecast_error ? "No forecast now: " + data.forecast_error : "";
    var list = function (id, items, render) {
      var ul = document.getElementById(id); ul.replaceChildren();
      if (!items.length) { var li = document.createElement("li"); li.textContent = "none"; ul.appendChild(li); }
      items.forEach(function (it) { var li = document.createElement("li"); render(li, it); ul.appendChild(li); });
    };
    list("windows", data.windows || [], function (li, w) { li.textContent = w.text; });
    list("jobs", jobs.slice(0, 200), function (li, j) {
      var a = document.createElement("a"); a.href = "/units/" + encodeURIComponent(j.id);
      a.textContent = j.state; li.appendChild(a); li.appendChild(document.createTextNode(": " + j.text));
    });
    if (window.performance && performance.mark) performance.mark("idlegpu-chart-drawn");
  }

  function load() {
    fetch(root.getAttribute("data-source"), { credentials: "same-origin", cache: "no-store" })
      .then(function (r) {
        if (r.status === 401) { window.location = "/login?next=%2F"; throw new Error("logged out"); }
        if (!r.ok) throw new Error("HTTP " + r.status);
        return r.json();
      })
      .then(draw)
      .catch(function (e) {
        var err = document.getElementById("chart-error"); err.hidden = false;
        err.textContent = "The pool could not be read: " + e.message;
      });
  }
  document.getElementById("refresh").addEventListener("click", load);
  load();
  setInterval(load, 1000 * Number(root.getAttribute("data-refresh-s") || 60));
})();

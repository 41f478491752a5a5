/* Small SVG charts drawn by hand (no library): stacked bars, lines, plain bars and the leadership
 * timeline. Each function clears its container and draws at the container's current width; the
 * pages redraw on data changes and on resize. Every mark carries a <title> tooltip.
 */
(function () {
  "use strict";

  var Sched = (window.Sched = window.Sched || {});
  var SVG_NS = "http://www.w3.org/2000/svg";
  var PAD = { top: 10, right: 12, bottom: 24, left: 46 };

  function svg(tag, attrs, text) {
    var node = document.createElementNS(SVG_NS, tag);
    for (var key in attrs) {
      if (Object.prototype.hasOwnProperty.call(attrs, key) && attrs[key] !== null && attrs[key] !== undefined) {
        node.setAttribute(key, String(attrs[key]));
      }
    }
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function tooltip(node, text) {
    node.appendChild(svg("title", {}, text));
    return node;
  }

  /** 1, 2, 5 × 10^k at or above value. */
  function niceMax(value) {
    if (!(value > 0)) return 1;
    var power = Math.pow(10, Math.floor(Math.log10(value)));
    var steps = [1, 2, 2.5, 5, 10];
    for (var i = 0; i < steps.length; i++) {
      if (steps[i] * power >= value) return steps[i] * power;
    }
    return 10 * power;
  }

  function frame(container, height) {
    Sched.clear(container);
    var width = Math.max(260, Math.floor(container.clientWidth || 600));
    var root = svg("svg", {
      class: "chart-svg",
      width: width,
      height: height,
      viewBox: "0 0 " + width + " " + height,
      "aria-hidden": "true",
      focusable: "false",
    });
    container.appendChild(root);
    return { root: root, width: width, height: height, plotW: width - PAD.left - PAD.right, plotH: height - PAD.top - PAD.bottom };
  }

  /** Ticks for a y axis from 0 to max: 5 (with maxima of 1, 2, 2.5, 5 x 10^k every step is a
   *  round number), fewer for a count below 5 so that no two ticks read the same whole number. */
  function tickCount(max, wholeNumbers) {
    return wholeNumbers && max < 5 ? Math.max(1, Math.ceil(max)) : 5;
  }

  function yAxis(f, max, format) {
    var ticks = tickCount(max, format === integer);
    for (var i = 0; i <= ticks; i++) {
      var value = (max * i) / ticks;
      var y = PAD.top + f.plotH - (f.plotH * i) / ticks;
      f.root.appendChild(svg("line", { class: "chart-gridline", x1: PAD.left, x2: PAD.left + f.plotW, y1: y, y2: y }));
      f.root.appendChild(svg("text", { class: "chart-label", x: PAD.left - 6, y: y + 4, "text-anchor": "end" }, format(value)));
    }
  }

  function timeAxis(f, slots, xOf) {
    var every = slots.length > 40 ? 10 : 5;
    slots.forEach(function (t, i) {
      var minute = new Date(t).getMinutes();
      if (minute % every !== 0) return;
      var x = xOf(i);
      f.root.appendChild(svg("line", { class: "chart-tick", x1: x, x2: x, y1: PAD.top + f.plotH, y2: PAD.top + f.plotH + 4 }));
      f.root.appendChild(svg("text", { class: "chart-label", x: x, y: f.height - 6, "text-anchor": "middle" }, Sched.formatTimeShort(t)));
    });
  }

  function integer(value) {
    return String(Math.round(value));
  }

  function emptyNote(container, text) {
    container.appendChild(Sched.el("p", { class: "chart__empty" }, text));
  }

  var charts = (Sched.charts = {});

  charts.legend = function (container, series) {
    if (!container) return;
    Sched.clear(container);
    series.forEach(function (s) {
      container.appendChild(
        Sched.el("span", { class: "legend-item" }, [
          Sched.el("span", { class: "legend-swatch" + (s.dashed ? " legend-swatch--dashed" : ""), style: { "--swatch": s.color } }),
          s.label,
        ])
      );
    });
  };

  /** options: slots [ms], series [{key, label, color}], value(i, key) -> number, emptyText. */
  charts.stackedBars = function (container, options) {
    var f = frame(container, options.height || 180);
    var slots = options.slots;
    var totals = slots.map(function (_, i) {
      return options.series.reduce(function (sum, s) { return sum + (options.value(i, s.key) || 0); }, 0);
    });
    // Counts: a whole number at the top (2.5 x 10^k is none below 10).
    var max = Math.ceil(niceMax(Math.max.apply(null, totals.concat([1]))));
    yAxis(f, max, integer);
    var step = f.plotW / slots.length;
    var barW = Math.max(1, step * 0.72);
    function xOf(i) { return PAD.left + step * i + step / 2; }
    slots.forEach(function (t, i) {
      var y = PAD.top + f.plotH;
      var parts = [];
      options.series.forEach(function (s) {
        var n = options.value(i, s.key) || 0;
        if (!n) return;
        var h = (f.plotH * n) / max;
        y -= h;
        f.root.appendChild(svg("rect", { x: xOf(i) - barW / 2, y: y, width: barW, height: Math.max(h, 0.5), fill: s.color, class: "chart-bar" }));
        parts.push(n + " " + s.label.toLowerCase());
      });
      if (totals[i]) {
        var hit = svg("rect", { x: PAD.left + step * i, y: PAD.top, width: step, height: f.plotH, class: "chart-hit" });
        tooltip(hit, Sched.formatTimeShort(t) + " — " + parts.join(", "));
        f.root.appendChild(hit);
      }
    });
    timeAxis(f, slots, xOf);
    if (!totals.some(Boolean) && options.emptyText) emptyNote(container, options.emptyText);
  };

  /** options: slots [ms], series [{key, label, color, dashed, values: [number|null]}], format. */
  charts.lines = function (container, options) {
    var f = frame(container, options.height || 180);
    var slots = options.slots;
    var all = [];
    options.series.forEach(function (s) {
      s.values.forEach(function (v) { if (v !== null && v !== undefined) all.push(v); });
    });
    var max = niceMax(Math.max.apply(null, all.concat([1])));
    yAxis(f, max, options.format);
    var step = f.plotW / slots.length;
    function xOf(i) { return PAD.left + step * i + step / 2; }
    function yOf(v) { return PAD.top + f.plotH - (f.plotH * v) / max; }
    options.series.forEach(function (s) {
      var segment = [];
      function flush() {
        if (segment.length > 1) {
          f.root.appendChild(svg("polyline", { points: segment.join(" "), fill: "none", stroke: s.color, "stroke-width": 2, "stroke-dasharray": s.dashed ? "4 3" : null, "stroke-linejoin": "round", "stroke-linecap": "round" }));
        }
        segment = [];
      }
      s.values.forEach(function (v, i) {
        if (v === null || v === undefined) { flush(); return; }
        segment.push(xOf(i).toFixed(1) + "," + yOf(v).toFixed(1));
        var dot = svg("circle", { cx: xOf(i), cy: yOf(v), r: 2.5, fill: s.color, class: "chart-dot" });
        tooltip(dot, Sched.formatTimeShort(slots[i]) + " — " + s.label + ": " + options.format(v));
        f.root.appendChild(dot);
      });
      flush();
    });
    timeAxis(f, slots, xOf);
    if (!all.length && options.emptyText) emptyNote(container, options.emptyText);
  };

  /** options: items [{value, color, title, href}], format. One bar per item, left to right. */
  charts.bars = function (container, options) {
    var f = frame(container, options.height || 170);
    var items = options.items;
    var max = niceMax(Math.max.apply(null, items.map(function (it) { return it.value; }).concat([1])));
    yAxis(f, max, options.format);
    var slots = Math.max(items.length, 10);
    var step = f.plotW / slots;
    var barW = Math.max(2, Math.min(28, step * 0.7));
    items.forEach(function (it, i) {
      var h = Math.max(1, (f.plotH * it.value) / max);
      var x = PAD.left + step * i + (step - barW) / 2;
      var bar = svg("rect", { x: x, y: PAD.top + f.plotH - h, width: barW, height: h, fill: it.color, rx: 2, class: "chart-bar" });
      tooltip(bar, it.title);
      if (it.href) {
        var link = svg("a", { href: it.href, class: "chart-link" });
        link.appendChild(bar);
        f.root.appendChild(link);
      } else {
        f.root.appendChild(bar);
      }
    });
    f.root.appendChild(svg("text", { class: "chart-label", x: PAD.left, y: f.height - 6 }, "older"));
    f.root.appendChild(svg("text", { class: "chart-label", x: PAD.left + f.plotW, y: f.height - 6, "text-anchor": "end" }, "newer"));
  };

  var END_REASONS = { stepped_down: "stepped down", lease_lost: "lease lost", node_died: "node died" };
  var NODE_COLORS = ["#2f6fde", "#13a085", "#8e5cc4", "#e07b1f", "#d04a7c", "#4f8a10", "#2a9bbf", "#b8860b"];

  /** options: terms [{term, node_id, acquired_at, ended_at, end_reason}], nowMs. */
  charts.timeline = function (container, options) {
    var terms = (options.terms || []).filter(function (t) { return !isNaN(Date.parse(t.acquired_at)); });
    Sched.clear(container);
    if (!terms.length) {
      container.appendChild(Sched.el("div", { class: "empty-state" }, [
        Sched.el("p", { class: "empty-state__title" }, "No leader elected yet"),
        Sched.el("p", null, "Terms appear as soon as a node wins the election."),
      ]));
      return;
    }
    var now = options.nowMs;
    var ordered = terms.slice().sort(function (a, b) { return a.term - b.term; });
    var nodes = [];
    ordered.forEach(function (t) { if (nodes.indexOf(t.node_id) < 0) nodes.push(t.node_id); });
    var start = Date.parse(ordered[0].acquired_at);
    var end = Math.max(now, start + 1000);
    var labelW = Math.min(150, Math.max(80, Math.floor((container.clientWidth || 600) * 0.25)));
    var rowH = 26;
    var f = frame(container, PAD.top + nodes.length * rowH + 28);
    var plotLeft = labelW + 8;
    var plotW = f.width - plotLeft - PAD.right;
    function xOf(ms) { return plotLeft + (plotW * (ms - start)) / (end - start); }

    nodes.forEach(function (node, row) {
      var y = PAD.top + row * rowH;
      f.root.appendChild(svg("rect", { x: plotLeft, y: y + 3, width: plotW, height: rowH - 6, class: "timeline-lane" }));
      var label = node.length > 22 ? node.slice(0, 21) + "…" : node;
      var text = svg("text", { class: "chart-label chart-label--strong", x: labelW, y: y + rowH / 2 + 4, "text-anchor": "end" }, label);
      tooltip(text, node);
      f.root.appendChild(text);
    });

    ordered.forEach(function (t) {
      var row = nodes.indexOf(t.node_id);
      var from = Date.parse(t.acquired_at);
      var to = t.ended_at ? Date.parse(t.ended_at) : now;
      var x1 = xOf(from);
      var x2 = Math.max(x1 + 3, xOf(to));
      var y = PAD.top + row * rowH + 5;
      var current = !t.ended_at;
      var group = svg("g", { class: "timeline-term" + (current ? " timeline-term--current" : "") });
      group.appendChild(svg("rect", { x: x1, y: y, width: x2 - x1, height: rowH - 10, rx: 3, fill: NODE_COLORS[row % NODE_COLORS.length] }));
      if (x2 - x1 > 34) {
        group.appendChild(svg("text", { class: "timeline-label", x: x1 + 5, y: y + (rowH - 10) / 2 + 1, "text-anchor": "start" }, "T" + t.term));
      }
      var lines = [
        "Term " + t.term + " — " + t.node_id,
        "From " + Sched.formatDateTime(from),
        current ? "Leading now" : "To " + Sched.formatDateTime(to),
        "Held " + Sched.formatDuration(to - from),
      ];
      if (!current) lines.push("Ended: " + (END_REASONS[t.end_reason] || t.end_reason || "unknown"));
      tooltip(group, lines.join("\n"));
      f.root.appendChild(group);
    });

    var axisY = PAD.top + nodes.length * rowH + 4;
    f.root.appendChild(svg("line", { class: "chart-gridline", x1: plotLeft, x2: plotLeft + plotW, y1: axisY, y2: axisY }));
    var tickCount = Math.max(2, Math.min(5, Math.floor(plotW / 110)));
    for (var i = 0; i <= tickCount; i++) {
      var ms = start + ((end - start) * i) / tickCount;
      var anchor = i === 0 ? "start" : i === tickCount ? "end" : "middle";
      var span = end - start;
      var text2 = span > 86400000 ? Sched.formatDateTime(ms) : Sched.formatTimeShort(ms);
      if (span < 600000) text2 = Sched.formatTimeShort(ms, true);
      f.root.appendChild(svg("text", { class: "chart-label", x: xOf(ms), y: axisY + 16, "text-anchor": anchor }, text2));
    }
  };

  charts.STATUS_COLORS = {
    succeeded: "#2e9d5b",
    failed: "#d64545",
    timed_out: "#e08a1e",
    lost: "#8e5cc4",
    cancelled: "#8792a2",
    skipped: "#c3cad4",
    running: "#2f6fde",
    pending: "#6b7a90",
    retry_scheduled: "#d9a400",
  };

  /** Call fn when the window width changes (debounced). */
  charts.onResize = function (fn) {
    var lastWidth = window.innerWidth;
    window.addEventListener("resize", Sched.debounce(function () {
      if (window.innerWidth !== lastWidth) {
        lastWidth = window.innerWidth;
        fn();
      }
    }, 150));
  };
})();

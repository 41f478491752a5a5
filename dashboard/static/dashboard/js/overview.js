/* The overview page: counters, cluster panel, leadership timeline, per-minute charts and the latest
 * executions, all kept current from the live messages "counts", "cluster" and "executions".
 *
 * Charts start from the server's per-minute aggregates (as of `as_of`) and add every execution the
 * live feed reports as finished (or started, for lag) after `as_of`, each id counted once. After a
 * (re)connect the page fetches /dashboard/stats.json again and re-applies what it saw since.
 */
(function () {
  "use strict";

  var Sched = window.Sched;
  var MINUTE = 60000;
  var OUTCOMES = [
    { key: "succeeded", label: "Succeeded" },
    { key: "failed", label: "Failed" },
    { key: "timed_out", label: "Timed out" },
    { key: "lost", label: "Lost" },
    { key: "cancelled", label: "Cancelled" },
    { key: "skipped", label: "Skipped" },
  ];
  OUTCOMES.forEach(function (s) { s.color = Sched.charts.STATUS_COLORS[s.key]; });
  var END_REASONS = { stepped_down: "Stepped down", lease_lost: "Lease lost", node_died: "Node died" };

  var stats = Sched.readJSON("overview-data");
  if (!stats) return;
  var windowMinutes = stats.minutes.window_minutes || 60;

  // --- chart state ------------------------------------------------------------------------------
  var base = {};
  var extra = {};
  var asOfMs = 0;
  var countedFinish = {};
  var countedStart = {};
  var seen = {}; // id -> newest row from the live feed (to re-apply after a reset)

  function emptyBucket() {
    return { outcomes: {}, dur_sum: 0, dur_n: 0, dur_max: 0, lag_sum: 0, lag_n: 0, lag_max: 0 };
  }
  function minuteOf(ms) {
    return Math.floor(ms / MINUTE) * MINUTE;
  }

  function reset(newStats) {
    base = {};
    newStats.minutes.buckets.forEach(function (b) { base[b.t] = b; });
    asOfMs = Date.parse(newStats.as_of);
    extra = {};
    countedFinish = {};
    countedStart = {};
    Object.keys(seen).forEach(function (id) { count(seen[id]); });
  }

  function count(e) {
    if (Sched.TERMINAL.indexOf(e.status) >= 0 && e.finished_at && !countedFinish[e.id]) {
      var finished = Date.parse(e.finished_at);
      if (finished > asOfMs) {
        var b = (extra[minuteOf(finished)] = extra[minuteOf(finished)] || emptyBucket());
        b.outcomes[e.status] = (b.outcomes[e.status] || 0) + 1;
        if (e.duration_ms !== null && e.duration_ms !== undefined) {
          b.dur_sum += e.duration_ms;
          b.dur_n += 1;
          b.dur_max = Math.max(b.dur_max, e.duration_ms);
        }
        countedFinish[e.id] = true;
      }
    }
    if (e.started_at && e.lag_ms !== null && e.lag_ms !== undefined && !countedStart[e.id]) {
      var started = Date.parse(e.started_at);
      if (started > asOfMs) {
        var s = (extra[minuteOf(started)] = extra[minuteOf(started)] || emptyBucket());
        s.lag_sum += e.lag_ms;
        s.lag_n += 1;
        s.lag_max = Math.max(s.lag_max, e.lag_ms);
        countedStart[e.id] = true;
      }
    }
  }

  function prune() {
    var oldest = minuteOf(Sched.now()) - windowMinutes * MINUTE;
    Object.keys(seen).forEach(function (id) {
      var e = seen[id];
      var last = Date.parse(e.finished_at || e.updated_at || e.created_at);
      if (Sched.TERMINAL.indexOf(e.status) >= 0 && last < oldest) delete seen[id];
    });
    [base, extra].forEach(function (map) {
      Object.keys(map).forEach(function (t) { if (Number(t) < oldest) delete map[t]; });
    });
  }

  function combined(t) {
    var a = base[t] || emptyBucket();
    var b = extra[t] || emptyBucket();
    var outcomes = {};
    OUTCOMES.forEach(function (s) { outcomes[s.key] = (a.outcomes[s.key] || 0) + (b.outcomes[s.key] || 0); });
    return {
      outcomes: outcomes,
      dur_n: a.dur_n + b.dur_n,
      dur_avg: a.dur_n + b.dur_n ? (a.dur_sum + b.dur_sum) / (a.dur_n + b.dur_n) : null,
      dur_max: a.dur_n + b.dur_n ? Math.max(a.dur_max, b.dur_max) : null,
      lag_avg: a.lag_n + b.lag_n ? (a.lag_sum + b.lag_sum) / (a.lag_n + b.lag_n) : null,
      lag_max: a.lag_n + b.lag_n ? Math.max(a.lag_max, b.lag_max) : null,
    };
  }

  var throughputEl = document.getElementById("chart-throughput");
  var lagEl = document.getElementById("chart-lag");
  var durationEl = document.getElementById("chart-duration");

  function drawCharts() {
    var last = minuteOf(Sched.now());
    var slots = [];
    for (var i = windowMinutes - 1; i >= 0; i--) slots.push(last - i * MINUTE);
    var data = slots.map(combined);
    Sched.charts.stackedBars(throughputEl, {
      slots: slots,
      series: OUTCOMES,
      value: function (i, key) { return data[i].outcomes[key]; },
      emptyText: "No executions finished in the last hour.",
    });
    Sched.charts.lines(lagEl, {
      slots: slots,
      format: Sched.formatDuration,
      series: [
        { key: "avg", label: "Average", color: "#2f6fde", values: data.map(function (d) { return d.lag_avg; }) },
        { key: "max", label: "Maximum", color: "#e08a1e", dashed: true, values: data.map(function (d) { return d.lag_max; }) },
      ],
      emptyText: "No executions started in the last hour.",
    });
    Sched.charts.lines(durationEl, {
      slots: slots,
      format: Sched.formatDuration,
      series: [
        { key: "avg", label: "Average", color: "#13a085", values: data.map(function (d) { return d.dur_avg; }) },
        { key: "max", label: "Maximum", color: "#8e5cc4", dashed: true, values: data.map(function (d) { return d.dur_max; }) },
      ],
      emptyText: "No executions finished in the last hour.",
    });
  }

  var drawPending = false;
  var lastDraw = 0;
  function scheduleDraw() {
    if (drawPending) return;
    drawPending = true;
    // At most twice a second, however fast executions arrive.
    setTimeout(function () {
      drawPending = false;
      lastDraw = Date.now();
      drawCharts();
    }, Math.max(0, 500 - (Date.now() - lastDraw)));
  }

  // --- counters ------------------------------------------------------------------------------
  function renderCounts(counts) {
    Object.keys(counts).forEach(function (key) {
      var card = document.querySelector('[data-count="' + key + '"]');
      if (!card) return;
      var value = card.querySelector("[data-value]");
      var text = String(counts[key]);
      if (value.textContent !== text) {
        value.textContent = text;
        Sched.flash(card);
      }
      if (card.dataset.alert) card.classList.toggle("stat--" + card.dataset.alert, counts[key] > 0);
    });
  }

  // --- cluster ---------------------------------------------------------------------------------
  var nodesEl = document.getElementById("cluster-nodes");
  var summaryEl = document.getElementById("cluster-summary");
  var timelineEl = document.getElementById("leadership-timeline");
  var termsBody = document.querySelector("#terms-table tbody");
  var cluster = stats.cluster;

  function nodeCard(node, leader, term) {
    var el = Sched.el;
    var capacity = node.capacity || 0;
    var percent = capacity ? Math.min(100, Math.round((100 * node.running_count) / capacity)) : 0;
    var head = [el("h3", { class: "node-card__title" }, el("a", { href: Sched.url("nodes/" + node.id + "/") }, node.node_id))];
    if (node.node_id === leader) head.push(el("span", { class: "leader-badge", title: "Current leader" }, "★ Leader · term " + term));
    head.push(el("span", { class: "badge badge--node-" + node.status, title: node.degraded_reason || null }, node.status));
    if (node.drain_requested && node.status === "active") head.push(el("span", { class: "tag tag--warn" }, "drain requested"));
    return el("article", { class: "node-card node-card--" + node.status, "data-node-id": node.node_id }, [
      el("header", { class: "node-card__head" }, head),
      el("dl", { class: "node-card__facts" }, [
        el("div", null, [el("dt", null, "Heartbeat"), el("dd", null, Sched.heartbeatEl(node))]),
        el("div", null, [
          el("dt", null, "Running"),
          el("dd", null, [
            el("span", { class: "meter", role: "img", "aria-label": node.running_count + " of " + capacity + " slots busy" }, el("span", { class: "meter__fill", style: { width: percent + "%" } })),
            " " + node.running_count + " / " + capacity,
          ]),
        ]),
        el("div", null, [el("dt", null, "Host"), el("dd", null, node.hostname + " · pid " + node.pid)]),
        (cluster.partitions || []).length
          ? el("div", null, [el("dt", null, "Partitions"), el("dd", { "data-field": "leads" }, (node.leads || []).join(", ") || "—")])
          : null,
        // The partitions it leads that are a second or more behind (their leader's word).
        Object.keys(node.leads_behind || {}).length
          ? el("div", null, [
              el("dt", null, "Behind"),
              el(
                "dd",
                { class: "text-warn", "data-field": "leads-behind" },
                Object.keys(node.leads_behind)
                  .map(function (p) { return "partition " + p + ": " + node.leads_behind[p] + " s"; })
                  .join(", ")
              ),
            ])
          : null,
      ]),
      node.degraded_reason ? el("p", { class: "node-card__note text-warn" }, "Cannot reach the database: " + node.degraded_reason) : null,
    ]);
  }

  var behindEl = document.getElementById("cluster-behind");

  // The leader's word while the schedule is behind (null while it keeps up).
  function renderBehind(behind) {
    if (!behindEl) return;
    behindEl.hidden = !behind;
    if (!behind) return;
    var figures = "— fires " + behind.fires_s + " s, claims " + behind.claims_s + " s late";
    if (behind.waiting) figures += ", " + behind.waiting + " due run" + (behind.waiting === 1 ? "" : "s") + " waiting";
    behindEl.querySelector('[data-field="figures"]').textContent = figures;
    behindEl.querySelector('[data-field="why"]').textContent = (behind.why || []).join("; ");
  }

  function renderCluster(data) {
    cluster = data;
    renderBehind(data.behind);
    var el = Sched.el;
    Sched.clear(nodesEl);
    if (!data.nodes.length) {
      nodesEl.appendChild(el("div", { class: "empty-state" }, [
        el("p", { class: "empty-state__title" }, "No nodes have registered yet"),
        el("p", null, ["Start one with ", el("code", null, "python manage.py runnode"), "; it appears here within a second."]),
      ]));
    }
    data.nodes.forEach(function (node) { nodesEl.appendChild(nodeCard(node, data.leader, data.term)); });
    Sched.clear(summaryEl);
    if (data.leader) summaryEl.append("Leader ", el("strong", null, data.leader), " · term " + data.term);
    else summaryEl.append(el("span", { class: "text-warn" }, "No leader"));
    summaryEl.append(" · " + data.nodes.length + " node" + (data.nodes.length === 1 ? "" : "s"));
    if ((data.partitions || []).length) summaryEl.append(" · " + data.partitions.length + " partitions");
    drawTimeline();
    renderTerms(data.terms || []);
  }

  function drawTimeline() {
    Sched.charts.timeline(timelineEl, { terms: cluster.terms || [], nowMs: Sched.now() });
  }

  function renderTerms(terms) {
    var el = Sched.el;
    Sched.clear(termsBody);
    if (!terms.length) {
      termsBody.appendChild(el("tr", null, el("td", { colspan: 6, class: "muted" }, "No terms yet.")));
      return;
    }
    terms.forEach(function (t) {
      var from = Date.parse(t.acquired_at);
      var to = t.ended_at ? Date.parse(t.ended_at) : Sched.now();
      termsBody.appendChild(el("tr", null, [
        el("td", null, String(t.term)),
        el("td", null, Sched.nodeLink(t.node_id)),
        el("td", null, Sched.timeEl(t.acquired_at)),
        el("td", null, t.ended_at ? Sched.timeEl(t.ended_at) : el("span", { class: "tag tag--ok" }, "current")),
        el("td", { class: "num" }, Sched.formatDuration(to - from)),
        el("td", null, t.ended_at ? END_REASONS[t.end_reason] || t.end_reason || "—" : "—"),
      ]));
    });
  }

  // --- latest executions -------------------------------------------------------------------
  var recent = new Sched.LiveExecutionTable(document.getElementById("recent-executions"), { prepend: true });

  function onExecutions(rows) {
    rows.forEach(function (e) {
      seen[e.id] = e;
      count(e);
    });
    recent.apply(rows);
    scheduleDraw();
  }

  // --- wiring ----------------------------------------------------------------------------------
  Sched.charts.legend(document.getElementById("legend-throughput"), OUTCOMES);
  Sched.charts.legend(document.getElementById("legend-lag"), [
    { label: "Average", color: "#2f6fde" },
    { label: "Maximum", color: "#e08a1e", dashed: true },
  ]);
  Sched.charts.legend(document.getElementById("legend-duration"), [
    { label: "Average", color: "#13a085" },
    { label: "Maximum", color: "#8e5cc4", dashed: true },
  ]);

  reset(stats);
  renderCluster(cluster);
  drawCharts();

  Sched.live.on("counts", renderCounts);
  Sched.live.on("cluster", renderCluster);
  Sched.live.on("executions", onExecutions);
  Sched.live.on("open", function (info) {
    // Whatever happened while we were not connected: fetch the aggregates again.
    fetch(Sched.url("dashboard/stats.json"), { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (response) {
        if (!response.ok) throw new Error("HTTP " + response.status);
        return response.json();
      })
      .then(function (fresh) {
        reset(fresh);
        renderCounts(fresh.counts);
        renderCluster(fresh.cluster);
        scheduleDraw();
      })
      .catch(function () { /* the live feed still updates the page */ });
    if (info.reconnected) {
      Sched.fetchExecutionsSince(info.sinceIso).then(function (rows) { recent.apply(rows.reverse()); }).catch(function () {});
    }
  });

  setInterval(drawTimeline, 5000); // the current term grows
  setInterval(function () { prune(); scheduleDraw(); }, 15000); // the window slides
  Sched.charts.onResize(function () { drawCharts(); drawTimeline(); });
})();

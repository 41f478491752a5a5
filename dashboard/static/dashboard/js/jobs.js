/* The job list and job detail pages, kept current from the live messages "jobs", "jobs_deleted"
 * and "executions".
 */
(function () {
  "use strict";

  var Sched = window.Sched;
  var page = document.body.dataset.page;

  function stateBadge(enabled) {
    return enabled
      ? Sched.el("span", { class: "badge badge--enabled" }, "Enabled")
      : Sched.el("span", { class: "badge badge--paused" }, "Paused");
  }

  /** Show the pause or the resume button of a job, whichever applies now. */
  function toggleActions(container, enabled) {
    if (!container) return;
    var forms = container.querySelectorAll("[data-when-enabled]");
    for (var i = 0; i < forms.length; i++) forms[i].hidden = forms[i].dataset.whenEnabled !== String(enabled);
  }

  function setTime(cell, iso, format) {
    if (!cell) return;
    var current = cell.querySelector("time");
    if ((current ? current.getAttribute("datetime") : null) === (iso || null)) return;
    Sched.clear(cell);
    var el = Sched.timeEl(iso, format);
    if (cell.dataset.zone && el.tagName === "TIME") {
      // Shown in the job's own zone (a cron job's next fire), like the server rendered it.
      el.dataset.zone = cell.dataset.zone;
      delete el.dataset.localized;
      Sched.renderTime(el);
    }
    cell.appendChild(el);
  }

  // --- job list ----------------------------------------------------------------------------------
  function setupList() {
    var table = document.getElementById("job-table");
    var note = document.getElementById("new-jobs-note");
    var newJobs = {};
    var maxJobId = note ? parseInt(note.dataset.maxJobId || "0", 10) : 0;
    var running = {}; // job id -> {execution id: true} seen running through the live feed

    function row(id) {
      return table ? table.querySelector('tr[data-job-id="' + id + '"]') : null;
    }

    function onJobs(jobs) {
      jobs.forEach(function (job) {
        var tr = row(job.id);
        if (!tr) {
          // Not on this page: only a job created since the page loaded is worth a note (others
          // are on another page or filtered out, and change whenever they fire).
          if (job.id <= maxJobId || newJobs[job.id]) return;
          newJobs[job.id] = true;
          var n = Object.keys(newJobs).length;
          if (note) {
            note.querySelector("span").textContent = n === 1 ? "1 job was created since this page loaded." : n + " jobs were created since this page loaded.";
            note.querySelector("a").setAttribute("href", location.pathname + location.search);
            note.hidden = false;
          }
          return;
        }
        var enabled = Boolean(job.enabled);
        if (tr.dataset.enabled !== String(enabled)) {
          tr.dataset.enabled = String(enabled);
          var stateCell = tr.querySelector('[data-col="state"]');
          var flag = stateCell.querySelector(".running-flag");
          Sched.clear(stateCell);
          stateCell.appendChild(stateBadge(enabled));
          if (flag) stateCell.appendChild(flag);
          toggleActions(tr.querySelector("[data-job-actions]"), enabled);
        }
        var description = tr.querySelector('[data-field="schedule_description"]');
        if (description && job.schedule_description) description.textContent = job.schedule_description;
        setTime(tr.querySelector('[data-col="next_fire_at"]'), job.next_fire_at, "relative");
        setTime(tr.querySelector('[data-col="last_fire_at"]'), job.last_fire_at, "relative");
        Sched.flash(tr);
      });
    }

    function onDeleted(ids) {
      ids.forEach(function (id) {
        var tr = row(id);
        if (!tr) return;
        tr.classList.add("row--deleted");
        var actions = tr.querySelector("[data-job-actions]");
        if (actions) actions.remove();
        var name = tr.querySelector('[data-col="name"]');
        name.appendChild(Sched.el("span", { class: "tag tag--danger" }, "deleted"));
        Sched.announce("A job was deleted.");
        setTimeout(function () { tr.remove(); }, 4000);
      });
    }

    function onExecutions(rows) {
      rows.forEach(function (e) {
        var tr = row(e.job);
        if (!tr) return;
        var runs = (running[e.job] = running[e.job] || {});
        var count = parseInt(tr.dataset.running || "0", 10);
        if (e.status === "running" && !runs[e.id]) {
          runs[e.id] = true;
          count += 1;
        } else if (e.status !== "running" && runs[e.id]) {
          delete runs[e.id];
          count -= 1;
        } else if (Sched.TERMINAL.indexOf(e.status) >= 0 && e.started_at && !runs[e.id] && count > Object.keys(runs).length) {
          count -= 1; // one of the runs that were running when the page loaded
        }
        tr.dataset.running = String(Math.max(0, count));
        var flag = tr.querySelector(".running-flag");
        if (flag) flag.hidden = count <= 0;
        if (Sched.TERMINAL.indexOf(e.status) >= 0) {
          var cell = tr.querySelector('[data-col="last_outcome"]');
          var link = cell.querySelector("a");
          var shown = link ? parseInt(link.getAttribute("href").split("/")[2], 10) : 0;
          if (e.id >= shown) {
            Sched.clear(cell);
            cell.appendChild(Sched.el("a", { href: Sched.url("executions/" + e.id + "/"), class: "badge-link" }, Sched.statusBadge(e.status)));
          }
        }
      });
    }

    Sched.live.on("jobs", onJobs);
    Sched.live.on("jobs_deleted", onDeleted);
    Sched.live.on("executions", onExecutions);
  }

  // --- job detail -------------------------------------------------------------------------------
  function setupDetail() {
    var header = document.getElementById("job-header");
    var jobId = parseInt(header.dataset.jobId, 10);
    var stats = Sched.readJSON("job-stats") || { recent: [] };
    var recentRuns = stats.recent.slice(); // newest first, at most 100
    var history = new Sched.LiveExecutionTable(document.getElementById("job-history"), {
      accept: function (e) { return e.job === jobId; },
    });
    var chartEl = document.getElementById("chart-job-durations");
    var knownVersion = null;
    var runningIds = {};
    var runningEl = document.getElementById("running-now");
    var runningCount = parseInt(runningEl.textContent, 10) || 0;

    function drawChart() {
      var points = recentRuns
        .filter(function (r) { return r.duration_ms !== null && r.duration_ms !== undefined; })
        .slice(0, 50)
        .reverse();
      if (!points.length) return;
      Sched.charts.bars(chartEl, {
        format: Sched.formatDuration,
        items: points.map(function (r) {
          return {
            value: r.duration_ms,
            color: Sched.charts.STATUS_COLORS[r.status] || "#6b7a90",
            title: "#" + r.id + " — " + (Sched.STATUS_LABELS[r.status] || r.status) + ", " + Sched.formatDuration(r.duration_ms),
            href: Sched.url("executions/" + r.id + "/"),
          };
        }),
      });
    }

    function updateKpis() {
      var judged = recentRuns.filter(function (r) { return ["succeeded", "failed", "timed_out", "lost"].indexOf(r.status) >= 0; });
      var ok = judged.filter(function (r) { return r.status === "succeeded"; }).length;
      document.getElementById("success-rate").textContent = judged.length ? (Math.round((1000 * ok) / judged.length) / 10) + "%" : "—";
      document.getElementById("success-hint").textContent = judged.length ? ok + " of the last " + judged.length + " finished runs" : "no finished runs yet";
      var durations = recentRuns.map(function (r) { return r.duration_ms; }).filter(function (d) { return d !== null && d !== undefined; }).sort(function (a, b) { return a - b; });
      var avg = durations.length ? durations.reduce(function (a, b) { return a + b; }, 0) / durations.length : null;
      var p95 = durations.length ? durations[Math.min(durations.length - 1, Math.floor(durations.length * 0.95))] : null;
      ["avg-duration", "p95-duration"].forEach(function (id, i) {
        var node = document.getElementById(id);
        Sched.clear(node);
        node.appendChild(Sched.durationEl(i === 0 ? avg : p95));
      });
    }

    function onExecutions(rows) {
      var mine = rows.filter(function (e) { return e.job === jobId; });
      if (!mine.length) return;
      history.apply(mine);
      var changed = false;
      mine.forEach(function (e) {
        if (e.status === "running" && !runningIds[e.id]) { runningIds[e.id] = true; runningCount += 1; }
        else if (e.status !== "running" && runningIds[e.id]) { delete runningIds[e.id]; runningCount -= 1; }
        else if (Sched.TERMINAL.indexOf(e.status) >= 0 && e.started_at && !runningIds[e.id] && runningCount > Object.keys(runningIds).length) runningCount -= 1;
        if (Sched.TERMINAL.indexOf(e.status) < 0) return;
        if (recentRuns.some(function (r) { return r.id === e.id; })) return;
        recentRuns.unshift({ id: e.id, status: e.status, duration_ms: e.duration_ms });
        recentRuns.sort(function (a, b) { return b.id - a.id; });
        recentRuns.length = Math.min(recentRuns.length, 100);
        changed = true;
      });
      runningEl.textContent = String(Math.max(0, runningCount));
      if (changed) {
        updateKpis();
        drawChart();
      }
    }

    function onJobs(jobs) {
      jobs.forEach(function (job) {
        if (job.id !== jobId) return;
        var enabled = Boolean(job.enabled);
        var enabledChanged = header.dataset.enabled !== String(enabled);
        if (enabledChanged) {
          header.dataset.enabled = String(enabled);
          var state = header.querySelector('[data-field="state"]');
          Sched.clear(state);
          state.appendChild(stateBadge(enabled));
          toggleActions(header.querySelector("[data-job-actions]"), enabled);
        }
        var description = header.querySelector('[data-field="schedule_description"]');
        if (description && job.schedule_description) description.textContent = job.schedule_description;
        setTime(document.querySelector('[data-field="next_fire_at"]'), job.next_fire_at);
        setTime(document.querySelector('[data-field="last_fire_at"]'), job.last_fire_at);
        var note = document.getElementById("job-changed-note");
        var versionEl = note.querySelector('[data-field="version"]');
        if (knownVersion === null) knownVersion = parseInt(versionEl.textContent, 10);
        if (job.version > knownVersion) {
          versionEl.textContent = String(job.version);
          // A pause or resume bumps the version by one and is already shown; any other change
          // touched the definition this page shows, which only a reload brings in.
          if (enabledChanged && job.version === knownVersion + 1 && note.hidden) knownVersion = job.version;
          else note.hidden = false;
        }
      });
    }

    function onDeleted(ids) {
      if (ids.indexOf(jobId) < 0) return;
      document.getElementById("job-deleted-note").hidden = false;
      var actions = header.querySelector("[data-job-actions]");
      if (actions) actions.remove();
      Sched.announce("This job has been deleted.");
    }

    drawChart();
    Sched.charts.onResize(drawChart);
    Sched.live.on("executions", onExecutions);
    Sched.live.on("jobs", onJobs);
    Sched.live.on("jobs_deleted", onDeleted);
    Sched.live.on("open", function (info) {
      if (!info.reconnected) return;
      Sched.fetchExecutionsSince(info.sinceIso, { job: jobId }).then(onExecutions).catch(function () {});
    });
  }

  if (page === "job-list") setupList();
  else if (page === "job-detail") setupDetail();
})();

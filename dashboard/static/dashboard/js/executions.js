/* The execution list (new runs at the top, statuses changing in place) and the execution detail
 * page (timing, attempt chain, buttons, and the output streamed while it runs through
 * {"subscribe_execution": id} -> "execution_output" messages).
 */
(function () {
  "use strict";

  var Sched = window.Sched;
  var page = document.body.dataset.page;

  // --- list ------------------------------------------------------------------------------------
  function setupList() {
    var filter = Sched.readJSON("live-filter") || {};
    var since = filter.since ? Date.parse(filter.since) : NaN;
    var until = filter.until ? Date.parse(filter.until) : NaN;
    var table = new Sched.LiveExecutionTable(document.getElementById("execution-table"), {
      prepend: Boolean(filter.prepend),
      accept: function (e) {
        if (filter.job && e.job !== filter.job) return false;
        if (filter.status && e.status !== filter.status) return false;
        if (filter.node && e.node !== filter.node) return false;
        var scheduled = Date.parse(e.scheduled_for);
        if (!isNaN(since) && scheduled < since) return false;
        if (!isNaN(until) && scheduled >= until) return false;
        return true;
      },
    });
    Sched.live.on("executions", function (rows) {
      var added = table.apply(rows);
      if (!added) return;
      Sched.announce(added === 1 ? "1 new execution." : added + " new executions.");
      var totals = document.querySelectorAll("[data-live-total]");
      for (var i = 0; i < totals.length; i++) totals[i].textContent = String(parseInt(totals[i].textContent, 10) + added);
    });
    Sched.live.on("open", function (info) {
      var params = {};
      if (filter.job) params.job = filter.job;
      if (filter.status) params.status = filter.status;
      if (filter.node) params.node = filter.node;
      Sched.fetchExecutionsSince(info.sinceIso, params).then(function (rows) { table.apply(rows); }).catch(function () {});
    });
  }

  // --- detail ----------------------------------------------------------------------------------
  function setupDetail() {
    var data = Sched.readJSON("execution-data");
    if (!data) return;
    var id = data.id;
    var status = data.status;
    var cancelRequested = data.cancel_requested;
    var latestAttempt = data.latest_attempt;
    var subscribed = false;
    var finalFetched = false;

    var outputEl = document.getElementById("execution-output");
    var outputEmpty = document.getElementById("output-empty");
    var outputState = document.getElementById("output-state");
    var chainBody = document.querySelector("#attempt-chain tbody");

    function isTerminal(s) { return data.terminal.indexOf(s) >= 0; }

    function fieldEl(name) { return document.querySelector('[data-field="' + name + '"]'); }

    function setTimeField(name, iso) {
      var cell = fieldEl(name);
      if (!cell) return;
      var current = cell.querySelector("time");
      if ((current ? current.getAttribute("datetime") : null) === (iso || null)) return;
      Sched.clear(cell);
      cell.appendChild(Sched.timeEl(iso));
    }

    function setText(name, value) {
      var cell = fieldEl(name);
      if (!cell) return;
      var empty = value === null || value === undefined || value === "";
      if (empty && cell.dataset.empty && cell.dataset.empty !== "—") return; // says why it is empty
      var text = empty ? "—" : String(value);
      var target = cell.querySelector("code") || cell;
      if (target.textContent !== text) target.textContent = text;
    }

    function updateButtons() {
      var cancel = document.querySelector('form[data-action="cancel"]');
      var retry = document.querySelector('form[data-action="retry"]');
      if (cancel) cancel.hidden = !(data.cancellable.indexOf(status) >= 0 && !cancelRequested);
      if (retry) retry.hidden = !(data.retryable.indexOf(status) >= 0 && data.attempt === latestAttempt);
    }

    function setStatus(newStatus, newCancelRequested) {
      var changed = newStatus !== status;
      status = newStatus;
      if (newCancelRequested !== undefined) cancelRequested = newCancelRequested;
      var holder = fieldEl("status");
      if (changed) {
        Sched.clear(holder);
        holder.appendChild(Sched.statusBadge(status));
        Sched.flash(holder);
        Sched.announce("Execution " + id + " is now " + (Sched.STATUS_LABELS[status] || status) + ".");
      }
      fieldEl("cancelling").hidden = !(cancelRequested && status === "running");
      updateButtons();
      if (isTerminal(status)) finish();
    }

    function setOutput(text) {
      if (text === undefined || text === null) return;
      var atBottom = outputEl.scrollHeight - outputEl.scrollTop - outputEl.clientHeight < 24;
      if (outputEl.textContent !== text) outputEl.textContent = text;
      outputEl.hidden = !text;
      outputEmpty.hidden = Boolean(text);
      if (atBottom) outputEl.scrollTop = outputEl.scrollHeight;
    }

    function setBlock(sectionId, preId, text) {
      if (text === undefined || text === null) return;
      var section = document.getElementById(sectionId);
      var pre = document.getElementById(preId);
      if (pre.textContent !== text) pre.textContent = text;
      section.hidden = !text;
    }

    // "Running for": ticks every second while the run runs (from its started_at).
    var startedAt = data.started_at ? Date.parse(data.started_at) : null;
    function tickElapsed() {
      var row = fieldEl("elapsed-row");
      var running = status === "running" && startedAt !== null;
      row.hidden = !running;
      if (!running) return;
      var cell = fieldEl("elapsed");
      var seconds = Math.max(0, Math.floor((Date.now() - startedAt) / 1000));
      var text = seconds < 60 ? seconds + " s" : Sched.formatDuration(seconds * 1000);
      if (cell.textContent !== text) cell.textContent = text;
    }
    tickElapsed();
    setInterval(tickElapsed, 1000);

    function applyRow(e) {
      if (e.started_at) startedAt = Date.parse(e.started_at);
      setStatus(e.status, e.cancel_requested);
      tickElapsed();
      setTimeField("run_after", e.run_after);
      if ("claimed_at" in e) setTimeField("claimed_at", e.claimed_at);
      setTimeField("started_at", e.started_at);
      setTimeField("finished_at", e.finished_at);
      ["duration_ms", "lag_ms"].forEach(function (name) {
        var cell = fieldEl(name);
        Sched.clear(cell);
        cell.appendChild(Sched.durationEl(e[name]));
      });
      var nodeCell = fieldEl("node");
      if (e.node) {
        Sched.clear(nodeCell);
        nodeCell.appendChild(Sched.nodeLink(e.node));
      }
      setText("term", e.term);
      setText("claim_token", e.claim_token);
      var reason = fieldEl("reason");
      reason.textContent = e.reason || "";
      reason.hidden = !e.reason;
    }

    function applyFull(e) {
      applyRow(e);
      setOutput(e.output);
      streamedLength = null; // the feed's next append may not follow this text: resync on it
      setBlock("error-section", "execution-error", e.error);
      setBlock("traceback-section", "execution-traceback", e.traceback);
      if ("result" in e) {
        setBlock("result-section", "execution-result", e.result === null ? "" : JSON.stringify(e.result, null, 2));
      }
    }

    function chainRow(e) {
      var row = chainBody.querySelector('tr[data-execution-id="' + e.id + '"]');
      if (!row) {
        row = Sched.el("tr", { "data-execution-id": e.id, "data-attempt": e.attempt }, [
          Sched.el("td", { class: "num" }, String(e.attempt)),
          Sched.el("td", null, Sched.el("a", { href: Sched.url("executions/" + e.id + "/") }, "#" + e.id)),
          Sched.el("td", { "data-col": "status" }),
          Sched.el("td", { "data-col": "finished_at" }),
        ]);
        var before = null;
        for (var i = 0; i < chainBody.rows.length; i++) {
          if (parseInt(chainBody.rows[i].dataset.attempt, 10) > e.attempt) { before = chainBody.rows[i]; break; }
        }
        chainBody.insertBefore(row, before);
        row.classList.add("row--new");
      }
      var statusCell = row.querySelector('[data-col="status"]');
      Sched.clear(statusCell);
      statusCell.appendChild(Sched.statusBadge(e.status));
      var finishedCell = row.querySelector('[data-col="finished_at"]');
      Sched.clear(finishedCell);
      finishedCell.appendChild(Sched.timeEl(e.finished_at));
    }

    function fetchFull() {
      return fetch(Sched.api("executions/" + id + "/"), { credentials: "same-origin", headers: { Accept: "application/json" } })
        .then(function (response) {
          if (!response.ok) throw new Error("HTTP " + response.status);
          return response.json();
        })
        .then(applyFull);
    }

    function finish() {
      if (subscribed) {
        Sched.live.unsubscribeExecution(id);
        subscribed = false;
      }
      outputState.textContent = "final";
      if (!outputEl.textContent) outputEmpty.textContent = "This run wrote no output.";
      if (!finalFetched) {
        finalFetched = true;
        // The result and the last words of the output arrive with the final row.
        fetchFull().catch(function () { finalFetched = false; });
      }
    }

    // The feed sends the output whole (output_from 0), then what was added (output_from: the
    // length already sent, counted in characters as the server counts them, not UTF-16 units).
    var streamedLength = null;
    function characters(text) {
      var count = 0;
      for (var i = 0; i < text.length; i++) {
        var code = text.charCodeAt(i);
        if (code < 0xdc00 || code > 0xdfff || i === 0 || (text.charCodeAt(i - 1) & 0xfc00) !== 0xd800) count++;
      }
      return count;
    }

    Sched.live.on("execution_output", function (payload) {
      if (!payload || payload.id !== id) return;
      var part = payload.output || "";
      var from = payload.output_from || 0;
      if (from === 0) {
        setOutput(part);
        streamedLength = characters(part);
      } else if (from === streamedLength) {
        if (part) setOutput(outputEl.textContent + part);
        streamedLength += characters(part);
      } else {
        // Out of step (a fetch replaced the text, or a frame was lost): ask for it whole again.
        streamedLength = null;
        Sched.live.subscribeExecution(id);
        return;
      }
      setBlock("error-section", "execution-error", payload.error);
      setBlock("traceback-section", "execution-traceback", payload.traceback);
      if (payload.status) setStatus(payload.status);
    });

    Sched.live.on("executions", function (rows) {
      rows.forEach(function (e) {
        if (e.id === id) {
          applyRow(e);
        } else if (e.job === data.job && Date.parse(e.scheduled_for) === Date.parse(data.scheduled_for)) {
          chainRow(e);
          if (e.attempt > latestAttempt) {
            latestAttempt = e.attempt;
            updateButtons();
          }
        }
        if (e.id === id) chainRow(e);
      });
    });

    Sched.live.on("open", function () {
      fetchFull().catch(function () {});
    });

    if (!isTerminal(status)) {
      Sched.live.subscribeExecution(id);
      subscribed = true;
    }
    if (outputEl && !outputEl.hidden) outputEl.scrollTop = outputEl.scrollHeight;
  }

  if (page === "execution-list") setupList();
  else if (page === "execution-detail") setupDetail();
})();

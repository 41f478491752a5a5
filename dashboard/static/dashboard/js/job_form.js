/* The job editor: schedule type switcher, dates typed in the viewer's time zone, JSON checks and
 * the live schedule preview (debounced GET /api/schedule-preview/: next 5 fire times in the job's
 * time zone and the viewer's, a human description, and inline errors for a bad cron or zone).
 * The server validates everything again on save; this is only feedback while typing.
 */
(function () {
  "use strict";

  var Sched = window.Sched;
  var form = document.getElementById("job-form");
  if (!form) return;

  var PREVIEW_COUNT = 5;
  var PREVIEW_DEBOUNCE_MS = 300;
  var field = function (name) { return form.elements.namedItem(name); };
  var typeInputs = form.querySelectorAll('input[name="schedule_type"]');
  var panels = form.querySelectorAll("[data-schedule-panel]");

  function scheduleType() {
    for (var i = 0; i < typeInputs.length; i++) if (typeInputs[i].checked) return typeInputs[i].value;
    return "";
  }

  // --- schedule type switcher ------------------------------------------------------------------
  function showPanel() {
    var type = scheduleType();
    for (var i = 0; i < panels.length; i++) panels[i].hidden = panels[i].dataset.schedulePanel !== type;
    var zoneNote = form.querySelector("[data-viewer-zone-note]");
    if (zoneNote) zoneNote.hidden = type === "cron" || !type;
  }

  // --- dates in the viewer's zone --------------------------------------------------------------
  function pad(n) { return (n < 10 ? "0" : "") + n; }
  function localInputValue(ms) {
    var d = new Date(ms);
    return d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + "T" + pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds());
  }

  function localizeDateInputs() {
    var zoneInput = field("viewer_timezone");
    if (!zoneInput) return;
    var from = zoneInput.value || "UTC";
    if (from !== Sched.viewerZone && from === "UTC") {
      ["start_at", "run_at"].forEach(function (name) {
        var input = field(name);
        if (!input || !input.value || /[zZ]|[+-]\d\d:?\d\d$/.test(input.value)) return;
        var ms = Date.parse(input.value + "Z");
        if (!isNaN(ms)) input.value = localInputValue(ms);
      });
    }
    zoneInput.value = Sched.viewerZone;
    var zoneNames = form.querySelectorAll("[data-viewer-zone]");
    for (var i = 0; i < zoneNames.length; i++) zoneNames[i].textContent = Sched.viewerZone;
  }

  function isoFromInput(name) {
    var input = field(name);
    if (!input || !input.value) return "";
    var ms = Date.parse(input.value); // no offset: read as the viewer's local time
    return isNaN(ms) ? null : new Date(ms).toISOString();
  }

  // --- JSON textareas --------------------------------------------------------------------------
  function checkJson(name, expected) {
    var input = field(name);
    var error = form.querySelector('[data-json-error="' + name + '"]');
    if (!input || !error) return;
    var text = input.value.trim();
    var message = "";
    if (text) {
      try {
        var value = JSON.parse(text);
        if (expected === "list" && !Array.isArray(value)) message = "Must be a JSON list, e.g. [1, \"a\"].";
        if (expected === "object" && (value === null || typeof value !== "object" || Array.isArray(value))) message = "Must be a JSON object, e.g. {\"key\": \"value\"}.";
      } catch (e) {
        message = "Not valid JSON yet: " + e.message;
      }
    }
    error.textContent = message;
    error.hidden = !message;
    input.setAttribute("aria-invalid", message ? "true" : "false");
  }

  // --- live preview ------------------------------------------------------------------------------
  var descriptionEl = document.getElementById("preview-description");
  var stateEl = document.getElementById("preview-state");
  var tableEl = document.getElementById("preview-table");
  var zonesNote = document.getElementById("preview-zones");
  var controller = null;
  var sequence = 0;

  function clearPreviewErrors() {
    var errors = form.querySelectorAll("[data-preview-error]");
    for (var i = 0; i < errors.length; i++) {
      errors[i].hidden = true;
      errors[i].textContent = "";
      var input = field(errors[i].dataset.previewError);
      if (input && input.dataset.previewInvalid) {
        input.removeAttribute("aria-invalid");
        delete input.dataset.previewInvalid;
      }
    }
  }

  function showPreviewError(name, message) {
    var error = form.querySelector('[data-preview-error="' + name + '"]');
    var input = field(name);
    if (!error) return false;
    error.textContent = message;
    error.hidden = false;
    if (input) {
      input.setAttribute("aria-invalid", "true");
      input.dataset.previewInvalid = "1";
    }
    return true;
  }

  function setState(text, kind) {
    stateEl.textContent = text;
    stateEl.className = "preview__state" + (kind ? " preview__state--" + kind : "");
  }

  function previewParams() {
    var type = scheduleType();
    var params = new URLSearchParams({ schedule_type: type, count: String(PREVIEW_COUNT) });
    if (type === "cron") {
      var expression = field("cron_expression").value.trim();
      if (!expression) return { wait: "Enter a cron expression to see when it fires." };
      // Obvious half-typed input is answered here, without asking the server.
      var parts = expression.split(/\s+/).length;
      if (expression.charAt(0) !== "@" && parts < 5) {
        return { wait: "Keep typing: a cron expression has 5 fields (minute hour day month weekday), or 6 with seconds first." };
      }
      var zoneName = field("timezone").value.trim() || "UTC";
      if (!jobZone()) return { error: ["timezone", "Unknown time zone '" + zoneName + "' (use an IANA name such as Europe/Berlin)."] };
      params.set("cron_expression", expression);
      params.set("timezone", zoneName);
      params.set("dst_repeated", field("dst_repeated").value || "cron");
      params.set("dst_missing", field("dst_missing").value || "cron");
    } else if (type === "interval") {
      var seconds = field("interval_seconds").value.trim();
      if (!seconds) return { wait: "Enter the interval in seconds." };
      params.set("interval_seconds", seconds);
      var startAt = isoFromInput("start_at");
      if (startAt === null) return { error: ["start_at", "Enter a valid date and time."] };
      if (startAt) params.set("start_at", startAt);
    } else if (type === "once") {
      var runAt = isoFromInput("run_at");
      if (runAt === "") return { wait: "Pick the date and time the job runs." };
      if (runAt === null) return { error: ["run_at", "Enter a valid date and time."] };
      params.set("run_at", runAt);
    } else {
      return { wait: "Choose a schedule type." };
    }
    return { params: params };
  }

  function jobZone() {
    if (scheduleType() !== "cron") return "UTC";
    var zone = field("timezone").value.trim() || "UTC";
    try {
      new Intl.DateTimeFormat(undefined, { timeZone: zone });
      return zone;
    } catch (e) {
      return null;
    }
  }

  var weekdayFormats = {};
  function formatWithWeekday(ms, zone) {
    var key = zone || "";
    if (!weekdayFormats[key]) {
      var options = { weekday: "short", year: "numeric", month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", second: "2-digit", hourCycle: "h23" };
      if (zone) options.timeZone = zone;
      weekdayFormats[key] = new Intl.DateTimeFormat(undefined, options);
    }
    return weekdayFormats[key].format(new Date(ms));
  }

  function renderFires(fires) {
    Sched.clear(tableEl);
    var zone = jobZone() || "UTC";
    form.querySelector('[data-zone-label="job"]').textContent = zone;
    form.querySelector('[data-zone-label="viewer"]').textContent = Sched.viewerZone;
    fires.forEach(function (iso) {
      var ms = Date.parse(iso);
      tableEl.appendChild(Sched.el("li", { class: "fire-list__item" }, [
        Sched.el("time", { datetime: iso, title: Sched.formatUTC(ms), "data-localized": "1", class: "fire-list__job" }, formatWithWeekday(ms, zone)),
        Sched.el("span", { class: "fire-list__viewer" }, [
          Sched.el("time", { datetime: iso, title: Sched.formatUTC(ms), "data-localized": "1" }, formatWithWeekday(ms, null)),
          " · " + Sched.formatRelative(ms),
        ]),
      ]));
    });
    tableEl.hidden = !fires.length;
    zonesNote.hidden = !fires.length;
  }

  // A cron job's fires on the next days its zone changes offset, under its DST rules.
  var dstEl = document.getElementById("preview-dst");
  function renderDstDays(days) {
    if (!dstEl) return;
    Sched.clear(dstEl);
    var zone = jobZone() || "UTC";
    days.forEach(function (day) {
      var when = formatWithWeekday(Date.parse(day.change), zone);
      var label = (day.direction === "forward" ? "Clocks go forward " : "Clocks go back ") + when.split(",").slice(0, 2).join(",") + ": ";
      var fires = day.fires.map(function (iso) { return formatWithWeekday(Date.parse(iso), zone).split(", ").pop(); });
      var text = fires.length ? fires.join(", ") + (day.more ? ", …" : "") : "no fire that day";
      dstEl.appendChild(Sched.el("li", null, [Sched.el("strong", null, label), text]));
    });
    dstEl.hidden = !days.length;
  }

  function preview() {
    clearPreviewErrors();
    if (controller) controller.abort();
    var built = previewParams();
    if (built.wait) {
      descriptionEl.textContent = "—";
      tableEl.hidden = zonesNote.hidden = true;
      renderDstDays([]);
      setState(built.wait);
      return;
    }
    if (built.error) {
      showPreviewError(built.error[0], built.error[1]);
      descriptionEl.textContent = "—";
      tableEl.hidden = zonesNote.hidden = true;
      setState("Fix the highlighted field to see the next fire times.", "error");
      return;
    }
    var mine = ++sequence;
    controller = typeof AbortController === "function" ? new AbortController() : null;
    setState("Computing the next fire times…", "loading");
    fetch(Sched.api("schedule-preview/?" + built.params.toString()), {
      credentials: "same-origin",
      headers: { Accept: "application/json" },
      signal: controller ? controller.signal : undefined,
    })
      .then(function (response) {
        return response.json().then(
          function (body) { return { status: response.status, body: body }; },
          function () { return { status: response.status, body: null }; }
        );
      })
      .then(function (result) {
        if (mine !== sequence) return;
        if (result.status === 200 && result.body) {
          descriptionEl.textContent = result.body.description || "—";
          renderFires(result.body.next_fires || []);
          renderDstDays(result.body.dst_days || []);
          if (!(result.body.next_fires || []).length) setState("This schedule has no fire after now.", "warn");
          else setState("Next " + result.body.next_fires.length + " fire times:");
          return;
        }
        descriptionEl.textContent = "—";
        tableEl.hidden = zonesNote.hidden = true;
        if (result.status === 400 && result.body && typeof result.body === "object") {
          var elsewhere = [];
          Object.keys(result.body).forEach(function (name) {
            var messages = [].concat(result.body[name]).join(" ");
            if (!showPreviewError(name, messages)) elsewhere.push(messages);
          });
          setState(elsewhere.length ? elsewhere.join(" ") : "Fix the highlighted field to see the next fire times.", "error");
        } else if (result.status === 401 || result.status === 403) {
          setState("Your session has ended: sign in again to preview schedules.", "error");
        } else {
          setState("Preview unavailable right now (HTTP " + result.status + "). The schedule is still checked when you save.", "error");
        }
      })
      .catch(function (error) {
        if (error && error.name === "AbortError") return;
        if (mine !== sequence) return;
        setState("Preview unavailable (network error). The schedule is still checked when you save.", "error");
      });
  }

  var schedulePreview = Sched.debounce(preview, PREVIEW_DEBOUNCE_MS);

  // --- wiring ----------------------------------------------------------------------------------
  for (var i = 0; i < typeInputs.length; i++) {
    typeInputs[i].addEventListener("change", function () {
      showPanel();
      preview();
    });
  }
  ["cron_expression", "timezone", "dst_repeated", "dst_missing", "interval_seconds", "start_at", "run_at"].forEach(function (name) {
    var input = field(name);
    if (!input) return;
    input.addEventListener("input", schedulePreview);
    input.addEventListener("change", schedulePreview);
  });
  var chips = form.querySelectorAll("[data-cron]");
  for (var c = 0; c < chips.length; c++) {
    chips[c].addEventListener("click", function (event) {
      var input = field("cron_expression");
      input.value = event.currentTarget.dataset.cron;
      input.focus();
      preview();
    });
  }
  [["args", "list"], ["kwargs", "object"]].forEach(function (pair) {
    var input = field(pair[0]);
    if (!input) return;
    input.addEventListener("input", Sched.debounce(function () { checkJson(pair[0], pair[1]); }, 400));
  });

  // --- what the chosen task takes (jobs.registry.task_catalog, the page's #task-catalog) ---------
  var catalogEl = document.getElementById("task-catalog");
  var catalog = {};
  if (catalogEl) {
    JSON.parse(catalogEl.textContent).forEach(function (entry) { catalog[entry.name] = entry; });
  }
  var help = document.getElementById("task-help");

  function describeParam(p) {
    var text = p.name + " (" + p.type + ")";
    if (p.required) return text + ", required";
    return text + ", default " + JSON.stringify(p.default);
  }

  function showTask() {
    var entry = catalog[field("task").value];
    help.hidden = !entry;
    if (!entry) return;
    help.querySelector("[data-task-description]").textContent = entry.description || "";
    var list = help.querySelector("[data-task-params]");
    Sched.clear(list);
    if (!entry.parameters.length) list.appendChild(Sched.el("li", null, "Takes no arguments."));
    entry.parameters.forEach(function (p) { list.appendChild(Sched.el("li", null, describeParam(p))); });
    var example = entry.example || {};
    var hasExample = (example.args && example.args.length) || (example.kwargs && Object.keys(example.kwargs).length);
    help.querySelector("[data-task-example]").hidden = !hasExample;
  }

  help.querySelector("[data-task-example]").addEventListener("click", function () {
    var example = (catalog[field("task").value] || {}).example || {};
    field("args").value = JSON.stringify(example.args || [], null, 2);
    field("kwargs").value = JSON.stringify(example.kwargs || {}, null, 2);
    checkJson("args", "list");
    checkJson("kwargs", "object");
  });
  field("task").addEventListener("change", showTask);

  localizeDateInputs();
  showPanel();
  showTask();
  preview();
})();

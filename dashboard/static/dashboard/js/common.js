/* Shared helpers of the dashboard: time formatting in the viewer's zone, safe DOM building,
 * status badges, execution table rows. No dependencies; everything hangs off window.Sched.
 *
 * Times: the server renders <time datetime="ISO 8601"> with UTC text; this script rewrites the
 * text into the viewer's time zone and keeps UTC in the title tooltip. data-format="relative"
 * ("in 3 min") and data-format="age" (heartbeat age, "1.2 s") tick every second.
 */
(function () {
  "use strict";

  var Sched = (window.Sched = window.Sched || {});

  // --- addresses ---------------------------------------------------------------------------------
  // Where the dashboard, the API and the sign-in page are mounted (the page says: a project may
  // include them under a prefix of its own). Paths are given without their leading slash.
  function mounted(name, fallback) {
    var value = document.body && document.body.dataset[name];
    return value || fallback;
  }
  Sched.url = function (path) { return mounted("root", "/") + (path || ""); };
  Sched.api = function (path) { return mounted("api", "/api/") + (path || ""); };
  Sched.loginUrl = function () { return mounted("login", "/login/"); };

  // --- clock -----------------------------------------------------------------------------------
  // serverOffsetMs = server clock - browser clock, so ages are measured on the server's clock.
  Sched.serverOffsetMs = 0;
  var body = document.body;
  if (body && body.dataset.serverNow) {
    var rendered = Date.parse(body.dataset.serverNow);
    if (!isNaN(rendered)) Sched.serverOffsetMs = rendered - Date.now();
  }
  Sched.now = function () {
    return Date.now() + Sched.serverOffsetMs;
  };
  Sched.setServerTime = function (serverMs) {
    if (typeof serverMs !== "number" || isNaN(serverMs)) return;
    var offset = serverMs - Date.now();
    // Messages arrive a little after they were stamped: keep the largest recent offset, but follow
    // real clock changes within a few seconds.
    Sched.serverOffsetMs = Math.abs(offset - Sched.serverOffsetMs) > 2000 ? offset : Math.max(offset, Sched.serverOffsetMs - 50);
  };

  Sched.viewerZone = (function () {
    try {
      return Intl.DateTimeFormat().resolvedOptions().timeZone || "UTC";
    } catch (e) {
      return "UTC";
    }
  })();

  // --- which zone times are shown in: the viewer's, or UTC (the header's switch) ------------
  var timeModeKey = function () {
    var button = document.getElementById("time-mode");
    return "sched-time-mode:" + (button ? button.dataset.user : "");
  };
  Sched.timeMode = function () {
    try {
      return localStorage.getItem(timeModeKey()) === "utc" ? "utc" : "local";
    } catch (e) {
      return "local";
    }
  };
  /** The zone times are shown in unless an element names its own (a job's next fire). */
  Sched.displayZone = function () {
    return Sched.timeMode() === "utc" ? "UTC" : Sched.viewerZone;
  };

  // --- formatting ----------------------------------------------------------------------------
  var formatters = {};
  function formatter(zone, withYear) {
    var key = zone + "|" + withYear;
    if (!formatters[key]) {
      // Every time shown says its zone ("Nov 29, 14:03:07 CET", "… UTC").
      var options = { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", second: "2-digit", hourCycle: "h23", timeZoneName: "short" };
      if (withYear) options.year = "numeric";
      if (zone) options.timeZone = zone;
      formatters[key] = new Intl.DateTimeFormat(undefined, options);
    }
    return formatters[key];
  }

  Sched.parseTime = function (value) {
    if (value === null || value === undefined || value === "") return NaN;
    if (typeof value === "number") return value;
    return Date.parse(value);
  };

  /** "Nov 29, 14:03:07 CET" in `zone` (the display zone by default); the year only when not
   *  this year. */
  Sched.formatDateTime = function (ms, zone) {
    if (isNaN(ms)) return "—";
    var withYear = new Date(ms).getFullYear() !== new Date().getFullYear();
    try {
      return formatter(zone || Sched.displayZone(), withYear).format(new Date(ms));
    } catch (e) {
      return formatter(null, withYear).format(new Date(ms)); // unknown zone: fall back
    }
  };

  Sched.formatUTC = function (ms) {
    if (isNaN(ms)) return "";
    return new Date(ms).toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC").replace(/Z$/, " UTC");
  };

  /** 14:03 (or 14:03:07 with seconds) in the display zone. */
  Sched.formatTimeShort = function (ms, withSeconds) {
    var options = { hour: "2-digit", minute: "2-digit", hourCycle: "h23", timeZone: Sched.displayZone() };
    if (withSeconds) options.second = "2-digit";
    try {
      return new Intl.DateTimeFormat(undefined, options).format(new Date(ms));
    } catch (e) {
      return new Date(ms).toTimeString().slice(0, withSeconds ? 8 : 5);
    }
  };

  /** 850 ms, 12.3 s, 4 min 05 s, 2 h 10 min. */
  Sched.formatDuration = function (ms) {
    if (ms === null || ms === undefined || isNaN(ms)) return "—";
    if (Math.abs(ms) < 0.05) return "0 ms";
    var negative = ms < 0;
    ms = Math.abs(ms);
    var text;
    if (ms < 1000) text = (ms < 10 ? ms.toFixed(1) : Math.round(ms)) + " ms";
    else if (ms < 60000) text = (ms / 1000).toFixed(ms < 10000 ? 2 : 1) + " s";
    else if (ms < 3600000) {
      var m = Math.floor(ms / 60000);
      var s = Math.floor((ms % 60000) / 1000);
      text = m + " min " + (s < 10 ? "0" : "") + s + " s";
    } else {
      var h = Math.floor(ms / 3600000);
      var mm = Math.floor((ms % 3600000) / 60000);
      text = h + " h " + mm + " min";
    }
    return (negative ? "−" : "") + text;
  };

  /** Age of a heartbeat: 0.4 s, 12 s, 3 min, 2 h. */
  Sched.formatAge = function (seconds) {
    if (isNaN(seconds)) return "—";
    if (seconds < 0) seconds = 0;
    if (seconds < 10) return seconds.toFixed(1) + " s ago";
    if (seconds < 120) return Math.round(seconds) + " s ago";
    if (seconds < 7200) return Math.round(seconds / 60) + " min ago";
    if (seconds < 172800) return Math.round(seconds / 3600) + " h ago";
    return Math.round(seconds / 86400) + " days ago";
  };

  var relativeFormat = null;
  try {
    relativeFormat = new Intl.RelativeTimeFormat(undefined, { numeric: "auto" });
  } catch (e) {
    relativeFormat = null;
  }
  Sched.formatRelative = function (ms) {
    if (isNaN(ms)) return "—";
    var diff = (ms - Sched.now()) / 1000;
    var abs = Math.abs(diff);
    var unit, value;
    if (abs < 1) return diff >= 0 ? "now" : "just now";
    if (abs < 60) { unit = "second"; value = Math.round(diff); }
    else if (abs < 3600) { unit = "minute"; value = Math.round(diff / 60); }
    else if (abs < 86400) { unit = "hour"; value = Math.round(diff / 3600); }
    else { unit = "day"; value = Math.round(diff / 86400); }
    if (relativeFormat) return relativeFormat.format(value, unit);
    return value >= 0 ? "in " + value + " " + unit + "s" : -value + " " + unit + "s ago";
  };

  // --- <time> elements ----------------------------------------------------------------------
  function renderTime(el) {
    var ms = Sched.parseTime(el.getAttribute("datetime"));
    if (isNaN(ms)) return;
    var format = el.dataset.format || "datetime";
    if (format === "age") {
      var age = (Sched.now() - ms) / 1000;
      el.textContent = Sched.formatAge(age);
      var thresholds = Sched.livenessThresholds(el);
      el.classList.toggle("age--late", age >= thresholds.late_s && age < thresholds.dead_s);
      el.classList.toggle("age--dead", age >= thresholds.dead_s);
    } else if (format === "relative") {
      el.textContent = Sched.formatRelative(ms);
    } else {
      el.textContent = Sched.formatDateTime(ms, el.dataset.zone || null);
    }
    if (!el.dataset.localized) {
      // The hover gives the other readings: the viewer's zone (when not shown) and UTC.
      var parts = [];
      if (format !== "datetime" || el.dataset.zone) parts.push(Sched.formatDateTime(ms) + " (" + Sched.displayZone() + ")");
      parts.push(Sched.formatUTC(ms));
      el.title = parts.join(" · ");
      el.dataset.localized = "1";
    }
  }
  Sched.renderTime = renderTime;

  Sched.localizeTimes = function (root) {
    var nodes = (root || document).querySelectorAll("time[datetime]");
    for (var i = 0; i < nodes.length; i++) renderTime(nodes[i]);
  };

  Sched.tickTimes = function () {
    var nodes = document.querySelectorAll('time[data-format="relative"], time[data-format="age"]');
    for (var i = 0; i < nodes.length; i++) renderTime(nodes[i]);
  };

  var thresholdsCache = null;
  /** When a heartbeat age is late, then presumed dead: the node's own timing when the element
   * carries it (data-heartbeat-s, data-dead-s: a node may run with other settings than this web
   * process's), else the page's. */
  Sched.livenessThresholds = function (el) {
    if (!thresholdsCache) thresholdsCache = Sched.readJSON("liveness-thresholds") || { late_s: 2, dead_s: 5 };
    var heartbeat = el ? Number(el.dataset.heartbeatS) : NaN;
    var dead = el ? Number(el.dataset.deadS) : NaN;
    if (heartbeat > 0 && dead > 0) return { late_s: 2 * heartbeat, dead_s: dead };
    return thresholdsCache;
  };

  /** The heartbeat age of a node, judged by the node's own timing. */
  Sched.heartbeatEl = function (node) {
    var el = Sched.timeEl(node.last_heartbeat, "age");
    if (el.tagName === "TIME") {
      if (node.heartbeat_interval_s) el.dataset.heartbeatS = String(node.heartbeat_interval_s);
      if (node.dead_after_s) el.dataset.deadS = String(node.dead_after_s);
      renderTime(el);
    }
    return el;
  };

  /** A <time> element for an ISO value (or an em dash when there is none). */
  Sched.timeEl = function (iso, format) {
    if (!iso) return Sched.el("span", { class: "muted" }, "—");
    var el = Sched.el("time", { datetime: iso });
    if (format) el.dataset.format = format;
    renderTime(el);
    return el;
  };

  Sched.durationEl = function (ms) {
    if (ms === null || ms === undefined) return Sched.el("span", { class: "muted" }, "—");
    var el = Sched.el("span", { class: "duration", "data-ms": String(ms) }, Sched.formatDuration(Number(ms)));
    el.dataset.localized = "1";
    return el;
  };

  function renderDurations(root) {
    var nodes = (root || document).querySelectorAll(".duration[data-ms]:not([data-localized])");
    for (var i = 0; i < nodes.length; i++) {
      nodes[i].textContent = Sched.formatDuration(parseFloat(nodes[i].dataset.ms));
      nodes[i].dataset.localized = "1";
    }
  }
  Sched.renderDurations = renderDurations;

  // --- DOM ------------------------------------------------------------------------------------
  /** el("a", {href: "/x", class: "y"}, "text" | Node | [children]) — text is never parsed as HTML. */
  Sched.el = function (tag, attrs, children) {
    var node = document.createElement(tag);
    if (attrs) {
      for (var key in attrs) {
        if (!Object.prototype.hasOwnProperty.call(attrs, key)) continue;
        var value = attrs[key];
        if (value === null || value === undefined || value === false) continue;
        if (key === "class") node.className = value;
        else if (key === "style") setStyle(node, value);
        else if (key === "text") node.textContent = value;
        else if (key === "hidden") node.hidden = Boolean(value);
        else node.setAttribute(key, value === true ? "" : String(value));
      }
    }
    append(node, children);
    return node;
  };
  // Styles go through the CSS object model, never a style attribute: the Content-Security-Policy
  // (style-src 'self') refuses inline style attributes, not properties set from script.
  function setStyle(node, properties) {
    for (var name in properties) {
      if (Object.prototype.hasOwnProperty.call(properties, name)) node.style.setProperty(name, properties[name]);
    }
  }

  /** Meters rendered by the server carry their fill in data-fill (a percentage). */
  function renderMeters(root) {
    var fills = (root || document).querySelectorAll(".meter__fill[data-fill]");
    for (var i = 0; i < fills.length; i++) {
      var percent = Math.max(0, Math.min(100, Number(fills[i].getAttribute("data-fill")) || 0));
      fills[i].style.setProperty("width", percent + "%");
    }
  }
  Sched.renderMeters = renderMeters;

  function append(node, children) {
    if (children === null || children === undefined || children === false) return;
    if (Array.isArray(children)) {
      for (var i = 0; i < children.length; i++) append(node, children[i]);
    } else if (children instanceof Node) {
      node.appendChild(children);
    } else {
      node.appendChild(document.createTextNode(String(children)));
    }
  }
  Sched.clear = function (node) {
    while (node.firstChild) node.removeChild(node.firstChild);
  };

  Sched.readJSON = function (id) {
    var node = document.getElementById(id);
    if (!node) return null;
    try {
      return JSON.parse(node.textContent);
    } catch (e) {
      return null;
    }
  };

  Sched.debounce = function (fn, waitMs) {
    var timer = null;
    return function () {
      var args = arguments, self = this;
      clearTimeout(timer);
      timer = setTimeout(function () { fn.apply(self, args); }, waitMs);
    };
  };

  var announcer = null;
  Sched.announce = function (message) {
    announcer = announcer || document.getElementById("live-announcer");
    if (!announcer) return;
    announcer.textContent = "";
    setTimeout(function () { announcer.textContent = message; }, 50);
  };

  Sched.flash = function (node) {
    node.classList.remove("flash");
    void node.offsetWidth; // restart the animation
    node.classList.add("flash");
  };

  Sched.csrfToken = function () {
    var input = document.querySelector('input[name="csrfmiddlewaretoken"]');
    if (input) return input.value;
    var match = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]+)/);
    return match ? decodeURIComponent(match[1]) : "";
  };

  // --- statuses -------------------------------------------------------------------------------
  Sched.STATUS_LABELS = {
    pending: "Pending",
    running: "Running",
    succeeded: "Succeeded",
    failed: "Failed",
    timed_out: "Timed out",
    cancelled: "Cancelled",
    lost: "Lost",
    retry_scheduled: "Retry scheduled",
    skipped: "Skipped",
  };
  Sched.TERMINAL = ["succeeded", "failed", "timed_out", "cancelled", "lost", "skipped"];
  Sched.TRIGGER_LABELS = { schedule: "Schedule", manual: "Manual", retry: "Retry", api: "API" };

  Sched.statusBadge = function (status) {
    return Sched.el("span", { class: "badge badge--" + status, "data-status": status }, Sched.STATUS_LABELS[status] || status);
  };

  // node_id -> primary key, for links to node pages; kept fresh by the live "cluster" message.
  Sched.nodeMap = Sched.readJSON("node-map") || {};
  Sched.nodeLink = function (nodeId) {
    if (!nodeId) return Sched.el("span", { class: "muted" }, "—");
    var pk = Sched.nodeMap[nodeId];
    return pk ? Sched.el("a", { href: Sched.url("nodes/" + pk + "/") }, nodeId) : document.createTextNode(nodeId);
  };

  // --- execution table rows (the same cells as templates/partials/execution_row.html) --------
  var CELLS = {
    select: function (e) {
      return Sched.el("input", { type: "checkbox", name: "ids", value: String(e.id), form: "bulk-executions", "aria-label": "Select run " + e.id });
    },
    id: function (e) { return Sched.el("a", { href: Sched.url("executions/" + e.id + "/"), "aria-label": "Execution " + e.id }, "#" + e.id); },
    job: function (e) { return Sched.el("a", { href: Sched.url("jobs/" + e.job + "/") }, e.job_name || "job " + e.job); },
    scheduled_for: function (e) { return Sched.timeEl(e.scheduled_for); },
    attempt: function (e) { return String(e.attempt); },
    trigger: function (e) { return Sched.el("span", { class: "tag" }, Sched.TRIGGER_LABELS[e.trigger] || e.trigger); },
    status: function (e) {
      var parts = [Sched.statusBadge(e.status)];
      if (e.cancel_requested && e.status === "running") parts.push(" ", Sched.el("span", { class: "tag tag--warn" }, "cancelling"));
      return parts;
    },
    node: function (e) { return Sched.nodeLink(e.node); },
    started_at: function (e) { return Sched.timeEl(e.started_at); },
    duration: function (e) { return Sched.durationEl(e.duration_ms); },
    lag: function (e) { return Sched.durationEl(e.lag_ms); },
  };
  var NUMERIC = { attempt: true, duration: true, lag: true };
  var STATIC_COLUMNS = { select: true, id: true, job: true, scheduled_for: true, attempt: true, trigger: true };
  // What each cell depends on: a cell is rebuilt only when this changes (keeps focus and selection).
  var SIGNATURE = {
    select: function () { return ""; },
    id: function () { return ""; },
    job: function (e) { return e.job_name; },
    scheduled_for: function (e) { return e.scheduled_for; },
    attempt: function (e) { return e.attempt; },
    trigger: function (e) { return e.trigger; },
    status: function (e) { return e.status + (e.cancel_requested ? "!" : ""); },
    node: function (e) { return e.node + "|" + (Sched.nodeMap[e.node] || ""); },
    started_at: function (e) { return e.started_at; },
    duration: function (e) { return e.duration_ms; },
    lag: function (e) { return e.lag_ms; },
  };

  Sched.executionRow = function (e, columns) {
    var tr = Sched.el("tr", { "data-execution-id": e.id, "data-status": e.status });
    columns.forEach(function (col) {
      var td = Sched.el("td", { "data-col": col, class: NUMERIC[col] ? "num" : null }, CELLS[col](e));
      td.dataset.sig = String(SIGNATURE[col](e));
      tr.appendChild(td);
    });
    return tr;
  };

  /** Update a row in place; returns true when something visible changed. */
  Sched.updateExecutionRow = function (tr, e, columns) {
    var changed = false;
    columns.forEach(function (col) {
      var td = tr.querySelector('td[data-col="' + col + '"]');
      if (!td) return;
      var sig = String(SIGNATURE[col](e));
      if (td.dataset.sig === sig) return;
      if (td.dataset.sig === undefined && STATIC_COLUMNS[col]) {
        td.dataset.sig = sig; // rendered by the server and never changes
        return;
      }
      Sched.clear(td);
      append(td, CELLS[col](e));
      td.dataset.sig = sig;
      changed = true;
    });
    tr.dataset.status = e.status;
    return changed;
  };

  /**
   * A table of executions that follows the "executions" live message.
   * options.accept(e) -> whether a new execution belongs in this table; options.prepend (bool).
   */
  Sched.LiveExecutionTable = function (table, options) {
    this.table = table;
    this.tbody = table.tBodies[0];
    this.columns = (table.dataset.columns || "").split(",");
    this.maxRows = parseInt(table.dataset.maxRows || "200", 10);
    this.prepend = options && options.prepend !== undefined ? options.prepend : table.dataset.prepend === "true";
    this.accept = (options && options.accept) || function () { return true; };
    this.empty = document.querySelector('[data-empty-for="' + table.id + '"]');
    var ids = Array.prototype.map.call(this.tbody.rows, function (r) { return parseInt(r.dataset.executionId, 10); });
    this.maxId = ids.length ? Math.max.apply(null, ids) : 0;
  };
  Sched.LiveExecutionTable.prototype.apply = function (executions) {
    var self = this;
    var added = 0;
    executions.forEach(function (e) {
      var row = self.tbody.querySelector('tr[data-execution-id="' + e.id + '"]');
      if (row) {
        if (Sched.updateExecutionRow(row, e, self.columns)) Sched.flash(row);
        return;
      }
      if (!self.prepend || e.id <= self.maxId || !self.accept(e)) return;
      // Newest first: insert before the first row with a smaller id.
      var fresh = Sched.executionRow(e, self.columns);
      var before = null;
      for (var i = 0; i < self.tbody.rows.length; i++) {
        if (parseInt(self.tbody.rows[i].dataset.executionId, 10) < e.id) { before = self.tbody.rows[i]; break; }
      }
      self.tbody.insertBefore(fresh, before);
      fresh.classList.add("row--new");
      added += 1;
    });
    if (added) {
      this.maxId = Math.max.apply(null, Array.prototype.map.call(this.tbody.rows, function (r) { return parseInt(r.dataset.executionId, 10); }));
      while (this.tbody.rows.length > this.maxRows) this.tbody.deleteRow(this.tbody.rows.length - 1);
      this.table.hidden = false;
      if (this.empty) this.empty.hidden = true;
    }
    return added;
  };

  /** Fill in executions changed while the WebSocket was down, from the REST API. */
  Sched.fetchExecutionsSince = function (sinceIso, params) {
    var query = new URLSearchParams(params || {});
    query.set("updated_after", sinceIso);
    query.set("page_size", "200");
    query.set("ordering", "created_at");
    return fetch(Sched.api("executions/?" + query.toString()), { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (response) {
        if (!response.ok) throw new Error("HTTP " + response.status);
        return response.json();
      })
      .then(function (data) { return data.results || []; });
  };

  // --- forms ----------------------------------------------------------------------------------
  function setupConfirmations() {
    document.addEventListener("submit", function (event) {
      var form = event.target;
      // The question is the form's, or the pressed button's (a bulk bar's Delete or Cancel).
      var button = event.submitter;
      var question = (button && button.dataset && button.dataset.confirm) || (form && form.dataset && form.dataset.confirm);
      if (question && !window.confirm(question)) event.preventDefault();
    });
  }

  /** Filter forms with datetime-local inputs send the viewer's time zone along. */
  function setupTimezoneInputs() {
    var inputs = document.querySelectorAll("input[data-viewer-tz]");
    for (var i = 0; i < inputs.length; i++) inputs[i].value = Sched.viewerZone;
  }

  /** Filter forms marked data-instant apply themselves: a choice at once, typed text after a
   *  pause (the cursor goes back into the box once the page has reloaded). Apply stays, for a
   *  browser without script. */
  var REFOCUS_KEY = "sched-refocus-search";
  var SEARCH_PAUSE_MS = 500;

  function setupInstantFilters() {
    var forms = document.querySelectorAll("form[data-instant]");
    for (var i = 0; i < forms.length; i++) instantFilter(forms[i]);
  }

  function instantFilter(form) {
    var action = form.getAttribute("action") || location.pathname;
    var timer = null;
    function apply(fromTyping) {
      try {
        if (fromTyping) sessionStorage.setItem(REFOCUS_KEY, action);
      } catch (e) { /* storage off: the cursor just stays where the page puts it */ }
      if (form.requestSubmit) form.requestSubmit();
      else form.submit();
    }
    form.addEventListener("change", function (event) {
      if (event.target.type !== "search") apply(false);
    });
    form.addEventListener("input", function (event) {
      if (event.target.type !== "search") return;
      clearTimeout(timer);
      timer = setTimeout(function () { apply(true); }, SEARCH_PAUSE_MS);
    });
    form.addEventListener("submit", function () { clearTimeout(timer); });
    try {
      if (sessionStorage.getItem(REFOCUS_KEY) === action) {
        sessionStorage.removeItem(REFOCUS_KEY);
        var box = form.querySelector('input[type="search"]');
        if (box) {
          box.focus();
          box.setSelectionRange(box.value.length, box.value.length);
        }
      }
    } catch (e) { /* as above */ }
  }

  /** Bulk bars (form[data-bulk]): shown while rows are selected, with how many; a header box
   *  selects every row shown. The checkboxes belong to the form through their form attribute. */
  function setupBulkBars() {
    var bars = document.querySelectorAll("form[data-bulk]");
    for (var i = 0; i < bars.length; i++) bulkBar(bars[i]);
  }

  function bulkBar(bar) {
    var boxes = function () {
      return document.querySelectorAll('input[type="checkbox"][name="ids"][form="' + bar.id + '"]');
    };
    var all = document.querySelector('input[data-select-all="' + bar.id + '"]');
    var count = bar.querySelector("[data-bulk-count]");
    function refresh() {
      var list = boxes();
      var n = 0;
      for (var i = 0; i < list.length; i++) if (list[i].checked) n++;
      bar.hidden = n === 0;
      count.textContent = n + " selected";
      if (all) {
        all.checked = n > 0 && n === list.length;
        all.indeterminate = n > 0 && n < list.length;
      }
    }
    document.addEventListener("change", function (event) {
      var target = event.target;
      if (target === all) {
        var list = boxes();
        for (var i = 0; i < list.length; i++) list[i].checked = all.checked;
      }
      if (target === all || (target.name === "ids" && target.getAttribute("form") === bar.id)) refresh();
    });
    refresh();
  }

  /** The header's switch between local time and UTC, remembered per user (in this browser). */
  function setupTimeMode() {
    var button = document.getElementById("time-mode");
    if (!button) return;
    function show() {
      var utc = Sched.timeMode() === "utc";
      button.textContent = utc ? "UTC" : "Local time";
      button.setAttribute("aria-pressed", utc ? "true" : "false");
      button.title = utc ? "Times are in UTC; switch to your time zone (" + Sched.viewerZone + ")" : "Times are in your time zone (" + Sched.viewerZone + "); switch to UTC";
    }
    button.addEventListener("click", function () {
      try {
        localStorage.setItem(timeModeKey(), Sched.timeMode() === "utc" ? "local" : "utc");
      } catch (e) { /* storage off: nothing to remember it in */ }
      show();
      var nodes = document.querySelectorAll("time[datetime]");
      for (var i = 0; i < nodes.length; i++) delete nodes[i].dataset.localized;
      Sched.localizeTimes(document);
      document.dispatchEvent(new CustomEvent("sched:timemode"));
    });
    show();
  }

  function start() {
    setupTimeMode();
    Sched.localizeTimes(document);
    renderDurations(document);
    renderMeters(document);
    setupConfirmations();
    setupTimezoneInputs();
    setupInstantFilters();
    setupBulkBars();
    setInterval(Sched.tickTimes, 1000);
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();

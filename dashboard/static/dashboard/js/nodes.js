/* The node list and node detail pages, kept current from the live "cluster" message (and the
 * node's executions from "executions").
 */
(function () {
  "use strict";

  var Sched = window.Sched;
  var el = Sched.el;
  var page = document.body.dataset.page;

  function meter(node) {
    var capacity = node.capacity || 0;
    var percent = capacity ? Math.min(100, Math.round((100 * node.running_count) / capacity)) : 0;
    return [
      el("span", { class: "meter", role: "img", "aria-label": node.running_count + " of " + capacity + " slots busy" }, el("span", { class: "meter__fill", style: { width: percent + "%" } })),
      " " + node.running_count + " / " + capacity,
    ];
  }

  function statusCell(node) {
    var parts = [el("span", { class: "badge badge--node-" + node.status, title: node.degraded_reason || null }, node.status)];
    if (node.drain_requested && node.status === "active") parts.push(" ", el("span", { class: "tag tag--warn" }, "drain requested"));
    return parts;
  }

  // A POST form for one node action (drain, forget), confirmed before it is sent.
  function actionForm(node, action, confirm, label, small, next) {
    var fields = [el("input", { type: "hidden", name: "csrfmiddlewaretoken", value: Sched.csrfToken() })];
    if (next) fields.push(el("input", { type: "hidden", name: "next", value: next }));
    fields.push(el("button", { type: "submit", class: "btn btn--secondary" + (small ? " btn--small" : "") }, label));
    return el("form", {
      method: "post",
      action: Sched.url("nodes/" + node.id + "/" + action + "/"),
      class: "inline-form",
      "data-action": action,
      "data-confirm": confirm,
    }, fields);
  }

  function drainForm(node, next, label, small) {
    return actionForm(node, "drain",
      "Drain " + node.node_id + "? It stops claiming work, hands over leadership and finishes what it runs.",
      label, small, next);
  }

  function gone(node) {
    return node.status === "dead" || node.status === "stopped";
  }

  function forgetForm(node, label, small) {
    return actionForm(node, "forget",
      "Remove " + node.node_id + " from the list? Its runs and terms keep their history; if it comes back it registers again.",
      label, small, null);
  }

  function summary(data) {
    var node = document.getElementById("cluster-summary");
    if (!node) return;
    Sched.clear(node);
    if (data.leader) node.append("Leader ", el("strong", null, data.leader), " · term " + data.term);
    else node.append(el("span", { class: "text-warn" }, "No leader right now"));
  }

  // --- list ------------------------------------------------------------------------------------
  function setupList() {
    var table = document.getElementById("node-table");
    var tbody = table.tBodies[0];
    var canOperate = table.dataset.canOperate === "true";
    var empty = document.querySelector('[data-empty-for="node-table"]');

    function render(data) {
      summary(data);
      var focused = document.activeElement && tbody.contains(document.activeElement) ? document.activeElement.closest("tr") : null;
      var focusedPk = focused ? focused.dataset.nodePk : null;
      Sched.clear(tbody);
      data.nodes.forEach(function (node) {
        var name = [el("a", { href: Sched.url("nodes/" + node.id + "/"), class: "strong" }, node.node_id)];
        if (node.node_id === data.leader) name.push(" ", el("span", { class: "leader-badge" }, "★ Leader · term " + data.term));
        var cells = [
          el("td", null, name),
          el("td", null, statusCell(node)),
          el("td", null, Sched.heartbeatEl(node)),
          el("td", { class: "nowrap" }, meter(node)),
          el("td", null, (node.queues || []).length ? node.queues.map(function (q) { return [el("code", { class: "tag" }, q), " "]; }) : el("span", { class: "muted" }, "—")),
          el("td", null, [node.hostname + " ", el("span", { class: "muted" }, "· pid " + node.pid)]),
          el("td", null, Sched.timeEl(node.started_at, "relative")),
        ];
        if (canOperate) {
          var action = null;
          if (node.status === "active" && !node.drain_requested) action = drainForm(node, Sched.url("nodes/"), "Drain", true);
          else if (gone(node)) action = forgetForm(node, "Remove", true);
          cells.push(el("td", null, action));
        }
        tbody.appendChild(el("tr", { "data-node-pk": node.id }, cells));
      });
      table.hidden = !data.nodes.length;
      if (empty) empty.hidden = Boolean(data.nodes.length);
      if (focusedPk) {
        // Keep keyboard focus on the same node's row after a redraw.
        var link = tbody.querySelector('tr[data-node-pk="' + focusedPk + '"] a, tr[data-node-pk="' + focusedPk + '"] button');
        if (link) link.focus();
      }
    }

    Sched.live.on("cluster", render);
  }

  // --- detail ----------------------------------------------------------------------------------
  function setupDetail() {
    var header = document.getElementById("node-header");
    var pk = parseInt(header.dataset.nodePk, 10);
    var nodeData = Sched.readJSON("node-data");
    var executionsTable = document.getElementById("node-executions");
    var table = new Sched.LiveExecutionTable(executionsTable, {
      accept: function (e) { return e.node === nodeData.node_id; },
    });

    function render(data) {
      var node = null;
      data.nodes.forEach(function (n) { if (n.id === pk) node = n; });
      if (!node) return;
      var statusHolder = header.querySelector('[data-field="status"]');
      Sched.clear(statusHolder);
      statusHolder.appendChild(el("span", { class: "badge badge--node-" + node.status, title: node.degraded_reason || null }, node.status));
      var leader = header.querySelector('[data-field="leader"]');
      Sched.clear(leader);
      if (data.leader === node.node_id) leader.appendChild(el("span", { class: "leader-badge" }, "★ Leader · term " + data.term));
      var heartbeat = document.querySelector('[data-field="last_heartbeat"]');
      Sched.clear(heartbeat);
      heartbeat.appendChild(Sched.heartbeatEl(node));
      var running = document.querySelector('[data-field="running"]');
      Sched.clear(running);
      meter(node).forEach(function (part) { running.append(part); });
      var drain = document.querySelector('form[data-action="drain"]');
      if (drain) drain.hidden = !(node.status === "active" && !node.drain_requested);
      var forget = document.querySelector('form[data-action="forget"]');
      if (forget) forget.hidden = !gone(node);
      var note = document.querySelector('[data-field="drain-note"]');
      if (note) note.hidden = !(node.drain_requested && node.status === "active");
    }

    Sched.live.on("cluster", render);
    Sched.live.on("executions", function (rows) {
      table.apply(rows.filter(function (e) { return e.node === nodeData.node_id; }));
    });
    Sched.live.on("open", function (info) {
      if (!info.reconnected) return;
      Sched.fetchExecutionsSince(info.sinceIso, { node: nodeData.node_id }).then(function (rows) { table.apply(rows); }).catch(function () {});
    });
  }

  if (page === "node-list") setupList();
  else if (page === "node-detail") setupDetail();
})();

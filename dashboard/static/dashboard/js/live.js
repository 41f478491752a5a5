/* The dashboard's WebSocket client (docs/live-protocol.md).
 *
 *   Sched.live.on(type, handler)        handler(data, message) for "cluster", "executions", "jobs",
 *                                       "jobs_deleted", "counts", "execution_output", "hello", "pong";
 *                                       and the pseudo-type "open" with {reconnected, sinceIso}, sent
 *                                       after each (re)connect so a page can fill the gap it missed.
 *   Sched.live.subscribeExecution(id)   stream that execution's output (re-sent after reconnects).
 *
 * Reconnects with exponential backoff and jitter (1 s .. 30 s); a close with 4401 (signed out) or
 * 4403 (no role any more) is final. A ping every 20 s; silence for 50 s counts as a dead link.
 */
(function () {
  "use strict";

  var Sched = (window.Sched = window.Sched || {});
  var BACKOFF_FIRST_MS = 1000;
  var BACKOFF_MAX_MS = 30000;
  var PING_EVERY_MS = 20000;
  var SILENCE_LIMIT_MS = 50000;
  var BANNER_DELAY_MS = 1500; // a blip shorter than this shows no banner
  var CLOSE_UNAUTHENTICATED = 4401;
  var CLOSE_FORBIDDEN = 4403;

  var handlers = {};
  var subscriptions = {};
  var socket = null;
  var attempts = 0;
  var everConnected = false;
  var stopped = false;
  var reconnectTimer = null;
  var pingTimer = null;
  var bannerTimer = null;
  var countdownTimer = null;
  var lastMessageAt = 0;
  var reconnectAt = 0;
  // Server time of the newest state we have: the page render, then each message's "ts".
  var syncedAtMs = NaN;

  function emit(type, data, message) {
    (handlers[type] || []).forEach(function (fn) {
      try {
        fn(data, message);
      } catch (error) {
        // One faulty handler must not stop the others (nor the socket).
        if (window.console) console.error("live handler for " + type + " failed", error);
      }
    });
  }

  function url() {
    var scheme = window.location.protocol === "https:" ? "wss:" : "ws:";
    return scheme + "//" + window.location.host + Sched.url("ws/dashboard/");
  }

  // --- status indicator and banner -------------------------------------------------------------
  function setState(state, text) {
    var indicator = document.getElementById("live-indicator");
    if (indicator) {
      indicator.dataset.state = state;
      var label = indicator.querySelector(".live-indicator__text");
      if (label) label.textContent = text;
    }
  }

  function banner(text, showRetry) {
    var node = document.getElementById("connection-banner");
    if (!node) return;
    if (text === null) {
      node.hidden = true;
      return;
    }
    document.getElementById("connection-banner-text").textContent = text;
    document.getElementById("connection-retry").hidden = !showRetry;
    node.hidden = false;
  }

  function showReconnectBanner() {
    clearInterval(countdownTimer);
    function render() {
      var seconds = Math.max(0, Math.ceil((reconnectAt - Date.now()) / 1000));
      banner(
        "Live updates are disconnected; what you see may be out of date. " +
          (seconds > 0 ? "Reconnecting in " + seconds + " s…" : "Reconnecting…"),
        true
      );
    }
    render();
    countdownTimer = setInterval(render, 1000);
  }

  // --- connection -------------------------------------------------------------------------------
  function connect() {
    if (stopped) return;
    clearTimeout(reconnectTimer);
    setState("connecting", everConnected ? "Reconnecting…" : "Connecting…");
    try {
      socket = new WebSocket(url());
    } catch (error) {
      scheduleReconnect();
      return;
    }
    socket.onopen = onOpen;
    socket.onmessage = onMessage;
    socket.onclose = onClose;
    // onerror is always followed by onclose, which handles it.
    socket.onerror = function () {};
  }

  function onOpen() {
    var reconnected = everConnected;
    everConnected = true;
    attempts = 0;
    lastMessageAt = Date.now();
    clearTimeout(bannerTimer);
    clearInterval(countdownTimer);
    banner(null);
    setState("live", "Live");
    Object.keys(subscriptions).forEach(function (id) {
      send({ subscribe_execution: Number(id) });
    });
    clearInterval(pingTimer);
    pingTimer = setInterval(keepAlive, PING_EVERY_MS);
    var since = isNaN(syncedAtMs) ? Sched.now() : syncedAtMs;
    // A second of slack: rows stamped just before our last message may have been sent after it.
    emit("open", { reconnected: reconnected, sinceIso: new Date(since - 1000).toISOString() });
    if (reconnected) Sched.announce("Live updates reconnected.");
  }

  function onMessage(event) {
    lastMessageAt = Date.now();
    var message;
    try {
      message = JSON.parse(event.data);
    } catch (error) {
      return; // not ours
    }
    if (!message || typeof message.type !== "string") return;
    if (typeof message.ts === "number") {
      Sched.setServerTime(message.ts * 1000);
      syncedAtMs = Math.max(isNaN(syncedAtMs) ? 0 : syncedAtMs, message.ts * 1000);
    }
    if (message.type === "hello" && message.data && message.data.server_time) {
      Sched.setServerTime(Date.parse(message.data.server_time));
    }
    if (message.type === "cluster" && message.data && Array.isArray(message.data.nodes)) {
      message.data.nodes.forEach(function (node) {
        Sched.nodeMap[node.node_id] = node.id;
      });
    }
    emit(message.type, message.data, message);
  }

  function onClose(event) {
    clearInterval(pingTimer);
    socket = null;
    if (event.code === CLOSE_UNAUTHENTICATED) {
      stopped = true;
      setState("offline", "Signed out");
      banner("Your session has ended, so live updates stopped. Sign in again to continue.", false);
      var text = document.getElementById("connection-banner-text");
      if (text) {
        text.appendChild(document.createTextNode(" "));
        text.appendChild(Sched.el("a", { href: Sched.loginUrl() + "?next=" + encodeURIComponent(location.pathname + location.search) }, "Sign in"));
      }
      return;
    }
    if (event.code === CLOSE_FORBIDDEN) {
      stopped = true;
      setState("offline", "No access");
      banner("Your account no longer has a role on this scheduler, so live updates stopped.", false);
      return;
    }
    setState("offline", "Offline");
    scheduleReconnect();
  }

  function scheduleReconnect() {
    if (stopped) return;
    var base = Math.min(BACKOFF_MAX_MS, BACKOFF_FIRST_MS * Math.pow(2, attempts));
    var delay = Math.round(base * (0.5 + Math.random() * 0.5));
    attempts += 1;
    reconnectAt = Date.now() + delay;
    clearTimeout(reconnectTimer);
    reconnectTimer = setTimeout(connect, delay);
    clearTimeout(bannerTimer);
    bannerTimer = setTimeout(showReconnectBanner, everConnected ? BANNER_DELAY_MS : 0);
  }

  function keepAlive() {
    if (!socket || socket.readyState !== WebSocket.OPEN) return;
    if (Date.now() - lastMessageAt > SILENCE_LIMIT_MS) {
      socket.close(); // half-open link: close and let onclose reconnect
      return;
    }
    send({ ping: Date.now() });
  }

  function send(payload) {
    if (socket && socket.readyState === WebSocket.OPEN) {
      socket.send(JSON.stringify(payload));
      return true;
    }
    return false;
  }

  Sched.live = {
    on: function (type, handler) {
      (handlers[type] = handlers[type] || []).push(handler);
    },
    send: send,
    subscribeExecution: function (id) {
      subscriptions[id] = true;
      send({ subscribe_execution: Number(id) });
    },
    unsubscribeExecution: function (id) {
      delete subscriptions[id];
      send({ unsubscribe_execution: Number(id) });
    },
    reconnectNow: function () {
      if (stopped) return;
      attempts = 0;
      if (socket) socket.close();
      else connect();
    },
  };

  function start() {
    if (document.body.dataset.live !== "on" || !("WebSocket" in window)) {
      setState("offline", "Live off");
      return;
    }
    var rendered = Date.parse(document.body.dataset.serverNow || "");
    syncedAtMs = isNaN(rendered) ? NaN : rendered;
    var retry = document.getElementById("connection-retry");
    if (retry) retry.addEventListener("click", Sched.live.reconnectNow);
    connect();
  }

  // DOMContentLoaded fires after every deferred script ran, so the page scripts have registered
  // their handlers before the first message can arrive.
  if (document.readyState === "complete") start();
  else document.addEventListener("DOMContentLoaded", start);
})();

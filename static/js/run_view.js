/* Live run view: websocket state + plotly step graph + accessible node list + step inspector.
 *
 * Protocol: on connect the server sends a `snapshot` (run, steps, decisions, last_seq); after a
 * drop we reconnect with ?after=<last_seq> and receive only what we missed. Every event carries
 * a per-run `seq`; anything at or below the last applied seq is ignored, so nothing is applied
 * twice. All model text is inserted with textContent (never innerHTML): it is untrusted.
 */
(function () {
  "use strict";

  var COLOURS = {
    pending: "#9aa6ba", running: "#2f6fde", succeeded: "#1f9d55", failed: "#d64545",
    timed_out: "#d98b00", skipped: "#c9b458", blocked: "#8e2b2b"
  };
  var TERMINAL = ["succeeded", "failed", "blocked", "cancelled", "timed_out"];
  var BAND = 6; // x units per recursion round: depth 0..4 fits, so rounds never overlap

  function el(tag, attrs, text) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) { node.setAttribute(k, attrs[k]); });
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function fmtCost(v) {
    if (v === null || v === undefined || v === "") return "—";
    var n = Number(v);
    return isNaN(n) ? String(v) : "$" + n.toFixed(n < 0.01 ? 6 : 4);
  }

  function RunView(root) {
    this.root = root;
    this.runId = root.getAttribute("data-run-id");
    this.replayUrl = root.getAttribute("data-replay-url") || "";
    this.snapshotUrl = root.getAttribute("data-snapshot-url") || "";
    this.failedOpens = 0; // websocket handshakes in a row that never opened
    this.polling = null;  // interval id while following the run over HTTP
    this.run = null;
    this.steps = {};      // index -> step dict
    this.decisions = [];  // guardrail / plan events
    this.lastSeq = 0;
    this.retry = 0;
    this.selected = null;
    this.q = function (role) { return root.querySelector("[data-role=" + role + "]"); };
    var self = this;
    this.connect();
    this.timer = window.setInterval(function () { self.renderStatus(); }, 500);
  }

  RunView.prototype.isTerminal = function () {
    return !!(this.run && TERMINAL.indexOf(this.run.status) >= 0);
  };

  // A held answer stays connected: the server sends a fresh snapshot when a reviewer decides.
  RunView.prototype.isDone = function () {
    return this.isTerminal() && !(this.run && this.run.answer_held);
  };

  var WITHHELD = "(withheld: this run's answer is held for review until a reviewer releases it)";

  RunView.prototype.connect = function () {
    var self = this;
    var proto = window.location.protocol === "https:" ? "wss" : "ws";
    var after = this.run ? "?after=" + this.lastSeq : "";
    var ws = new WebSocket(proto + "://" + window.location.host + "/ws/runs/" + this.runId + "/" + after);
    this.ws = ws;
    var opened = false;
    ws.onopen = function () {
      opened = true;
      self.retry = 0;
      self.failedOpens = 0;
      self.stopPolling();
      self.root.setAttribute("data-live", "websocket");
      self.root.setAttribute("data-connected", "true");
    };
    ws.onmessage = function (m) {
      try { self.onMessage(JSON.parse(m.data)); } catch (err) { if (window.console) console.error(err); }
    };
    ws.onclose = function (e) {
      self.root.setAttribute("data-connected", "false");
      if (e.code === 4403) { self.q("status").textContent = "You may not view this run."; return; }
      if (self.isDone()) return;
      // Two handshakes in a row that never opened: the live channel is down (e.g. Redis). Follow
      // the run by polling its snapshot over HTTP, and keep trying the websocket meanwhile.
      if (!opened && ++self.failedOpens >= 2) self.startPolling();
      var delay = self.polling ? 10000 : Math.min(5000, 250 * Math.pow(2, self.retry++));
      window.setTimeout(function () { self.connect(); }, delay);
    };
  };

  RunView.prototype.startPolling = function () {
    if (this.polling || !this.snapshotUrl) return;
    var self = this;
    this.root.setAttribute("data-live", "polling");
    var poll = function () {
      fetch(self.snapshotUrl, { credentials: "same-origin", headers: { Accept: "application/json" } })
        .then(function (r) { return r.ok ? r.json() : null; })
        .then(function (snap) {
          if (!snap || snap.type !== "snapshot") return;
          // A snapshot is the whole truth at its seq; re-applying an equal one is harmless.
          if (!self.run || snap.last_seq > self.lastSeq || snap.run.answer_held !== self.run.answer_held ||
              snap.run.status !== self.run.status) self.onMessage(snap);
          if (self.isDone()) self.stopPolling();
        })
        .catch(function () { /* next tick */ });
    };
    poll();
    this.polling = window.setInterval(poll, 1500);
  };

  RunView.prototype.stopPolling = function () {
    if (!this.polling) return;
    window.clearInterval(this.polling);
    this.polling = null;
  };

  RunView.prototype.onMessage = function (msg) {
    if (msg.type === "snapshot") {
      this.run = msg.run;
      this.steps = {};
      var self = this;
      (msg.steps || []).forEach(function (s) { self.steps[s.index] = s; });
      this.decisions = [];
      (msg.decisions || []).forEach(function (d) { self.applyDecision(d); });
      this.lastSeq = msg.last_seq;
      this.render();
      return;
    }
    if (msg.type === "pong" || typeof msg.seq !== "number" || msg.seq <= this.lastSeq) return;
    this.lastSeq = msg.seq;
    this.apply(msg);
    this.render();
    if (this.isDone() && this.ws) this.ws.close(1000);
  };

  RunView.prototype.addUsage = function (usage, cost) {
    if (!this.run || !usage) return;
    this.run.input_tokens += usage.input_tokens || 0;
    this.run.output_tokens += usage.output_tokens || 0;
    if (cost !== null && cost !== undefined) this.run.cost_usd = String(Number(this.run.cost_usd || 0) + Number(cost));
  };

  // Plans and guardrail verdicts go to the decisions panel; a step joins the graph only when it
  // starts (or is skipped), so the graph grows as the run really progresses.
  RunView.prototype.applyDecision = function (ev) {
    this.decisions.push(ev);
  };

  RunView.prototype.apply = function (ev) {
    var d = ev.data || {};
    var run = this.run;
    switch (ev.type) {
      case "run.started":
        if (run) { run.status = "running"; run.started_at = run.started_at || new Date(ev.ts * 1000).toISOString(); }
        break;
      case "guardrail.checked":
      case "plan.validated":
        this.applyDecision(ev);
        break;
      case "plan.proposed":
        this.applyDecision(ev);
        this.addUsage(d.usage, d.cost_usd);
        break;
      case "step.started":
        this.steps[d.index] = Object.assign({}, this.steps[d.index] || {}, d, { status: "running", live: "" });
        break;
      case "step.delta":
        if (this.steps[d.index]) this.steps[d.index].live = (this.steps[d.index].live || "") + (d.text || "");
        break;
      case "step.finished":
        var prev = this.steps[d.index] || { access: [], instruction: "", messages: [] };
        this.steps[d.index] = Object.assign({}, prev, d, { live: "" });
        this.addUsage(d.usage, d.cost_usd);
        if (run) run.step_count += 1;
        break;
      case "run.finished":
        if (run) {
          var t = d.totals || {};
          run.status = d.status;
          run.answer = d.answer || "";
          run.answer_held = !!d.answer_held;
          if (d.withheld) run.content_withheld = true;
          run.error = d.error || "";
          run.status_reason = d.reason || "";
          run.finished_at = new Date(ev.ts * 1000).toISOString();
          if (t.input_tokens !== undefined) { run.input_tokens = t.input_tokens; run.output_tokens = t.output_tokens; run.cost_usd = t.cost_usd; }
          if (t.latency_ms !== undefined) run.latency_ms = t.latency_ms;
        }
        break;
      default:
        break;
    }
  };

  // Deterministic layout: x = round band + dependency depth within the round (from the stored
  // access lists); y = the step index. Neither depends on arrival order, so nodes never move.
  RunView.prototype.layout = function () {
    var idx = Object.keys(this.steps).map(Number).sort(function (a, b) { return a - b; });
    var depth = {}, pos = {}, self = this;
    idx.forEach(function (i) {
      var s = self.steps[i], dd = 0;
      (s.access || []).forEach(function (a) {
        var dep = self.steps[a];
        if (dep && dep.round === s.round && depth[a] !== undefined) dd = Math.max(dd, depth[a] + 1);
      });
      depth[i] = Math.min(dd, BAND - 2);
      pos[i] = { x: ((s.round || 1) - 1) * BAND + depth[i], y: -i };
    });
    return { order: idx, pos: pos };
  };

  RunView.prototype.renderGraph = function () {
    var graph = this.q("graph");
    if (!graph || !window.Plotly) return;
    var lay = this.layout(), self = this;
    var ex = [], ey = [], annotations = [], shapes = [];
    var rounds = {};
    lay.order.forEach(function (i) {
      var s = self.steps[i], p = lay.pos[i];
      rounds[s.round || 1] = true;
      (s.access || []).forEach(function (a) {
        var q = lay.pos[a];
        if (!q) return;
        ex.push(q.x, p.x, null); ey.push(q.y, p.y, null);
        annotations.push({ x: p.x, y: p.y, ax: q.x, ay: q.y, xref: "x", yref: "y", axref: "x", ayref: "y",
          showarrow: true, arrowhead: 2, arrowsize: 1.2, arrowwidth: 1.2, arrowcolor: "#7a869a", standoff: 14, startstandoff: 14, text: "" });
      });
    });
    var maxRound = Math.max.apply(null, [1].concat(Object.keys(rounds).map(Number)));
    var minY = Math.min.apply(null, [0].concat(lay.order.map(function (i) { return lay.pos[i].y; })));
    Object.keys(rounds).map(Number).forEach(function (r) {
      var x0 = (r - 1) * BAND - 0.5;
      shapes.push({ type: "rect", xref: "x", yref: "paper", x0: x0, x1: x0 + BAND - 0.2, y0: 0, y1: 1,
        fillcolor: r % 2 ? "rgba(47,111,222,0.05)" : "rgba(31,157,85,0.05)", line: { width: 0 }, layer: "below" });
      annotations.push({ x: x0 + 0.1, y: 1, xref: "x", yref: "paper", text: "round " + r, showarrow: false,
        xanchor: "left", yanchor: "top", font: { size: 11, color: "#6b778c" } });
    });
    var nodes = {
      type: "scatter", mode: "markers+text", hoverinfo: "text",
      x: lay.order.map(function (i) { return lay.pos[i].x; }),
      y: lay.order.map(function (i) { return lay.pos[i].y; }),
      text: lay.order.map(function (i) { return i + " · " + (self.steps[i].worker_key || "?"); }),
      hovertext: lay.order.map(function (i) { var s = self.steps[i]; return s.status + ": " + String(s.instruction || "").slice(0, 80); }),
      customdata: lay.order,
      textposition: "bottom center",
      marker: { size: 26, line: { width: 2, color: "#fff" },
        color: lay.order.map(function (i) { return COLOURS[self.steps[i].status] || "#9aa6ba"; }) }
    };
    var edges = { type: "scatter", mode: "lines", x: ex, y: ey, hoverinfo: "skip", line: { color: "#c3cad6", width: 1 } };
    var layout = {
      margin: { l: 10, r: 10, t: 10, b: 10 }, showlegend: false, height: 20 + 90 * (1.4 - Math.min(minY, -1)),
      // Two round bands are always laid out (the default depth limit), so round 2 moves nothing.
      xaxis: { visible: false, range: [-0.8, Math.max(2, maxRound) * BAND - 0.6], fixedrange: true },
      yaxis: { visible: false, range: [Math.min(minY, -1) - 0.8, 0.6], fixedrange: true },
      shapes: shapes, annotations: annotations, plot_bgcolor: "#fff", paper_bgcolor: "#fff"
    };
    window.Plotly.react(graph, [edges, nodes], layout, { displayModeBar: false, responsive: true });
    if (!graph._conductorClick) {
      graph._conductorClick = true;
      graph.on("plotly_click", function (ev) {
        var pt = ev && ev.points && ev.points[0];
        if (pt && pt.customdata !== undefined) self.inspect(Number(pt.customdata));
      });
    }
  };

  RunView.prototype.renderNodes = function () {
    var list = this.q("nodes"), self = this;
    if (!list) return;
    Object.keys(this.steps).map(Number).sort(function (a, b) { return a - b; }).forEach(function (i) {
      var s = self.steps[i];
      var btn = list.querySelector("[data-testid='step-node-" + i + "']");
      if (!btn) {
        var li = el("li");
        btn = el("button", { type: "button", "class": "step-node", "data-testid": "step-node-" + i, "data-index": String(i) });
        btn.addEventListener("click", function () { self.inspect(i); });
        li.appendChild(btn);
        // Keep DOM order by index even when a later index arrives first.
        var next = Array.prototype.find.call(list.children, function (c) { return Number(c.firstChild.getAttribute("data-index")) > i; });
        list.insertBefore(li, next || null);
      }
      btn.setAttribute("data-status", s.status);
      btn.style.borderLeftColor = COLOURS[s.status] || "#9aa6ba";
      btn.textContent = "Step " + i + " · round " + (s.round || 1) + " · " + (s.worker_key || "?") + " — " + s.status;
    });
  };

  RunView.prototype.renderStatus = function () {
    var run = this.run;
    if (!run) return;
    var status = this.q("status");
    if (status) {
      status.textContent = run.status + (run.status_reason && this.isTerminal() ? " (" + run.status_reason + ")" : "") +
        (run.answer_held ? " · held for review" : "") +
        (this.polling ? " · live channel down, polling" : "");
      status.setAttribute("data-held", run.answer_held ? "true" : "false");
      status.setAttribute("data-status", run.status);
      status.className = "badge badge-" + run.status;
    }
    var elapsed = this.q("elapsed");
    if (elapsed && run.started_at) {
      var end = run.finished_at ? Date.parse(run.finished_at) : Date.now();
      elapsed.textContent = ((end - Date.parse(run.started_at)) / 1000).toFixed(1) + " s";
    }
    var tokens = this.q("tokens");
    if (tokens) tokens.textContent = run.input_tokens + " in / " + run.output_tokens + " out";
    var cost = this.q("cost");
    if (cost) cost.textContent = fmtCost(run.cost_usd) + (run.priced === false ? " (partly unpriced)" : "");
    var answer = this.q("answer");
    if (answer) {
      var rules = (run.held_rules || []).join(", ");
      if (run.answer_held && !run.answer) answer.textContent = "The answer is held for review" + (rules ? " (policy rule " + rules + ")" : "") + " until a reviewer releases it.";
      else answer.textContent = run.answer || (this.isTerminal() ? (run.error || "(no answer)") : "");
      answer.setAttribute("data-ready", this.isTerminal() ? "true" : "false");
    }
    var cancel = this.q("cancel");
    if (cancel) cancel.hidden = this.isTerminal();
  };

  RunView.prototype.renderDecisions = function () {
    var box = this.q("decisions");
    if (!box) return;
    box.textContent = "";
    this.decisions.forEach(function (ev) {
      var d = ev.data || {}, li = el("li");
      if (ev.type === "guardrail.checked") {
        li.appendChild(el("strong", {}, "Guardrails (" + d.stage + (d.step !== null && d.step !== undefined ? " step " + d.step : "") + "): "));
        (d.checks || []).forEach(function (c) {
          li.appendChild(el("span", { "class": "badge badge-" + c.status }, c.name + " " + c.status));
          li.appendChild(document.createTextNode(" "));
        });
      } else if (ev.type === "plan.proposed") {
        li.appendChild(el("strong", {}, "Plan proposed (round " + d.round + ", attempt " + d.attempt + ", " + d.source + ")"));
        if (d.error) li.appendChild(el("div", { "class": "error" }, d.error));
      } else if (ev.type === "plan.validated") {
        li.appendChild(el("strong", {}, "Plan " + d.action + " (round " + d.round + ")"));
        (d.violations || []).forEach(function (v) { li.appendChild(el("div", { "class": "error" }, v.code + ": " + v.message)); });
        if (d.reason) li.appendChild(el("div", {}, d.reason));
      }
      box.appendChild(li);
    });
  };

  RunView.prototype.inspect = function (index) {
    this.selected = index;
    this.renderInspector();
  };

  RunView.prototype.renderInspector = function () {
    var box = this.q("inspector"), s = this.steps[this.selected];
    if (!box || s === undefined) return;
    box.hidden = false;
    var set = function (role, value) { var n = box.querySelector("[data-field=" + role + "]"); if (n) n.textContent = value; };
    set("title", "Step " + s.index + " (round " + (s.round || 1) + ")");
    set("worker", (s.worker_key || "?") + (s.worker_name ? " — " + s.worker_name : "") + (s.fallback_from ? " (fallback from " + s.fallback_from + ")" : ""));
    set("status", s.status);
    set("instruction", s.instruction || "");
    set("access", JSON.stringify(s.access || []));
    var u = s.usage || {};
    set("tokens", (u.input_tokens || 0) + " in / " + (u.output_tokens || 0) + " out");
    set("cost", fmtCost(s.cost_usd) + (s.priced === false ? " (unpriced)" : ""));
    set("latency", s.latency_ms !== null && s.latency_ms !== undefined ? Number(s.latency_ms).toFixed(0) + " ms" : "—");
    set("error", s.error || "");
    set("output", s.withheld ? WITHHELD : (s.output || s.live || ""));
    var msgs = box.querySelector("[data-field=messages]");
    msgs.textContent = s.withheld ? WITHHELD : "";
    (s.messages || []).forEach(function (m) {
      var item = el("div", { "class": "inspector-message", "data-role-name": m.role });
      item.appendChild(el("div", { "class": "muted" }, m.role));
      item.appendChild(el("pre", {}, m.content));
      msgs.appendChild(item);
    });
    var replay = box.querySelector("[data-field=replay]");
    if (replay) {
      replay.hidden = !(s.messages && s.messages.length && this.replayUrl);
      replay.setAttribute("action", this.replayUrl.replace("/0/replay/", "/" + s.index + "/replay/"));
    }
  };

  RunView.prototype.render = function () {
    this.renderGraph();
    this.renderNodes();
    this.renderStatus();
    this.renderDecisions();
    if (this.selected !== null) this.renderInspector();
    this.root.setAttribute("data-last-seq", String(this.lastSeq));
  };

  window.ConductorRunView = RunView;
  document.addEventListener("DOMContentLoaded", function () {
    Array.prototype.forEach.call(document.querySelectorAll("[data-run-view]"), function (root) {
      root.conductorView = new RunView(root);
    });
  });
})();

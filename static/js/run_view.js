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
    pending: "#9aa6ba", waiting: "#9dbcf0", running: "#2f6fde", succeeded: "#1f9d55", failed: "#d64545",
    timed_out: "#d98b00", skipped: "#c9b458", blocked: "#8e2b2b", cancelled: "#6b778c",
    awaiting_approval: "#7a4fd0"
  };
  // Statuses, event types and strategy labels come from the page (apps/runs/templatetags/
  // run_vocabulary.py, read from the engine's and the runs app's definitions), never repeated here.
  var VOCAB = JSON.parse((document.getElementById("run-vocabulary") || {}).textContent || "{}");
  var EV = VOCAB.event_types || {};
  var STRATEGIES = VOCAB.strategies || {};
  var DECISIONS = [EV.GUARDRAIL_CHECKED, EV.PLAN_PROPOSED, EV.PLAN_VALIDATED];
  var TERMINAL = VOCAB.terminal || [];
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

  // One way to write a duration on every surface (the pages' ``duration`` filter writes the same):
  // milliseconds below a second, seconds with one decimal above.
  function fmtDuration(ms) {
    if (ms === null || ms === undefined || ms === "" || isNaN(Number(ms))) return "—";
    var n = Number(ms);
    return n < 1000 ? n.toFixed(0) + " ms" : (n / 1000).toFixed(1) + " s";
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
    this.plans = {};      // round -> planning node (the conductor's planning call of that round)
    this.roundSteps = {}; // round -> indices of the steps its accepted plan runs
    this.tools = {};      // "t<step>-<n>" -> a tool call of a step (issue 43): a node of its own
    this.inputChecked = false;
    this.cancelling = false;
    this.lastSeq = 0;
    this.retry = 0;
    this.selected = null;
    this.q = function (role) { return root.querySelector("[data-role=" + role + "]"); };
    var self = this;
    this.bindControls();
    this.connect();
    this.timer = window.setInterval(function () { self.renderStatus(); if (!self.isTerminal()) self.renderCompareRow(); }, 500);
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
      // Close codes: docs/security.md ("Websockets"). The socket follows the session and the access.
      if (e.code === 4403) { self.q("status").textContent = "You may not view this run."; return; }
      if (e.code === 4401) { self.q("status").textContent = "Your session ended: sign in again to follow this run."; return; }
      if (e.code === 4409) {
        // Content this page showed is now withheld from you: start over from a withheld snapshot.
        self.run = null;
        self.steps = {};
        self.connect();
        return;
      }
      if (e.code === 4400) { self.startPolling(); return; } // this page's origin may not open the socket
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
      // The answer released so far (issue 45); the events after the snapshot continue it.
      this.liveAnswer = msg.answer_live || "";
      this.decisions = [];
      this.plans = {};
      this.roundSteps = {};
      this.tools = {};
      this.inputChecked = false;
      // Decisions come in seq order: planning nodes rebuild exactly as they grew live.
      (msg.decisions || []).forEach(function (d) { self.applyDecision(d); self.applyPlanning(d); self.applyTool(d); });
      if (this.isTerminal()) this.endOpenNodes(this.run.status);
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
    if (ev.type === EV.GUARDRAIL_CHECKED && (ev.data || {}).stage === "input") this.inputChecked = true;
    // Only verdicts are listed; plan.started (a node) and run.started may ride along in a snapshot.
    if (DECISIONS.indexOf(ev.type) >= 0) this.decisions.push(ev);
  };

  // The conductor's planning call of each round is a node of its own: running from plan.started,
  // then carrying every attempt's tokens, cost and latency (from plan.proposed) and its verdict.
  RunView.prototype.applyPlanning = function (ev) {
    var d = ev.data || {}, r = d.round || 1, p = this.plans[r];
    if (ev.type === EV.PLAN_STARTED) {
      this.plans[r] = { key: "p" + r, round: r, kind: "plan", status: "running", worker_key: d.worker_key,
        worker_name: d.worker_name, model: d.model, first: d.first || 0, attempts: 0, output: "", error: "",
        usage: { input_tokens: 0, output_tokens: 0 }, cost_usd: null, priced: true, latency_ms: 0 };
      return;
    }
    // Issue 44: the planning call waits for its model's one slot (another call holds it), then runs.
    if (p && ev.type === EV.PLAN_WAITING) { p.status = "waiting"; p.waiting_reason = d.reason || ""; return; }
    if (p && ev.type === EV.PLAN_RUNNING) { if (p.status === "waiting") p.status = "running"; p.waiting_reason = ""; return; }
    if (ev.type === EV.PLAN_DELTA) {
      // The conductor's text as it writes it: the running planning node's live output.
      if (p && p.status === "running" && d.text) p.output = (p.attempt_live === d.attempt ? p.output : "") + d.text;
      if (p) p.attempt_live = d.attempt;
      return;
    }
    if (ev.type === EV.PLAN_PROPOSED) {
      if (!p) return; // no planning call (fixed plans, or a pool without a conductor)
      var u = d.usage || {};
      p.attempts += d.source === "fallback" ? 0 : 1;
      p.usage.input_tokens += u.input_tokens || 0;
      p.usage.output_tokens += u.output_tokens || 0;
      if (d.cost_usd !== null && d.cost_usd !== undefined) p.cost_usd = String(Number(p.cost_usd || 0) + Number(d.cost_usd));
      if (d.priced === false) p.priced = false;
      p.latency_ms += Number(d.latency_ms || 0);
      if (d.raw) p.output = d.raw;
      if (d.withheld) p.withheld = true;
      if (d.source === "fallback") { p.status = "failed"; p.error = d.error || ""; }
      else if (d.plan) { p.status = "succeeded"; p.error = ""; }
      else { p.error = d.error || ""; } // a repair attempt follows
      if (d.plan) p.plan = d.plan;
      if (d.plan && d.plan.steps) this.roundSteps[r] = d.plan.steps.map(function (s) { return s.index; });
      return;
    }
    if (ev.type === EV.PLAN_VALIDATED) {
      if (d.plan && d.plan.steps) this.roundSteps[r] = d.plan.steps.map(function (s) { return s.index; });
      if (p && d.action === "blocked") { p.status = "blocked"; p.error = d.reason || "The plan was blocked."; }
      if (p && d.action === "held") { p.status = "awaiting_approval"; p.error = d.reason || "The plan waits for an approver."; }
    }
  };

  // Each tool call of a step's worker (tool.called): its arguments, output, latency and verdict.
  RunView.prototype.applyTool = function (ev) {
    if (!EV.TOOL_CALLED || ev.type !== EV.TOOL_CALLED) return;
    var d = ev.data || {}, n = 0;
    while (this.tools["t" + d.index + "-" + n]) n += 1;
    var status = { refused: "blocked", held: "awaiting_approval", pending_approval: "awaiting_approval" }[d.status] || d.status;
    this.tools["t" + d.index + "-" + n] = Object.assign({}, d, { key: "t" + d.index + "-" + n, kind: "tool", n: n,
      step: d.index, verdict: d.status, status: status });
  };

  RunView.prototype.apply = function (ev) {
    var d = ev.data || {};
    var run = this.run;
    switch (ev.type) {
      case EV.RUN_STARTED:
        if (run) { run.status = "running"; run.started_at = run.started_at || new Date(ev.ts * 1000).toISOString(); }
        break;
      case EV.GUARDRAIL_CHECKED:
        this.applyDecision(ev);
        break;
      case EV.PLAN_STARTED:
      case EV.PLAN_VALIDATED:
        this.applyDecision(ev);
        this.applyPlanning(ev);
        break;
      case EV.PLAN_DELTA:
      case EV.PLAN_WAITING:
      case EV.PLAN_RUNNING:
        this.applyPlanning(ev);
        break;
      case EV.PLAN_PROPOSED:
        this.applyDecision(ev);
        this.applyPlanning(ev);
        this.addUsage(d.usage, d.cost_usd);
        break;
      case EV.STEP_STARTED:
        this.steps[d.index] = Object.assign({}, this.steps[d.index] || {}, d, { status: "running", live: "" });
        break;
      case EV.STEP_WAITING:
        // Issue 44: started, but its worker's slots are taken: no call yet, its timeout not running.
        if (this.steps[d.index]) { this.steps[d.index].status = "waiting"; this.steps[d.index].waiting_reason = d.reason || ""; }
        break;
      case EV.STEP_RUNNING:
        if (this.steps[d.index] && this.steps[d.index].status === "waiting") this.steps[d.index].status = "running";
        if (this.steps[d.index]) this.steps[d.index].waiting_reason = "";
        break;
      case EV.TOOL_CALLED:
        this.applyTool(ev);
        break;
      case EV.STEP_DELTA:
        if (this.steps[d.index]) this.steps[d.index].live = (this.steps[d.index].live || "") + (d.text || "");
        // The answer as the output gate releases it (issue 45): the answer panel shows it live.
        if (d.answer) this.liveAnswer = (this.liveAnswer || "") + (d.text || "");
        break;
      case EV.STEP_FINISHED:
        var prev = this.steps[d.index] || { access: [], instruction: "", messages: [] };
        this.steps[d.index] = Object.assign({}, prev, d, { live: "" });
        this.addUsage(d.usage, d.cost_usd);
        if (run) run.step_count += 1;
        break;
      case EV.RUN_AWAITING_APPROVAL:
        // Paused before any worker call: the plan waits for a team admin or reviewer.
        if (run) { run.status = "awaiting_approval"; run.error = d.error || ""; run.status_reason = d.reason || ""; }
        if (this.root.getAttribute("data-on-run-page") === "true" && !document.querySelector("[data-testid=approval-panel]")) {
          window.location.reload(); // the run page's approval panel (plan, reasons, decision form) is server-rendered
        }
        break;
      case EV.RUN_REQUEUED:
        // Issue 44: the executor was lost; the run waits in the queue for its next attempt, whose
        // events (replayed from the journal) rebuild the graph. Not "Planning…" meanwhile.
        if (run) {
          run.status = "queued"; run.error = ""; run.status_reason = ""; run.requeued = d;
          run.input_tokens = 0; run.output_tokens = 0; run.cost_usd = null; run.step_count = 0;
        }
        this.steps = {}; this.plans = {}; this.roundSteps = {}; this.tools = {}; this.inputChecked = false; this.liveAnswer = "";
        break;
      case EV.RUN_PLAN_DECIDED:
        if (run && d.decision === "approved") {
          // The next attempt replays planning from the journal and rebuilds the graph and usage.
          run.status = "queued"; run.error = ""; run.status_reason = "";
          run.input_tokens = 0; run.output_tokens = 0; run.cost_usd = null; run.step_count = 0;
          this.steps = {}; this.plans = {}; this.roundSteps = {}; this.tools = {}; this.inputChecked = false; this.liveAnswer = "";
        }
        if (run) run.plan_decision = d;
        break;
      case EV.RUN_FINISHED:
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
          // The engine's count (a conductor's own re-plan step is not a worker step): the runs
          // list shows the same number.
          if (t.steps !== undefined) run.step_count = t.steps;
        }
        this.cancelling = false;
        this.endOpenNodes(d.status);
        break;
      default:
        break;
    }
  };

  // A node still running when the run ends (cancelled, timed out) ends with it, not "running".
  RunView.prototype.endOpenNodes = function (status) {
    var end = status === "succeeded" ? "succeeded" : (COLOURS[status] ? status : "failed");
    var self = this;
    Object.keys(this.plans).forEach(function (r) {
      if (self.plans[r].status === "running" || self.plans[r].status === "waiting") self.plans[r].status = end;
    });
  };

  // ONE step numbering on every surface (nodes, graph, progress line, inspector): from 1 within
  // the step's round, in the order its accepted plan lists them; "round n" when there are several.
  RunView.prototype.stepNo = function (i) {
    var s = this.steps[i] || {}, r = s.round || 1, planned = this.roundSteps[r] || [];
    var k = planned.indexOf(Number(i));
    if (k >= 0) return k + 1;
    var plan = this.plans[r];
    return plan && plan.first !== undefined && i >= plan.first ? i - plan.first + 1 : Number(i) + 1;
  };

  RunView.prototype.rounds = function () {
    var self = this, most = 1;
    Object.keys(this.plans).forEach(function (r) { most = Math.max(most, Number(r)); });
    Object.keys(this.steps).forEach(function (i) { most = Math.max(most, self.steps[i].round || 1); });
    return most;
  };

  // An access list in the same numbering: "step 1, step 2", "all earlier steps", "nothing earlier".
  // ``planSteps``: the plan being described, when its steps are not steps of the run yet.
  RunView.prototype.accessText = function (access, planSteps) {
    if (access === "all") return "all earlier steps";
    if (!access || !access.length) return "nothing earlier";
    var self = this;
    return access.map(function (i) {
      var k = planSteps ? planSteps.map(function (p) { return p.index; }).indexOf(i) : -1;
      return "step " + (k >= 0 ? k + 1 : self.stepNo(i));
    }).join(", ");
  };

  RunView.prototype.stepName = function (i) {
    var s = this.steps[i] || {};
    return "Step " + this.stepNo(i) + (this.rounds() > 1 ? " · round " + (s.round || 1) : "");
  };

  RunView.prototype.planOf = function (key) {
    return typeof key === "string" && key.charAt(0) === "p" ? this.plans[Number(key.slice(1))] : undefined;
  };

  RunView.prototype.toolOf = function (key) {
    return typeof key === "string" && key.charAt(0) === "t" ? this.tools[key] : undefined;
  };

  // Deterministic layout from the access lists (issue 42: the graph must not draw parallel steps
  // as a chain): x = round band + 1 + dependency depth within the round, so a chain runs left to
  // right; y = the step's rank among the steps of its column, so steps that read nothing from
  // each other stand side by side (one column, one row each). A round's planning node sits left of
  // its first column, centred on it. Nothing depends on arrival order.
  RunView.prototype.layout = function () {
    var idx = Object.keys(this.steps).map(Number).sort(function (a, b) { return a - b; });
    var depth = {}, pos = {}, perColumn = {}, self = this;
    idx.forEach(function (i) {
      var s = self.steps[i], dd = 0, all = s.access === "all";
      (all ? idx.filter(function (a) { return a < i; }) : s.access || []).forEach(function (a) {
        var dep = self.steps[a];
        if (dep && dep.round === s.round && depth[a] !== undefined) dd = Math.max(dd, depth[a] + 1);
      });
      depth[i] = Math.min(dd, BAND - 2);
      var column = (s.round || 1) + ":" + depth[i];
      perColumn[column] = (perColumn[column] || 0) + 1;
      pos[i] = { x: ((s.round || 1) - 1) * BAND + 1 + depth[i], y: 1 - perColumn[column] };
    });
    var plans = Object.keys(this.plans).map(Number).sort(function (a, b) { return a - b; }).map(function (r) {
      var p = self.plans[r], first = perColumn[r + ":0"] || 1;
      pos[p.key] = { x: (r - 1) * BAND, y: -(first - 1) / 2 };
      return p.key;
    });
    // A tool call sits just below and right of its step, one beside the other.
    var tools = Object.keys(this.tools).filter(function (k) { return pos[self.tools[k].step] !== undefined; });
    tools.forEach(function (k) {
      var t = self.tools[k], p = pos[t.step];
      pos[k] = { x: p.x + 0.45 + 0.4 * t.n, y: p.y - 0.45 };
    });
    return { order: plans.concat(idx).concat(tools), steps: idx, tools: tools, pos: pos, depth: depth };
  };

  RunView.prototype.node = function (key) {
    return this.planOf(key) || this.toolOf(key) || this.steps[key];
  };

  RunView.prototype.renderGraph = function () {
    var graph = this.q("graph");
    if (!graph || !window.Plotly) return;
    var lay = this.layout(), self = this;
    var ex = [], ey = [], annotations = [], shapes = [];
    var rounds = {};
    var arrow = function (q, p) {
      ex.push(q.x, p.x, null); ey.push(q.y, p.y, null);
      annotations.push({ x: p.x, y: p.y, ax: q.x, ay: q.y, xref: "x", yref: "y", axref: "x", ayref: "y",
        showarrow: true, arrowhead: 2, arrowsize: 1.2, arrowwidth: 1.2, arrowcolor: "#7a869a", standoff: 14, startstandoff: 14, text: "" });
    };
    lay.steps.forEach(function (i) {
      var s = self.steps[i], p = lay.pos[i];
      rounds[s.round || 1] = true;
      (s.access || []).forEach(function (a) { if (lay.pos[a]) arrow(lay.pos[a], p); });
      // The round's plan feeds the steps that read nothing earlier in their round.
      var plan = self.plans[s.round || 1];
      if (plan && lay.depth[i] === 0) arrow(lay.pos[plan.key], p);
    });
    (lay.tools || []).forEach(function (k) { arrow(lay.pos[self.tools[k].step], lay.pos[k]); });
    Object.keys(this.plans).forEach(function (r) {
      rounds[r] = true;
      var prev = self.steps[self.plans[r].first - 1];
      if (Number(r) > 1 && prev) arrow(lay.pos[prev.index], lay.pos[self.plans[r].key]);
    });
    var maxRound = Math.max.apply(null, [1].concat(Object.keys(rounds).map(Number)));
    var ys = lay.order.map(function (k) { return lay.pos[k].y; });
    var minY = Math.min.apply(null, [0].concat(ys)), maxY = Math.max.apply(null, [0].concat(ys));
    Object.keys(rounds).map(Number).forEach(function (r) {
      var x0 = (r - 1) * BAND - 0.5;
      shapes.push({ type: "rect", xref: "x", yref: "paper", x0: x0, x1: x0 + BAND - 0.2, y0: 0, y1: 1,
        fillcolor: r % 2 ? "rgba(47,111,222,0.05)" : "rgba(31,157,85,0.05)", line: { width: 0 }, layer: "below" });
      annotations.push({ x: x0 + 0.1, y: 1, xref: "x", yref: "paper", text: "round " + r, showarrow: false,
        xanchor: "left", yanchor: "top", font: { size: 11, color: "#5b6575" } });
    });
    var label = function (k) {
      var n = self.node(k);
      if (n.kind === "tool") return n.tool;
      return n.kind === "plan" ? "plan · " + (n.worker_key || "conductor") : self.stepNo(k) + " · " + (n.worker_key || "?");
    };
    var nodes = {
      type: "scatter", mode: "markers+text", hoverinfo: "text",
      x: lay.order.map(function (k) { return lay.pos[k].x; }),
      y: lay.order.map(function (k) { return lay.pos[k].y; }),
      text: lay.order.map(label),
      hovertext: lay.order.map(function (k) {
        var n = self.node(k);
        if (n.kind === "tool") return n.verdict + (n.rule ? " (" + n.rule + ")" : "") + ": " + n.tool;
        return n.status + ": " + (n.kind === "plan" ? "planning round " + n.round : String(n.instruction || "").slice(0, 80));
      }),
      customdata: lay.order,
      textposition: "bottom center",
      cliponaxis: false, // a label centred on a node at the band's edge stays whole
      marker: { size: lay.order.map(function (k) { return self.toolOf(k) ? 16 : 26; }), line: { width: 2, color: "#fff" },
        symbol: lay.order.map(function (k) { return self.planOf(k) ? "diamond" : (self.toolOf(k) ? "square" : "circle"); }),
        color: lay.order.map(function (k) { return COLOURS[self.node(k).status] || "#9aa6ba"; }) }
    };
    var edges = { type: "scatter", mode: "lines", x: ex, y: ey, hoverinfo: "skip", line: { color: "#c3cad6", width: 1 } };
    var top = Math.max(maxY, 0) + 0.6, bottom = Math.min(minY, -1) - 0.8;
    var layout = {
      margin: { l: 50, r: 10, t: 10, b: 10 }, showlegend: false, height: 20 + 90 * (top - bottom),
      // Two round bands are always laid out (the default depth limit), so round 2 moves nothing.
      xaxis: { visible: false, range: [-0.8, Math.max(2, maxRound) * BAND - 0.6], fixedrange: true },
      yaxis: { visible: false, range: [bottom, top], fixedrange: true },
      shapes: shapes, annotations: annotations, plot_bgcolor: "#fff", paper_bgcolor: "#fff"
    };
    window.Plotly.react(graph, [edges, nodes], layout, { displayModeBar: false, responsive: true });
    if (!graph._conductorClick) {
      graph._conductorClick = true;
      graph.on("plotly_click", function (ev) {
        var pt = ev && ev.points && ev.points[0];
        if (pt && pt.customdata !== undefined) self.inspect(pt.customdata, true);
      });
    }
  };

  RunView.prototype.renderNodes = function () {
    var list = this.q("nodes"), self = this;
    if (!list) return;
    var entries = Object.keys(this.plans).map(function (r) { var p = self.plans[r]; return { key: p.key, sort: p.first - 0.5 }; })
      .concat(Object.keys(this.steps).map(function (i) { return { key: Number(i), sort: Number(i) }; }))
      .concat(Object.keys(this.tools).map(function (k) { var t = self.tools[k]; return { key: k, sort: t.step + 0.1 + 0.01 * t.n }; }));
    entries.forEach(function (e) {
      var n = self.node(e.key), isPlan = n.kind === "plan", isTool = n.kind === "tool";
      var testid = isPlan ? "plan-node-" + n.round : (isTool ? "tool-node-" + e.key.slice(1) : "step-node-" + e.key);
      var btn = list.querySelector("[data-testid='" + testid + "']");
      if (!btn) {
        var li = el("li");
        btn = el("button", { type: "button", "class": "step-node", "data-testid": testid, "data-sort": String(e.sort),
          "data-kind": isPlan ? "plan" : (isTool ? "tool" : "step"), "aria-pressed": "false" });
        btn.addEventListener("click", function () { self.inspect(e.key, true); });
        li.appendChild(btn);
        // Keep DOM order by position even when a later node arrives first (no re-append: focus stays).
        var next = Array.prototype.find.call(list.children, function (c) { return Number(c.firstChild.getAttribute("data-sort")) > e.sort; });
        list.insertBefore(li, next || null);
      }
      btn.setAttribute("data-status", n.status);
      btn.setAttribute("aria-pressed", self.selected === e.key ? "true" : "false");
      btn.style.borderLeftColor = COLOURS[n.status] || "#9aa6ba";
      btn.textContent = isTool
        ? "Tool call · " + self.stepName(n.step).toLowerCase() + " · " + n.tool + " — " + n.verdict + (n.rule ? " (" + n.rule + ")" : "")
        : isPlan
        ? "Planning · round " + n.round + " · " + (n.worker_key || "conductor") + " — " + n.status
        : self.stepName(e.key) + " · " + (n.worker_key || "?") + " — " + n.status;
    });
  };

  // "What happens now", in words: planning, which step of how many, checking input or output.
  RunView.prototype.progressText = function () {
    var run = this.run, self = this;
    if (!run) return "connecting…";
    if (this.isTerminal()) {
      // A partial answer (issue 44) says why it is partial; a failure says why it failed.
      var partial = run.status === "succeeded" && run.status_reason === "partial";
      var why = partial ? "partial answer from an earlier round: " + (run.error || "a later step failed")
        : run.status === "succeeded" ? "" : (run.error || run.status_reason || "");
      return "Finished: " + run.status + (run.answer_held ? " (answer held for review)" : "") + (why ? " — " + why : "");
    }
    if (this.cancelling || run.cancel_requested) return "Cancelling: stopping at the current call…";
    if (run.status === "awaiting_approval") return "Waiting for an approver (a team admin or reviewer): " + (run.error || "the plan needs approval") ;
    if (run.status === "queued") {
      var decided = run.plan_decision && run.plan_decision.decision === "approved" ? "Plan approved by " + run.plan_decision.by + ". " : "";
      var again = run.requeued ? "Its executor was lost; attempt " + (Number(run.requeued.attempt || 1) + 1) + " resumes from the answered calls. " : "";
      return decided + again + "Queued: waiting for an executor to pick the run up.";
    }
    var planning = Object.keys(this.plans).map(function (r) { return self.plans[r]; })
      .filter(function (p) { return p.status === "running" || p.status === "waiting"; })[0];
    if (planning && planning.status === "waiting") {
      // Issue 44: not planning yet; the conductor's model is busy with another call.
      return "Waiting for the model " + (planning.worker_name || planning.worker_key) + " before planning" +
        (planning.round > 1 ? " round " + planning.round : "") + ": it runs one call at a time and is busy…";
    }
    if (planning) {
      return (planning.attempts > 0 ? "Repairing the plan with worker " : "Planning with worker ") +
        (planning.worker_name || planning.worker_key) + (planning.model ? " (" + planning.model + ")" : "") +
        (planning.round > 1 ? ", round " + planning.round : "") + "…";
    }
    var running = Object.keys(this.steps).map(Number).filter(function (i) { return self.steps[i].status === "running"; });
    var waiting = Object.keys(this.steps).map(Number).filter(function (i) { return self.steps[i].status === "waiting"; });
    if (running.length || waiting.length) {
      var s = this.steps[(running.length ? running : waiting)[0]], planned = this.roundSteps[s.round || 1] || [];
      var pos = function (i) { return self.stepNo(i); };
      var of = planned.length ? " of " + planned.length : "";
      var round = this.rounds() > 1 ? " (round " + (s.round || 1) + ")" : "";
      // Issue 44: steps behind a one-slot worker wait their turn; they are not "running in parallel".
      var queue = waiting.length
        ? (waiting.length === 1 ? "step " + pos(waiting[0]) + " waits" : "steps " + waiting.map(pos).join(", ") + " wait") +
          " for the model " + (this.steps[waiting[0]].worker_name || this.steps[waiting[0]].worker_key || "") + " (it runs one call at a time)"
        : "";
      if (!running.length) return "Waiting for the model: " + queue + "…";
      var now = running.length === 1
        ? "Step " + pos(s.index) + of + round + ": " + (s.worker_name || s.worker_key || "worker") + " is working"
        : "Steps " + running.map(pos).join(", ") + of + round + " are running in parallel";
      return now + (queue ? "; " + queue : "") + "…";
    }
    if (!this.inputChecked && !Object.keys(this.steps).length && !Object.keys(this.plans).length) return "Checking the input…";
    if (Object.keys(this.steps).length) return "Checking the output…";
    return "Starting…";
  };

  RunView.prototype.renderStatus = function () {
    var run = this.run;
    if (!run) return;
    var title = this.q("title");
    if (title && !title.getAttribute("data-filled")) {
      title.textContent = (STRATEGIES[run.strategy] || run.strategy) + (run.preset ? " · " + run.preset : "") +
        " — run " + String(run.id).slice(0, 8) + " on " + run.pool;
      title.setAttribute("data-filled", "true");
    }
    var status = this.q("status");
    if (status) {
      // A succeeded run's reason is always "completed": saying it twice reads as a stutter.
      status.textContent = run.status + (run.status_reason && this.isTerminal() && run.status !== "succeeded" ? " (" + run.status_reason + ")" : "") +
        (run.answer_held ? " · held for review" : "") +
        (this.polling ? " · live channel down, polling" : "");
      status.setAttribute("data-held", run.answer_held ? "true" : "false");
      status.setAttribute("data-status", run.status);
      status.className = "badge badge-" + run.status;
    }
    var progress = this.q("progress"), text = this.progressText();
    // Rewritten only when it changes: it is a live region, and screen readers announce each write.
    if (progress && progress.textContent !== text) progress.textContent = text;
    var elapsed = this.q("elapsed");
    // Once ended, the run's recorded latency (what the runs list and insights show); until then
    // the time since it started.
    if (elapsed && this.isTerminal() && run.latency_ms) elapsed.textContent = fmtDuration(run.latency_ms);
    else if (elapsed && run.started_at) {
      var end = run.finished_at ? Date.parse(run.finished_at) : Date.now();
      elapsed.textContent = fmtDuration(end - Date.parse(run.started_at));
    }
    var tokens = this.q("tokens");
    if (tokens) tokens.textContent = run.input_tokens + " in / " + run.output_tokens + " out";
    var cost = this.q("cost");
    if (cost) cost.textContent = fmtCost(run.cost_usd) + (run.priced === false ? " (partly unpriced)" : "");
    var answer = this.q("answer");
    if (answer) {
      var rules = (run.held_rules || []).join(", ");
      if (run.answer_held && !run.answer) answer.textContent = "The answer is held for review" + (rules ? " (policy rule " + rules + ")" : "") + " until a reviewer releases it.";
      else if (!this.isTerminal() && this.liveAnswer) answer.textContent = this.liveAnswer;
      // Never the error as if it were the answer: why the run ended is in the status line.
      else answer.textContent = run.answer || (this.isTerminal() ? "(no answer: the run " + run.status + ")" : "");
      answer.setAttribute("data-streaming", !this.isTerminal() && this.liveAnswer ? "true" : "false");
      answer.setAttribute("data-ready", this.isTerminal() ? "true" : "false");
      answer.setAttribute("data-partial", run.status_reason === "partial" && run.status === "succeeded" ? "true" : "false");
    }
    var note = this.q("partial-note");
    if (note) note.hidden = !(run.status === "succeeded" && run.status_reason === "partial");
    // "Helpful?" asks about an answer: only a run that gave one is asked about.
    var thumbs = this.root.querySelector(".feedback-controls");
    if (thumbs) thumbs.hidden = !(this.isTerminal() && run.status === "succeeded");
    var cancel = this.q("cancel");
    if (cancel) {
      cancel.hidden = this.isTerminal();
      var button = cancel.querySelector("button");
      if (button) button.disabled = !!(this.cancelling || run.cancel_requested);
    }
  };

  RunView.prototype.renderDecisions = function () {
    var box = this.q("decisions");
    if (!box) return;
    box.textContent = "";
    var self = this;
    this.decisions.forEach(function (ev) {
      var d = ev.data || {}, li = el("li");
      if (ev.type === EV.GUARDRAIL_CHECKED) {
        li.appendChild(el("strong", {}, "Guardrails (" + d.stage + (d.step !== null && d.step !== undefined ? ", " + self.stepName(d.step).toLowerCase() : "") + "): "));
        (d.checks || []).forEach(function (c) {
          li.appendChild(el("span", { "class": "badge badge-" + c.status }, c.name + " " + c.status));
          li.appendChild(document.createTextNode(" "));
        });
      } else if (ev.type === EV.PLAN_PROPOSED) {
        li.appendChild(el("strong", {}, "Plan proposed (round " + d.round + ", attempt " + d.attempt + ", " + d.source + ")"));
        if (d.error) li.appendChild(el("div", { "class": "error" }, d.error));
      } else if (ev.type === EV.PLAN_VALIDATED) {
        li.appendChild(el("strong", {}, "Plan " + d.action + " (round " + d.round + ")"));
        (d.violations || []).forEach(function (v) { li.appendChild(el("div", { "class": "error" }, v.code + ": " + v.message)); });
        if (d.reason) li.appendChild(el("div", {}, d.reason));
      }
      box.appendChild(li);
    });
  };

  RunView.prototype.bindControls = function () {
    var self = this, close = this.root.querySelector("[data-role=inspector-close]");
    if (close) close.addEventListener("click", function () {
      var was = self.selected;
      self.selected = null;
      self.q("inspector").hidden = true;
      self.renderNodes();
      var node = self.root.querySelector("[data-testid='" + (self.planOf(was) ? "plan-node-" + String(was).slice(1) : "step-node-" + was) + "']");
      if (node) node.focus();
    });
    var cancel = this.q("cancel");
    if (cancel && window.fetch) cancel.addEventListener("submit", function (e) {
      // Cancel in place: the graph keeps its state and shows the run ending live.
      e.preventDefault();
      self.cancelling = true;
      self.renderStatus();
      var token = cancel.querySelector("[name=csrfmiddlewaretoken]");
      fetch(cancel.getAttribute("action"), { method: "POST", credentials: "same-origin", body: new FormData(cancel),
        headers: { Accept: "application/json", "X-CSRFToken": token ? token.value : "" } })
        .then(function (r) {
          if (!r.ok) throw new Error("HTTP " + r.status);
          return r.json();
        })
        .then(function (body) {
          if (self.run && !self.isTerminal()) self.run.cancel_requested = !!body.cancel_requested;
          self.renderStatus();
        })
        .catch(function (err) {
          self.cancelling = false;
          self.q("progress").textContent = "The cancel request failed (" + err.message + "); try again.";
        });
    });
  };

  RunView.prototype.inspect = function (key, focus) {
    this.selected = key;
    this.renderInspector();
    this.renderNodes();
    var box = this.q("inspector");
    if (!focus || !box || box.hidden) return;
    // Beside the graph when wide, right below it when narrow: either way scrolled into view.
    box.scrollIntoView({ block: "nearest" });
    var title = box.querySelector("[data-field=title]");
    if (title) title.focus({ preventScroll: true });
  };

  RunView.prototype.renderInspector = function () {
    var box = this.q("inspector"), s = this.node(this.selected);
    if (!box || s === undefined) return;
    box.hidden = false;
    var isPlan = s.kind === "plan";
    var set = function (role, value) { var n = box.querySelector("[data-field=" + role + "]"); if (n) n.textContent = value; };
    if (s.kind === "tool") {
      // A tool call: what was asked (as the gate let it through), what came back, and the verdict.
      box.setAttribute("data-kind", "tool");
      set("title", "Tool call · " + s.tool + " (" + this.stepName(s.step).toLowerCase() + ")");
      set("worker", s.tool);
      set("status", s.verdict + (s.rule ? " — rule " + s.rule : ""));
      set("instruction-label", "Arguments");
      set("instruction", JSON.stringify(s.arguments || {}));
      set("access", "granted to " + this.stepName(s.step).toLowerCase());
      set("tokens", "—");
      set("cost", "—");
      set("latency", s.latency_ms !== undefined ? Number(s.latency_ms).toFixed(0) + " ms" : "—");
      set("error", s.verdict === "succeeded" ? "" : (s.rule || ""));
      set("output", s.output || "");
      var tl = box.querySelector("[data-field=messages-label]");
      if (tl) tl.hidden = true;
      var tm = box.querySelector("[data-field=messages]");
      if (tm) { tm.hidden = true; tm.textContent = ""; }
      var tr = box.querySelector("[data-field=replay]");
      if (tr) tr.hidden = true;
      return;
    }
    box.setAttribute("data-kind", isPlan ? "plan" : "step");
    set("title", isPlan ? "Planning · round " + s.round : this.stepName(s.index));
    set("worker", (s.worker_key || "?") + (s.worker_name ? " — " + s.worker_name : "") + (s.model ? " (" + s.model + ")" : "") +
      (s.fallback_from ? " (fallback from " + s.fallback_from + ")" : ""));
    // A held plan is not a failure: it waits for an approver (the reason and deadline are in the
    // approval panel); a repaired plan says how many tries it took.
    var held = isPlan && s.status === "awaiting_approval";
    var tries = isPlan && s.attempts > 1 ? (held ? " (written in " + s.attempts + " attempts)" : " after " + s.attempts + " attempts") : "";
    set("status", (held ? "waiting for an approver" + (s.error ? ": " + s.error : "")
      : s.status === "waiting" && s.waiting_reason ? "waiting — " + s.waiting_reason + " (no call yet; its timeout has not started)"
      : s.status) + tries);
    set("instruction-label", isPlan ? "What the conductor does" : "Instruction");
    set("instruction", isPlan ? "Writes the workflow for round " + s.round + ": which worker does what, and which earlier outputs each may read." : (s.instruction || ""));
    set("access", isPlan ? (s.round > 1 ? "the results its re-plan step reads" : "the question") : this.accessText(s.access));
    var u = s.usage || {};
    set("tokens", (u.input_tokens || 0) + " in / " + (u.output_tokens || 0) + " out");
    set("cost", fmtCost(s.cost_usd) + (s.priced === false ? " (unpriced)" : ""));
    set("latency", s.latency_ms !== null && s.latency_ms !== undefined && (!isPlan || s.status !== "running") ? fmtDuration(s.latency_ms) : "—");
    set("error", held ? "" : s.error || "");
    var errorField = box.querySelector("[data-field=error]");
    if (errorField) {
      errorField.hidden = !(s.error && !held);
      if (errorField.previousElementSibling) errorField.previousElementSibling.hidden = errorField.hidden;
    }
    var label = box.querySelector("[data-field=messages-label]");
    if (label) label.hidden = isPlan;
    var self = this;
    var planText = isPlan && s.plan && s.plan.steps ? s.plan.steps.map(function (p, k) {
      return "Step " + (k + 1) + ". " + p.worker_key + " (reads " + self.accessText(p.access, s.plan.steps) + "): " + (p.instruction || "(withheld)");
    }).join("\n") : "";
    // A plan's steps are shown whenever the viewer may see them (round 1 always): only a plan
    // with nothing to show gets the withheld note, in a plan's words, not a held answer's.
    var planWithheld = "(withheld: this run's policy may hold its answer for review, and a re-plan reads earlier outputs)";
    set("output", isPlan ? (planText || (s.withheld ? planWithheld : s.output) || (s.status === "running" ? "(planning…)" : ""))
      : (s.withheld ? WITHHELD : (s.output || s.live || "")));
    var msgs = box.querySelector("[data-field=messages]");
    msgs.hidden = isPlan;
    msgs.textContent = s.withheld ? WITHHELD : "";
    (isPlan ? [] : s.messages || []).forEach(function (m) {
      var item = el("div", { "class": "inspector-message", "data-role-name": m.role });
      item.appendChild(el("div", { "class": "muted" }, m.role));
      item.appendChild(el("pre", {}, m.content));
      msgs.appendChild(item);
    });
    var replay = box.querySelector("[data-field=replay]");
    if (replay) {
      replay.hidden = isPlan || !(s.messages && s.messages.length && this.replayUrl);
      replay.setAttribute("action", this.replayUrl.replace("/0/replay/", "/" + s.index + "/replay/"));
      var field = replay.querySelector("textarea[name=instruction]");
      // Refilled only when another step is opened, so an edit in progress survives live updates.
      if (field && replay.getAttribute("data-step") !== String(s.index)) {
        field.value = s.instruction || "";
        replay.setAttribute("data-step", String(s.index));
      }
    }
  };

  // Side-by-side mode: one row per run in the playground's comparison table.
  RunView.prototype.renderCompareRow = function () {
    var row = document.querySelector("[data-compare-row='" + this.runId + "']"), run = this.run;
    if (!row || !run) return;
    var end = run.finished_at ? Date.parse(run.finished_at) : Date.now();
    var cells = [
      (STRATEGIES[run.strategy] || run.strategy) + (run.preset ? " · " + run.preset : ""),
      run.status,
      String(run.step_count),
      run.input_tokens + " / " + run.output_tokens,
      fmtCost(run.cost_usd) + (run.priced === false ? " (partly unpriced)" : ""),
      run.finished_at && run.latency_ms ? fmtDuration(run.latency_ms) : run.started_at ? fmtDuration(end - Date.parse(run.started_at)) : "—"
    ];
    row.textContent = "";
    cells.forEach(function (text, i) { row.appendChild(el(i ? "td" : "th", i ? {} : { scope: "row" }, text)); });
    row.setAttribute("data-status", run.status);
  };

  RunView.prototype.render = function () {
    this.renderGraph();
    this.renderNodes();
    this.renderStatus();
    this.renderCompareRow();
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

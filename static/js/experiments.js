// /experiments/<id>/: polls the progress endpoint every second while the experiment runs (then
// reloads once to show the results), and draws the accuracy-vs-cost scatter with bundled plotly.js.
(function () {
  "use strict";
  function poll() {
    var box = document.querySelector("[data-testid=experiment-progress]");
    if (!box || box.getAttribute("data-terminal") === "true") { return; }
    var url = box.getAttribute("data-progress-url");
    var bar = box.querySelector("[data-testid=progress-bar]");
    var done = box.querySelector("[data-testid=progress-done]");
    var total = box.querySelector("[data-testid=progress-total]");
    var status = document.querySelector("[data-testid=experiment-status]");
    function tick() {
      fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
        .then(function (r) { return r.ok ? r.json() : null; })
        .then(function (p) {
          if (p) {
            bar.max = p.total; bar.value = p.done; bar.textContent = p.percent + " %";
            done.textContent = String(p.done); total.textContent = String(p.total);
            if (status) { status.textContent = p.status; status.className = "badge badge-" + p.status; }
            if (p.terminal) { window.location.reload(); return; }
          }
          window.setTimeout(tick, 1000);
        })
        .catch(function () { window.setTimeout(tick, 2000); });
    }
    window.setTimeout(tick, 1000);
  }
  function draw() {
    var node = document.getElementById("experiment-scatter");
    var el = document.querySelector("[data-chart=accuracy-cost]");
    if (!node || !el || !window.Plotly) { return; }
    var chart = JSON.parse(node.textContent);
    if (chart.empty) { return; }
    var layout = Object.assign({ margin: { t: 20, r: 10, b: 60, l: 60 }, autosize: true }, chart.layout);
    window.Plotly.newPlot(el, chart.data, layout, { responsive: true, displaylogo: false }).then(function () {
      el.setAttribute("data-points", String(chart.data.length));
      el.setAttribute("data-ready", "true");
    });
  }
  function start() { poll(); draw(); }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();

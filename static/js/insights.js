// /insights/: draws the server-computed figures with the bundled plotly.js; a click on a bar or
// point opens the runs list filtered to it (each point carries its URL as customdata).
(function () {
  "use strict";
  function draw() {
    var node = document.getElementById("insight-charts");
    if (!node || !window.Plotly) { return; }
    var charts = JSON.parse(node.textContent);
    charts.forEach(function (chart) {
      var el = document.querySelector('[data-chart="' + chart.id + '"]');
      if (!el || chart.empty) { return; }
      var layout = Object.assign(
        { margin: { t: 10, r: 10, b: 60, l: 60 }, legend: { orientation: "h", y: -0.25 }, autosize: true },
        chart.layout
      );
      window.Plotly.newPlot(el, chart.data, layout, { responsive: true, displaylogo: false }).then(function () {
        el.setAttribute("data-points", String(chart.data.reduce(function (n, t) { return n + (t.x || []).length; }, 0)));
        el.setAttribute("data-ready", "true");
      });
      el.on("plotly_click", function (ev) {
        var p = ev.points && ev.points[0];
        if (p && typeof p.customdata === "string" && p.customdata.charAt(0) === "/") {
          window.location.assign(p.customdata);
        }
      });
    });
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", draw);
  } else {
    draw();
  }
})();

// Policy editor: expand/collapse all sections. The form works without it (sections with changes
// or errors are rendered open by the server).
(function () {
  "use strict";
  const form = document.getElementById("policy-form");
  if (!form) return;
  form.querySelectorAll(".pe-js").forEach(function (btn) { btn.hidden = false; });
  form.addEventListener("click", function (ev) {
    const btn = ev.target.closest("[data-pe]");
    if (!btn) return;
    const open = btn.dataset.pe === "expand";
    form.querySelectorAll("details.pe-section").forEach(function (d) { d.open = open; });
  });
})();

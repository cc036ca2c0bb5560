// Provider form (issue 42): show only the chosen kind's fields, and test the unsaved settings
// in place. Without this script the server does both (the kind's fields on reload, the test
// result on the page), so nothing here is needed to use the form.
(function () {
  "use strict";
  const form = document.getElementById("provider-form");
  if (!form) return;
  const kind = form.querySelector("select[name=kind]");
  const result = form.querySelector("[data-testid=test-result]");
  const button = form.querySelector("[data-testid=test-connection]");

  function showKind() {
    if (!kind) return;
    const chosen = kind.value;
    form.dataset.kind = chosen;
    form.querySelectorAll(".field[data-kinds]").forEach((wrap) => {
      const used = wrap.dataset.kinds.split(" ").includes(chosen);
      wrap.hidden = !used;
      // A hidden field is not posted: the server ignores another kind's fields anyway.
      wrap.querySelectorAll("input, select, textarea").forEach((el) => { el.disabled = !used; });
    });
    // A field's help follows the kind (the Base URL is optional for OpenAI, required for a compatible endpoint).
    form.querySelectorAll("[data-help-kind]").forEach((help) => { help.hidden = help.dataset.helpKind !== chosen; });
  }

  function say(ok, badge, text) {
    result.replaceChildren();
    const p = document.createElement("p");
    p.className = "msg " + (ok ? "msg-success" : "msg-warning");
    const b = document.createElement("span");
    b.className = "badge " + (ok ? "badge-ok" : "badge-error");
    b.textContent = badge;
    p.append(b, " ", text);
    result.append(p);
    result.dataset.ok = ok ? "true" : "false";
  }

  function clearErrors() {
    form.querySelectorAll(".errorlist.js-error").forEach((el) => el.remove());
  }

  function showErrors(errors) {
    const lines = [];
    Object.entries(errors).forEach(([name, list]) => {
      const wrap = form.querySelector(`.field[data-field="${name}"]`);
      const text = list.map((e) => e.message);
      lines.push(...text);
      if (!wrap) return;
      const ul = document.createElement("ul");
      ul.className = "errorlist js-error";
      ul.dataset.testid = "error-" + name;
      text.forEach((t) => { const li = document.createElement("li"); li.textContent = t; ul.append(li); });
      wrap.append(ul);
    });
    say(false, "not tested", lines.join(" "));
  }

  if (kind) {
    kind.addEventListener("change", showKind);
    showKind();
  }
  if (button && result && window.fetch) {
    button.addEventListener("click", async (ev) => {
      ev.preventDefault();
      clearErrors();
      const data = new FormData(form);
      data.set("action", "test");
      button.disabled = true;
      result.dataset.ok = "";
      result.replaceChildren(document.createTextNode("Testing…"));
      try {
        // Not form.action: the buttons named "action" shadow that property.
        const resp = await fetch(form.getAttribute("action") || window.location.href, {
          method: "POST",
          body: data,
          headers: { Accept: "application/json" },
          credentials: "same-origin",
        });
        const body = await resp.json().catch(() => ({}));
        if (body.errors) {
          showErrors(body.errors);
        } else if (resp.status === 429 || resp.status === 403) {
          say(false, "not tested", body.detail || "Not allowed.");
        } else {
          const ms = body.latency_ms == null ? "" : ` (${Math.round(body.latency_ms)} ms)`;
          const badge = body.ok ? "reachable" : body.stage === "egress" ? "refused" : "failed";
          say(!!body.ok, badge, (body.detail || "No answer.") + ms);
        }
      } catch (err) {
        say(false, "not tested", "The test could not be sent: " + err.message);
      } finally {
        button.disabled = false;
      }
    });
  }
})();

// Thumbs (the team's `helpful` metric) and the feedback list under each run view. Posts to
// /api/runs/<id>/feedback/ with the session and its CSRF token; every value goes in as text
// (comments are user input). Loaded once per run view: sections are marked when wired.
(function () {
  "use strict";

  function label(item) {
    const value = item.value === 1 ? "👍 yes" : item.value === 0 ? "👎 no" : String(item.value);
    return item.metric + ": " + value;
  }

  function render(section, items) {
    const list = section.querySelector("[data-role=feedback-list]");
    list.replaceChildren();
    if (!items.length) {
      const li = document.createElement("li");
      li.className = "muted";
      li.textContent = "No feedback yet.";
      list.appendChild(li);
      return;
    }
    for (const item of items) {
      const li = document.createElement("li");
      li.dataset.testid = "feedback-item";
      li.dataset.source = item.source;
      li.dataset.metric = item.metric;
      const what = document.createElement("strong");
      what.textContent = label(item);
      li.appendChild(what);
      li.appendChild(document.createTextNode(" — " + item.who + " (" + item.source + ", " +
        new Date(item.created_at).toLocaleString() + ")"));
      if (item.comment) {
        const q = document.createElement("q");
        q.textContent = item.comment;
        li.appendChild(document.createTextNode(" "));
        li.appendChild(q);
      }
      list.appendChild(li);
    }
  }

  function load(section) {
    return fetch(section.dataset.url, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then((r) => (r.ok ? r.json() : Promise.reject(new Error("HTTP " + r.status))))
      .then((items) => render(section, items))
      .catch(() => {
        section.querySelector("[data-role=feedback-status]").textContent = "Could not load the feedback.";
      });
  }

  function send(section, button) {
    const status = section.querySelector("[data-role=feedback-status]");
    const comment = section.querySelector("[data-role=comment]");
    const token = section.querySelector("input[name=csrfmiddlewaretoken]");
    const buttons = section.querySelectorAll("button[data-value]");
    buttons.forEach((b) => { b.disabled = true; });
    status.textContent = "Saving…";
    fetch(section.dataset.url, {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", Accept: "application/json", "X-CSRFToken": token ? token.value : "" },
      body: JSON.stringify({ metric: "helpful", value: button.dataset.value === "true", comment: comment.value, source: "thumbs" }),
    })
      .then((r) => r.json().then((body) => ({ ok: r.ok, body })))
      .then(({ ok, body }) => {
        if (!ok) {
          const first = body && typeof body === "object" ? Object.values(body)[0] : null;
          throw new Error(Array.isArray(first) ? first[0] : (first || "refused"));
        }
        buttons.forEach((b) => b.setAttribute("aria-pressed", String(b === button)));
        comment.value = "";
        status.textContent = "Thanks: feedback recorded.";
        return load(section);
      })
      .catch((err) => { status.textContent = "Not saved: " + err.message; })
      .finally(() => buttons.forEach((b) => { b.disabled = false; }));
  }

  function wire(section) {
    if (section.dataset.wired) return;
    section.dataset.wired = "true";
    section.querySelectorAll("button[data-value]").forEach((button) => {
      button.addEventListener("click", () => send(section, button));
    });
    load(section);
    // Evaluators score a run once it finished: reload the list when its answer arrives.
    const answer = section.closest("[data-run-view]")?.querySelector("[data-testid=final-answer]");
    if (answer && window.MutationObserver) {
      const watch = new MutationObserver(() => {
        if (answer.dataset.ready === "true") { watch.disconnect(); setTimeout(() => load(section), 1500); }
      });
      watch.observe(answer, { attributes: true, attributeFilter: ["data-ready"] });
    }
  }

  function start() { document.querySelectorAll("[data-feedback]").forEach(wire); }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();

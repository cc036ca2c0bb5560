// Review desk keyboard shortcuts: j/k move between runs, a approves, f flags (focuses the reason),
// x selects for bulk sign-off, r resolves an open flag (focuses the note). Ignored while typing.
(function () {
  "use strict";
  const items = Array.from(document.querySelectorAll("[data-testid=review-item]"));
  const counter = document.querySelector("[data-testid=bulk-count]");
  let current = -1;

  function select(index) {
    if (!items.length) return;
    current = Math.max(0, Math.min(items.length - 1, index));
    items.forEach((el, i) => el.classList.toggle("is-current", i === current));
    items[current].focus({ preventScroll: true });
    items[current].scrollIntoView({ block: "nearest" });
  }

  function updateCount() {
    if (counter) counter.textContent = String(document.querySelectorAll(".bulk-pick:checked").length);
  }

  document.addEventListener("change", (event) => {
    if (event.target.classList && event.target.classList.contains("bulk-pick")) updateCount();
  });

  items.forEach((el, i) => el.addEventListener("focusin", () => {
    current = i;
    items.forEach((other, j) => other.classList.toggle("is-current", j === i));
  }));

  document.addEventListener("keydown", (event) => {
    const tag = (event.target.tagName || "").toLowerCase();
    if (event.ctrlKey || event.metaKey || event.altKey || ["input", "textarea", "select"].includes(tag)) return;
    const item = items[current];
    switch (event.key) {
      case "j": select(current + 1); break;
      case "k": select(current - 1); break;
      case "a": if (item) item.querySelector("[data-action=approve]")?.click(); break;
      case "f": if (item) item.querySelector("[data-action=flag-reason]")?.focus(); break;
      case "r": if (item) item.querySelector("[data-action=resolve-note]")?.focus(); break;
      case "x": {
        const box = item && item.querySelector(".bulk-pick");
        if (box) { box.checked = !box.checked; updateCount(); }
        break;
      }
      default: return;
    }
    event.preventDefault();
  });
  // The first run is the current one from the start (highlighted, not focused: focus stays put).
  if (items.length) { current = 0; items[0].classList.add("is-current"); }
  updateCount();
})();

// The context inspector's pages while a session runs: the part of a page marked
// data-live is fetched again every 5 seconds (the same URL, with the header
// x-contextgate-fragment: live, which answers that part only) and swapped in when it
// changed. A 401 means the session ended: the page reloads into the key form. Nothing is
// polled while the tab is hidden, nor swapped while text in it is selected (to copy).
"use strict";

(function () {
  const EVERY = 5000;
  const live = document.querySelector("[data-live]");
  if (!live) {
    return;
  }
  const status = document.querySelector("[data-live-status]");
  let shown = null;

  function mark(text, stale) {
    if (status) {
      status.textContent = text;
      status.classList.toggle("stale", stale);
    }
  }

  function selecting() {
    const selection = window.getSelection();
    return selection !== null && !selection.isCollapsed && live.contains(selection.anchorNode);
  }

  async function refresh() {
    if (document.hidden) {
      return;
    }
    try {
      const response = await fetch(window.location.href, {
        headers: { "x-contextgate-fragment": "live" },
        credentials: "same-origin",
        cache: "no-store",
      });
      if (response.status === 401) {
        window.location.reload();
        return;
      }
      if (!response.ok) {
        mark("not updating (" + response.status + ")", true);
        return;
      }
      const html = await response.text();
      if (html !== shown && !selecting()) {
        live.innerHTML = html;
        shown = html;
      }
      mark("live · " + new Date().toLocaleTimeString(), false);
    } catch (error) {
      mark("not updating (gateway unreachable)", true);
    }
  }

  window.setInterval(refresh, EVERY);
  document.addEventListener("visibilitychange", refresh);
})();

// Live pages, served by the console itself: when /events says the journal (or fleet store)
// moved, fetch this page again and swap in each part marked data-live. A part holding a form
// the person has started to fill in is left as it is, with a note, so no typing is lost.
(function () {
  "use strict";
  var version = document.body.getAttribute("data-version");
  if (!version || !window.EventSource || !document.querySelector("[data-live]")) return;
  var busy = false, again = false, status = document.getElementById("live");

  function say(text) { if (status) status.textContent = text; }

  function edited(part) {
    return Array.prototype.some.call(part.querySelectorAll("input, textarea, select"), function (i) {
      if (i.type === "hidden" || i.type === "submit") return false;
      if (i.type === "radio" || i.type === "checkbox") return i.checked !== i.defaultChecked;
      return i.value !== i.defaultValue;
    });
  }

  function swap(html) {
    var fresh = new DOMParser().parseFromString(html, "text/html");
    document.querySelectorAll("[data-live]").forEach(function (old) {
      var name = old.getAttribute("data-live");
      var part = fresh.querySelector('[data-live="' + name + '"]');
      if (!part) return;
      if (edited(old)) {
        old.setAttribute("data-stale", "true");
        return;
      }
      old.replaceWith(document.importNode(part, true));
    });
    document.body.setAttribute("data-refreshes", String(Number(document.body.getAttribute("data-refreshes") || 0) + 1));
  }

  function refresh() {
    if (busy) { again = true; return; }
    busy = true;
    fetch(location.href, { credentials: "same-origin", cache: "no-store" })
      .then(function (r) { if (!r.ok) throw new Error("HTTP " + r.status); return r.text(); })
      .then(function (html) { swap(html); say("live"); })
      .catch(function (e) { say("live updates paused (" + e.message + "): reload the page"); })
      .then(function () { busy = false; if (again) { again = false; refresh(); } });
  }

  var run = document.body.getAttribute("data-run");  // a run's page follows that run only
  var feed = new EventSource("/events?since=" + encodeURIComponent(version) +
    (run ? "&run=" + encodeURIComponent(run) : ""));
  feed.addEventListener("changed", function (e) { version = e.data; refresh(); });
  feed.addEventListener("open", function () { say("live"); });
  feed.addEventListener("error", function () { if (feed.readyState !== 2) say("reconnecting…"); });
  feed.addEventListener("broken", function (e) { feed.close(); say("live updates stopped: " + e.data); });
})();

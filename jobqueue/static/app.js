// Behaviour the pages need beyond HTMX attributes. No inline script anywhere: the
// Content-Security-Policy allows scripts from this origin only.
(function () {
  "use strict";

  // --- Polling (elements marked data-poll) pauses while the tab is hidden and catches up at
  // once when it is shown again (their hx-trigger listens for jq:visible).
  document.addEventListener("htmx:beforeRequest", function (evt) {
    var elt = evt.detail.elt;
    if (document.hidden && elt && elt.hasAttribute && elt.hasAttribute("data-poll")) {
      evt.preventDefault();
    }
  });
  document.addEventListener("visibilitychange", function () {
    if (!document.hidden) {
      document.dispatchEvent(new Event("jq:visible"));
    }
  });

  // Plain forms (no HTMX) that need a confirmation: <form data-confirm="question">.
  document.addEventListener("submit", function (evt) {
    var form = evt.target;
    if (form.hasAttribute && form.hasAttribute("data-confirm") && !window.confirm(form.getAttribute("data-confirm"))) {
      evt.preventDefault();
    }
  });

  // --- Ticked rows stay ticked. The live refresh swaps a row that changed, checkbox and all;
  // the ticks are kept here by job id and put back on the new row. A new filter (the whole
  // table swapped) starts with none.
  var ticked = new Set();
  function restoreTicks(root) {
    if (!root || !root.querySelectorAll) {
      return;
    }
    var boxes = root.matches && root.matches("input[name=ids]") ? [root] : root.querySelectorAll("input[name=ids]");
    boxes.forEach(function (box) {
      if (ticked.has(box.value)) {
        box.checked = true;
      }
    });
  }
  document.addEventListener("change", function (evt) {
    var box = evt.target;
    if (!box.matches) {
      return;
    }
    if (box.matches("input[data-select-all]")) {
      var name = box.getAttribute("data-select-all");
      document.querySelectorAll('input[type=checkbox][name="' + name + '"]').forEach(function (other) {
        other.checked = box.checked;
        if (box.checked) { ticked.add(other.value); } else { ticked.delete(other.value); }
      });
    } else if (box.matches("input[name=ids]")) {
      if (box.checked) { ticked.add(box.value); } else { ticked.delete(box.value); }
    }
  });
  document.addEventListener("htmx:oobBeforeSwap", function (evt) {
    restoreTicks(evt.detail.fragment);
  });
  document.addEventListener("htmx:beforeSwap", function (evt) {
    if (evt.detail.target && evt.detail.target.id === "jobs-table") {
      ticked.clear();
    }
  });
  document.addEventListener("htmx:load", function (evt) {
    restoreTicks(evt.detail.elt);
    refreshTimes(evt.detail.elt);
  });

  // --- "Cancel" on a confirmation: empty its container instead of following the link.
  document.addEventListener("click", function (evt) {
    var link = evt.target.closest && evt.target.closest("[data-dismiss]");
    if (!link) {
      return;
    }
    var target = document.querySelector(link.getAttribute("data-dismiss"));
    if (target) {
      evt.preventDefault();
      target.innerHTML = "";
    }
  });

  // --- Times. The server renders <time datetime=... data-now=... data-rel=mode> relative to
  // the database's clock; they are kept current here from when they arrived (so this browser's
  // clock being off does not matter), with the exact time on hover, in UTC or local time.
  var localTime = false;
  try { localTime = window.localStorage.getItem("jq-time-zone") === "local"; } catch (e) { /* private mode */ }

  function human(seconds) {
    seconds = Math.abs(seconds);
    if (seconds < 1) { return Math.round(seconds * 1000) + " ms"; }
    if (seconds < 10) { return seconds.toFixed(1) + " s"; }
    if (seconds < 60) { return Math.round(seconds) + " s"; }
    if (seconds < 3600) { return Math.round(seconds / 60) + " min"; }
    if (seconds < 86400) { return (seconds / 3600).toFixed(1) + " h"; }
    return (seconds / 86400).toFixed(1) + " d";
  }
  function pad(n) { return (n < 10 ? "0" : "") + n; }
  function exact(date) {
    if (localTime) {
      var offset = -date.getTimezoneOffset();
      var zone = "UTC" + (offset >= 0 ? "+" : "-") + pad(Math.floor(Math.abs(offset) / 60)) +
        (Math.abs(offset) % 60 ? ":" + pad(Math.abs(offset) % 60) : "");
      return date.getFullYear() + "-" + pad(date.getMonth() + 1) + "-" + pad(date.getDate()) + " " +
        pad(date.getHours()) + ":" + pad(date.getMinutes()) + ":" + pad(date.getSeconds()) + " " + zone + " (local)";
    }
    return date.toISOString().slice(0, 19).replace("T", " ") + " UTC";
  }
  function refreshTimes(root) {
    if (!root || !root.querySelectorAll) {
      return;
    }
    var nowMs = Date.now();
    root.querySelectorAll("time[datetime]").forEach(function (el) {
      var at = Date.parse(el.getAttribute("datetime"));
      if (isNaN(at)) {
        return;
      }
      if (el.hasAttribute("data-abs")) {
        el.textContent = exact(new Date(at));
        return;
      }
      if (!el.hasAttribute("data-rel")) {
        return;
      }
      if (!el._jqSeen) {
        el._jqSeen = nowMs;
      }
      var serverNow = Date.parse(el.getAttribute("data-now")) + (nowMs - el._jqSeen);
      var delta = (at - serverNow) / 1000;
      var mode = el.getAttribute("data-rel");
      var text;
      if (mode === "for") {
        text = human(delta);
      } else if (mode === "left") {
        text = delta >= 0 ? "in " + human(delta) : "expired " + human(delta) + " ago";
      } else {
        text = delta > 0.5 ? "in " + human(delta) : human(delta) + " ago";
      }
      if (el.textContent !== text) {
        el.textContent = text;
      }
      el.title = exact(new Date(at));
    });
  }
  function showZone() {
    var button = document.getElementById("time-zone");
    if (button) {
      button.textContent = localTime ? "Times: local" : "Times: UTC";
      button.setAttribute("aria-pressed", localTime ? "true" : "false");
    }
    refreshTimes(document);
  }
  document.addEventListener("click", function (evt) {
    if (evt.target && evt.target.id === "time-zone") {
      localTime = !localTime;
      try { window.localStorage.setItem("jq-time-zone", localTime ? "local" : "utc"); } catch (e) { /* ignore */ }
      showZone();
    }
  });
  document.addEventListener("DOMContentLoaded", showZone);
  window.setInterval(function () {
    if (!document.hidden) {
      refreshTimes(document);
    }
  }, 2000);
})();

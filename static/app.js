// Behaviour the pages need beyond HTMX attributes. No inline script anywhere: the
// Content-Security-Policy allows scripts from this origin only.
(function () {
  "use strict";

  // Polling (elements marked data-poll) pauses while the tab is hidden and catches up at once
  // when it is shown again.
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

  // "Select all" checkboxes for bulk actions.
  document.addEventListener("change", function (evt) {
    var box = evt.target;
    if (!box.matches || !box.matches("input[data-select-all]")) {
      return;
    }
    var name = box.getAttribute("data-select-all");
    document.querySelectorAll('input[type=checkbox][name="' + name + '"]').forEach(function (other) {
      other.checked = box.checked;
    });
  });
})();

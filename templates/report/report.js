// Clicking a grid cell opens its detail in a panel beside the grid; so does loading the page
// with #open=<cell-id> (a link to one cell; also what the tests use). Escape closes the panel.
(function () {
  "use strict";
  function each(selector, fn) {
    var found = document.querySelectorAll(selector);
    for (var i = 0; i < found.length; i++) { fn(found[i]); }
  }
  function closePanel() {
    each("details.cell-detail.panel", function (d) { d.classList.remove("panel"); d.open = false; });
    each(".grid td.selected", function (td) { td.classList.remove("selected"); });
  }
  function openCell(id) {
    var detail = document.getElementById("cell-" + id);
    if (!detail) { return false; }
    closePanel();
    detail.classList.add("panel");
    detail.open = true;
    each(".grid td.cell", function (td) {
      if (td.getAttribute("data-cell") === id) { td.classList.add("selected"); }
    });
    return true;
  }
  function fromHash() {
    var match = /^#(?:open=|cell-)(.+)$/.exec(window.location.hash);
    if (match) { openCell(decodeURIComponent(match[1])); }
  }
  document.addEventListener("click", function (event) {
    var el = event.target;
    var cell = el.closest ? el.closest(".grid td.cell") : null;
    if (cell) {
      event.preventDefault();
      var id = cell.getAttribute("data-cell");
      openCell(id);
      history.replaceState(null, "", "#open=" + encodeURIComponent(id));
      return;
    }
    if (el.closest && el.closest("button.close")) {
      event.preventDefault();
      closePanel();
      history.replaceState(null, "", "#");
      return;
    }
    var button = el.closest ? el.closest("button[data-expand]") : null;
    if (button) {
      closePanel();
      var open = button.getAttribute("data-expand") === "all";
      each("details.cell-detail", function (d) { d.open = open; });
    }
  });
  document.addEventListener("keydown", function (event) {
    if (event.key === "Escape") { closePanel(); }
  });
  window.addEventListener("hashchange", fromHash);
  fromHash();
})();

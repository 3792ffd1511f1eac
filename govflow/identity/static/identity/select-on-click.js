// Selects the whole value of a field marked data-select-on-click when it is clicked, so a
// one-time secret (a new API key) is copied whole. A static file: the CSP allows no inline
// script or event handler attribute.
"use strict";
document.addEventListener("click", function (event) {
  const field = event.target.closest("[data-select-on-click]");
  if (field) {
    field.select();
  }
});

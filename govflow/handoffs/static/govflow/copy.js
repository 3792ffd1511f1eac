// Copy buttons on the desk: <button class="govflow-copy" data-copy="TEXT">. No framework.
"use strict";
document.addEventListener("click", function (event) {
  var button = event.target.closest("button.govflow-copy");
  if (!button || !navigator.clipboard) {
    return;
  }
  navigator.clipboard.writeText(button.dataset.copy).then(function () {
    button.dataset.copied = "true";
    button.textContent = button.dataset.done || "Copied";
  });
});

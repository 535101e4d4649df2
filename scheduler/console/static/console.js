// idlegpu console: copy buttons and keyboard-friendly filters (no dependencies)
"use strict";
document.addEventListener("click", function (event) {
  var button = event.target.closest("button.copy");
  if (!button) return;
  var text = button.getAttribute("data-copy");
  var done = function () { button.textContent = "copied"; setTimeout(function () { button.textContent = "copy"; }, 1500); };
  if (navigator.clipboard && window.isSecureContext) {
    navigator.clipboard.writeText(text).then(done, function () {});
  } else {  // plain http on a cluster: select the id so Ctrl+C copies it
    var code = button.parentNode.querySelector("code");
    if (code) { var range = document.createRange(); range.selectNodeContents(code);
      var sel = window.getSelection(); sel.removeAllRanges(); sel.addRange(range); }
    try { document.execCommand("copy"); done(); } catch (e) { /* selection stays */ }
  }
});
document.querySelectorAll("form.filters select").forEach(function (select) {
  select.addEventListener("change", function () { select.form.submit(); });
});

// idlegpu console: live validation of a pasted request through the API (POST
// /v1/requests/validate with the session's CSRF token), the error at its field, a preview of
// the units it expands to, and the examples of examples/jobs/.
"use strict";
(function () {
  var form = document.getElementById("submit-form");
  var area = document.getElementById("request");
  var error = document.getElementById("field-error");
  var validity = document.getElementById("validity");
  var preview = document.querySelector("#preview tbody");
  var example = document.getElementById("example");
  var csrf = form.querySelector("input[name=csrf]").value;
  var timer = null, seq = 0;

  function lineOf(field) {  // the line of the YAML where the field's last key is written
    if (!field) return null;
    var key = field.split(".").filter(function (p) { return !/^[0-9]+$/.test(p); }).pop();
    if (!key) return null;
    var lines = area.value.split("\n");
    for (var i = 0; i < lines.length; i++)
      if (new RegExp("^\\s*(- )?" + key.replace(/[.*+?^${}()|[\]\\]/g, "\\$&") + "\\s*:").test(lines[i])) return i + 1;
    return null;
  }
  function showError(e) {
    error.replaceChildren();
    if (!e) { error.hidden = true; error.setAttribute("data-field", ""); area.classList.remove("invalid");
      area.removeAttribute("aria-invalid"); return; }
    if (e.field) {
      var strong = document.createElement("strong"); strong.className = "field"; strong.textContent = e.field;
      error.appendChild(strong);
      var at = lineOf(e.field);
      error.appendChild(document.createTextNode((at ? " (line " + at + ")" : "") + ": "));
    }
    var message = e.message.replace(/^request: /, "");
    if (e.field && message.indexOf(e.field + ": ") === 0) message = message.slice(e.field.length + 2);
    error.appendChild(document.createTextNode(message));
    error.setAttribute("data-field", e.field || "");
    error.hidden = false; area.classList.add("invalid"); area.setAttribute("aria-invalid", "true");
  }
  function hours(s) { return s === null || s === undefined ? "—" : s < 3600 ? Math.round(s / 60) + " min" : (s / 3600).toFixed(1) + " h"; }
  function showPreview(units) {
    preview.replaceChildren();
    (units || []).forEach(function (u) {
      var tr = document.createElement("tr");
      [u.step, u.member, u.gpus, hours(u.runtime_estimate_s), u.image].forEach(function (v, k) {
        var td = document.createElement("td"); td.textContent = String(v); if (k === 2) td.className = "num"; tr.appendChild(td);
      });
      preview.appendChild(tr);
    });
  }
  function validate() {
    var mine = ++seq;
    if (!area.value.trim()) { showError(null); showPreview([]); validity.textContent = ""; return; }
    validity.textContent = "checking…";
    fetch(form.getAttribute("data-validate"), { method: "POST", credentials: "same-origin",
      headers: { "Content-Type": "application/yaml", "X-CSRF-Token": csrf }, body: area.value })
      .then(function (r) { return r.json().then(function (body) { return { ok: r.ok, body: body }; }); })
      .then(function (res) {
        if (mine !== seq) return;
        if (res.ok) { showError(null); showPreview(res.body.units);
          validity.textContent = "valid: " + res.body.units.length + " unit(s)"; }
        else { showError(res.body.error); showPreview([]); validity.textContent = "not valid"; }
        form.setAttribute("data-checked", String(mine));
      })
      .catch(function (e) { if (mine === seq) validity.textContent = "could not check: " + e.message; });
  }
  area.addEventListener("input", function () { clearTimeout(timer); timer = setTimeout(validate, 400); });
  example.addEventListener("change", function () {
    if (!example.value) return;
    fetch(example.getAttribute("data-source") + encodeURIComponent(example.value), { credentials: "same-origin" })
      .then(function (r) { return r.text(); })
      .then(function (t) { area.value = t; validate(); });
  });
  if (area.value.trim()) validate();
})();

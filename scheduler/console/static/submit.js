// idlegpu console: live validation of a pasted or uploaded request through the API (POST
// /v1/requests/validate with the session's CSRF token), the error at its field, a preview of
// the units it expands to with their runtime estimates and tonight's estimated starts, and
// the example requests.
"use strict";
(function () {
  var form = document.getElementById("submit-form");
  var area = document.getElementById("request");
  var error = document.getElementById("field-error");
  var validity = document.getElementById("validity");
  var preview = document.querySelector("#preview tbody");
  var example = document.getElementById("example");
  var upload = document.getElementById("upload");
  var uploadStatus = document.getElementById("upload-status");
  var maxBytes = Number(form.getAttribute("data-max-bytes"));
  var zones = JSON.parse(form.getAttribute("data-zones") || "{}");
  var DAYS = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"];
  var MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
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
  // an ISO time of the API (in the pool's zone, with its offset) as the pages show times:
  // "Thu 29 Jan 02:10 KST"
  function local(iso) {
    var m = /^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2})(?::[\d.]+)?([+-]\d{2}:\d{2}|Z)$/.exec(iso || "");
    if (!m) return iso || "—";
    var day = new Date(Date.UTC(+m[1], +m[2] - 1, +m[3])).getUTCDay();
    var offset = m[6] === "Z" ? "+00:00" : m[6];
    return DAYS[day] + " " + m[3] + " " + MONTHS[+m[2] - 1] + " " + m[4] + ":" + m[5] + " " + (zones[offset] || "UTC" + offset);
  }
  function cell(tr, text, className) {
    var td = document.createElement("td"); td.textContent = String(text); if (className) td.className = className; tr.appendChild(td); return td;
  }
  function showPreview(units) {
    preview.replaceChildren();
    (units || []).forEach(function (u) {
      var tr = document.createElement("tr");
      var plan = u.plan || {}, runtime = u.runtime || {};
      cell(tr, u.step); cell(tr, u.member); cell(tr, u.gpus, "num");
      var est = cell(tr, hours(runtime.seconds) + " ");
      var source = document.createElement("span"); source.className = "source"; source.textContent = "(" + (runtime.source || "?") + ")";
      est.appendChild(source);
      var start = cell(tr, "", "start");
      if (plan.start_at) { var time = document.createElement("time"); time.setAttribute("datetime", plan.start_at); time.textContent = local(plan.start_at); start.appendChild(time); }
      else start.textContent = "not tonight";
      cell(tr, plan.reason || "");
      var image = cell(tr, ""); var code = document.createElement("code"); code.textContent = u.image; image.appendChild(code);
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
  upload.addEventListener("change", function () {
    var file = upload.files && upload.files[0];
    if (!file) return;
    if (file.size > maxBytes) {
      uploadStatus.textContent = file.name + " is " + file.size + " bytes, over the server's limit of " + maxBytes + " (api.max_body_bytes); not loaded";
      uploadStatus.className = "error"; upload.value = ""; return;
    }
    var reader = new FileReader();
    reader.onload = function () {
      var text = String(reader.result);
      // a NUL or an undecodable byte (shown as U+FFFD): not a YAML text file
      if (/[\u0000\ufffd]/.test(text)) {
        uploadStatus.textContent = file.name + " is not a text file (a request is YAML text); not loaded";
        uploadStatus.className = "error"; upload.value = ""; return;
      }
      area.value = text; example.value = "";
      uploadStatus.textContent = "loaded " + file.name + " (" + file.size + " bytes)"; uploadStatus.className = "help";
      validate();
    };
    reader.onerror = function () { uploadStatus.textContent = file.name + " could not be read"; uploadStatus.className = "error"; };
    reader.readAsText(file, "utf-8");
  });
  if (area.value.trim()) validate();
})();

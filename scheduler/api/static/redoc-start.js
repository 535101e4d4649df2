// Starts ReDoc on the OpenAPI document the page names (no inline script, no web fonts).
Redoc.init(document.body.dataset.openapi, { disableSearch: false, hideDownloadButton: false },
  document.getElementById("redoc"));

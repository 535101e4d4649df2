// Starts Swagger UI on the OpenAPI document the page names (no inline script: the CSP allows
// scripts from this origin only).
window.ui = SwaggerUIBundle({
  url: document.body.dataset.openapi,
  dom_id: "#swagger-ui",
  deepLinking: true,
  validatorUrl: null,
  presets: [SwaggerUIBundle.presets.apis],
});

// Draw every chart of the page: each <canvas data-chart="ID"> gets the Chart.js configuration the server
// embedded as <script type="application/json" id="ID"> (data only; the strict CSP allows no inline code).
"use strict";
document.addEventListener("DOMContentLoaded", function () {
  document.querySelectorAll("canvas[data-chart]").forEach(function (canvas) {
    var source = document.getElementById(canvas.dataset.chart);
    new Chart(canvas, JSON.parse(source.textContent));
  });
});

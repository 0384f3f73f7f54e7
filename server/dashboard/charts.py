"""Chart.js configurations of the dashboard's charts, built on the server from the same rows the pages show
as tables. A page embeds each one as `<script type="application/json">` (data, not code, so the strict CSP
holds) and the static dashboard.js hands it to Chart.js unchanged."""

from __future__ import annotations

from typing import Any

NO_ANIMATION = {"animation": False, "responsive": True, "maintainAspectRatio": False}


def _axis(title: str, **extra: Any) -> dict[str, Any]:
    return {"title": {"display": True, "text": title}, **extra}


def accuracy_over_plan(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Server-evaluated accuracy per round number of a plan (rounds without a measurement are left out)."""
    measured = [summary for summary in rounds if summary["accuracy"] is not None]
    return {"type": "line", "data": {
        "labels": [f"round {summary['number']}" for summary in measured],
        "datasets": [{"label": "accuracy (server evaluation)", "data": [summary["accuracy"] for summary in measured]}],
    }, "options": {**NO_ANIMATION, "scales": {"y": _axis("accuracy")}}}


def pareto(points: list[dict[str, Any]], latency_budget_ms: float | None) -> dict[str, Any]:
    """Accuracy vs latency: every model, the Pareto front as a line, and the budget as a vertical line."""
    datasets: list[dict[str, Any]] = [
        {"label": "models", "data": [{"x": p["latency_ms"], "y": p["accuracy"]} for p in points]},
        {"label": "Pareto front", "showLine": True,
         "data": [{"x": p["latency_ms"], "y": p["accuracy"]} for p in points if p["on_front"]]},
    ]
    if latency_budget_ms is not None and points:
        accuracies = [p["accuracy"] for p in points]
        datasets.append({"label": f"budget {latency_budget_ms:g} ms", "showLine": True, "borderDash": [6, 4],
                         "pointRadius": 0, "data": [{"x": latency_budget_ms, "y": min(accuracies)},
                                                    {"x": latency_budget_ms, "y": max(accuracies)}]})
    return {"type": "scatter", "data": {"datasets": datasets}, "options": {
        **NO_ANIMATION, "scales": {"x": _axis("latency (ms)"), "y": _axis("accuracy")}}}


def latency_per_class(classes: list[dict[str, Any]]) -> dict[str, Any]:
    """Grouped bars per device class: the card's latency, the server's prediction, the devices' telemetry."""
    series = (("card", "card_ms"), ("predicted (server)", "predicted_ms"), ("measured (telemetry)", "measured_ms"))
    return {"type": "bar", "data": {
        "labels": [row["device_class"] for row in classes],
        "datasets": [{"label": label, "data": [row[key] for row in classes]} for label, key in series],
    }, "options": {**NO_ANIMATION, "scales": {"y": _axis("latency (ms)", beginAtZero=True)}}}


def devices_per_class(counts: list[dict[str, Any]]) -> dict[str, Any]:
    return {"type": "bar", "data": {
        "labels": [row["device_class"] or "(none)" for row in counts],
        "datasets": [{"label": "devices", "data": [row["devices"] for row in counts]}],
    }, "options": {**NO_ANIMATION, "scales": {"y": _axis("devices", beginAtZero=True)}}}

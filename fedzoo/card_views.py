"""How a model card reads in a terminal: its fields as (name, value) rows, the same for a card from a
local zoo (`fedzoo zoo show`) and one from a server (`fedzoo models show`)."""

from __future__ import annotations

from typing import Any


def card_fields(card: dict[str, Any]) -> list[tuple[str, Any]]:
    """A card (as JSON) as rows: provenance, metrics, cost, then the latency of each device class."""
    fields = [(name, card.get(name)) for name in ("id", "family", "version", "parent_id", "task", "precision")]
    fields += [(f"metrics.{name}", value) for name, value in card["metrics"].items()]
    fields += [(name, card.get(name)) for name in ("macs", "params", "size_bytes", "sha256", "training_graph",
                                                   "created_at")]
    fields += [(f"latency_ms[{device_class}]", f"{latency['median_ms']:.3f} ({latency.get('source', '?')})")
               for device_class, latency in sorted(card.get("latency_ms", {}).items())]
    return fields

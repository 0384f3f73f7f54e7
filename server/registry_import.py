"""Prepare the registry and import a zoo directory into it: what `fedzoo serve` does before serving, in a
process of its own (see `fedzoo.server.cli`)."""

from __future__ import annotations

from pathlib import Path

from fedzoo.server import registry
from fedzoo.server.app import prepare_registry
from fedzoo.server.blobstore import FileBlobStore
from fedzoo.server.card_keys import FleetKeys
from fedzoo.server.config import ServerConfig
from fedzoo.server.db import Database
from fedzoo.server.latency import LatencyEstimator, default_estimator


def import_zoo_into_registry(config: ServerConfig, estimator: LatencyEstimator, zoo_dir: Path) -> tuple[int, int]:
    """Publish every card of a zoo directory, each checked against the server's trusted keys; returns (cards
    in the zoo, newly published)."""
    check_card = FleetKeys.from_config(config).check_publishable
    database = Database(config.database_url)
    try:
        with database.session() as session:
            results = registry.import_zoo(session, FileBlobStore(config.blob_dir), estimator, zoo_dir, check_card)
    finally:
        database.dispose()
    return len(results), sum(result.created for result in results)


def prepare_and_import(config: ServerConfig, zoo_dir: Path | None) -> tuple[tuple[int, int], tuple[int, int] | None]:
    """Migrate the registry, refresh latency estimates and import a zoo; returns (models, devices)
    recomputed and (cards in the zoo, newly published), the latter None without a zoo."""
    estimator = default_estimator()
    refreshed = prepare_registry(config, estimator)
    imported = import_zoo_into_registry(config, estimator, zoo_dir) if zoo_dir is not None else None
    return refreshed, imported

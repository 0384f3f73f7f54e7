"""What every request handler works with: settings, database, blob store, latency estimator, signing keys."""

from __future__ import annotations

from dataclasses import dataclass, field

from fedzoo.server.blobstore import BlobStore
from fedzoo.server.card_keys import FleetKeys
from fedzoo.server.config import ServerConfig
from fedzoo.server.db import Database
from fedzoo.server.devices import DeviceCache
from fedzoo.server.latency import LatencyEstimator


@dataclass
class ServerContext:
    config: ServerConfig
    db: Database
    store: BlobStore
    estimator: LatencyEstimator
    keys: FleetKeys
    devices: DeviceCache = field(default_factory=DeviceCache)

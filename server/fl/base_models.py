"""The base model of a round: the published version devices fine-tune, read once from the blob store.

Every stage needs it: selection hands its blobs to devices, collection checks deltas against its
parameters, aggregation starts from them and publication derives the next version from its card.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy.orm import Session

from fedzoo.edge.trainer import training_graph_state, variance_names
from fedzoo.aggregation.strategies import Parameters
from fedzoo.cards import ModelCard
from fedzoo.edge.onnx_initializers import read_float_initializers
from fedzoo.errors import InvalidInputError
from fedzoo.server import registry
from fedzoo.server.blobstore import BlobStore

UPLOAD_OVERHEAD_BYTES = 64 * 1024  # npz headers and int8 scales on top of the raw float32 deltas
MAX_CACHED_BASES = 8


@dataclass(frozen=True)
class RoundBase:
    """What the round needs to know about its base model: the trainable parameters, the BatchNorm running
    statistics devices update (`fedzoo.aggregation.running_statistics`) and where the blobs are."""

    card: ModelCard
    onnx_bytes: bytes
    parameters: Parameters
    statistics: Parameters = field(default_factory=dict)
    variances: frozenset[str] = frozenset()  # the statistics that are running variances

    @property
    def float32_bytes(self) -> int:
        return sum(value.size * 4 for value in (*self.parameters.values(), *self.statistics.values()))


def max_upload_bytes(base: RoundBase) -> int:
    """The largest update a device may upload against this base: its float32 deltas plus archive overhead."""
    return base.float32_bytes + UPLOAD_OVERHEAD_BYTES


class BaseModels:
    """The published models rounds fine-tune (cached by model id: a published card and its blobs never change)."""

    def __init__(self, store: BlobStore) -> None:
        self.store = store
        self._cached: dict[str, RoundBase] = {}

    def get(self, session: Session, model_id: str) -> RoundBase:
        """The card, ONNX bytes and trainable parameters of a published model."""
        cached = self._cached.get(model_id)
        if cached is not None:
            return cached
        card = ModelCard.from_dict(registry.get_card(session, model_id))
        if card.training_graph is None:
            raise InvalidInputError(
                f"model {model_id!r} has no training graph, so devices cannot fine-tune it", field="model_id"
            )
        with self.store.open(card.sha256) as stream:
            onnx_bytes = stream.read()
        with self.store.open(card.training_graph) as stream:
            names, statistic_names = training_graph_state(stream.read())
        initializers = read_float_initializers(onnx_bytes)
        missing = [name for name in (*names, *statistic_names) if name not in initializers]
        if missing:
            raise InvalidInputError(
                f"the training graph of {model_id!r} trains {missing}, which are not initializers of its model",
                field="model_id",
            )
        base = RoundBase(card, onnx_bytes, {name: initializers[name] for name in names},
                         {name: initializers[name] for name in statistic_names},
                         frozenset(variance_names(onnx_bytes)) if statistic_names else frozenset())
        if len(self._cached) >= MAX_CACHED_BASES:
            self._cached.pop(next(iter(self._cached)))
        self._cached[model_id] = base
        return base

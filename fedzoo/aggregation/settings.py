"""The shapes of the settings and inputs the aggregation core reads, as protocols: the server's request schemas
(`fedzoo.server.fl.schemas`, pydantic) satisfy them, and so does any plain object with the same fields, so the
core needs neither pydantic nor the server."""

from __future__ import annotations

from typing import Literal, Protocol

import numpy as np


class NormBound(Protocol):
    """Updates longer than `median_multiple` x the round's median norm (or `max_norm`) are clipped or rejected."""

    median_multiple: float
    max_norm: float | None
    action: Literal["clip", "reject"]


class WeightBound(Protocol):
    """How much one update may weigh relative to the round (`fedzoo.aggregation.weighting`)."""

    rule: Literal["median_multiple", "equal", "examples"]
    median_multiple: float


class DirectionScreening(Protocol):
    """Updates whose cosine with the round's median delta is at most `min_cosine` are left out."""

    min_cosine: float


class MappedDelta(Protocol):
    """A device's delta mapped onto a supernet (`fedzoo.nas.subnet_mapping.MappedDelta`): per tensor the delta
    and the mask of the elements its subnet covers."""

    deltas: dict[str, np.ndarray]
    masks: dict[str, np.ndarray]

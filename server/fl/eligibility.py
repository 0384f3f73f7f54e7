"""Which devices a round may select: only those that declared what its plan needs (fedzoo.capabilities).

A private plan needs devices that speak its SecAgg+ protocol version and, under DP, clip their delta (and, with
adaptive clipping under SecAgg+, append their unclipped bit to the masked vector); any round
needs one update encoding the device can upload. A device that was selected anyway (it declared more than it
can do) declines the task (`POST /v1/fl/rounds/<id>/decline`); the round records that as a refusal of kind
`declined`, next to the uploads it refused, so the operator sees why the seat stayed empty.
"""

from __future__ import annotations

from fedzoo.capabilities import SECURE_AGGREGATION_VERSION, UPLOAD_ENCODINGS, Capabilities
from fedzoo.server.fl.schemas import RoundConfig

DECLINED = "declined"


def missing_capabilities(config: RoundConfig, capabilities: Capabilities) -> list[str]:
    """What the round needs that the device did not declare; empty when it may be selected."""
    missing = []
    if (config.privacy.secure_aggregation is not None
            and capabilities.secure_aggregation != SECURE_AGGREGATION_VERSION):
        missing.append(f"secure aggregation version {SECURE_AGGREGATION_VERSION}")
    if config.privacy.dp is not None and not capabilities.dp_clipping:
        missing.append("DP clipping")
    if (config.privacy.secure_aggregation is not None and config.privacy.dp is not None
            and config.privacy.dp.adaptive is not None and not capabilities.unclipped_bit):
        missing.append("the unclipped bit in the masked vector (adaptive clipping under SecAgg+)")
    if (config.privacy.secure_aggregation is None and capabilities.encodings is not None
            and not set(capabilities.encodings) & set(UPLOAD_ENCODINGS)):  # SecAgg+ sends ring values instead
        missing.append(f"an update encoding of {list(UPLOAD_ENCODINGS)}")
    return missing

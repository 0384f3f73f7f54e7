"""What a device says it can do when it checks in for federated work, so the server hands it only tasks it can do.

A device declares its capabilities with every `GET /v1/fl/task` (query parameters, see docs/rest-api.md), not at
registration: an app update changes them without a new identity. A device that declares nothing (an older SDK)
can do plain rounds only. The server selects a device for a private plan only when it declares what the plan
needs (`fedzoo.server.fl.eligibility`); a device that is handed a task it cannot do anyway declines it with a
reason (`POST /v1/fl/rounds/<id>/decline`), which the round records.

- `secure_aggregation`: the SecAgg+ protocol version the device speaks (`SECURE_AGGREGATION_VERSION`), or None;
- `dp_clipping`: it clips its delta to a DP round's clip norm before anything leaves it;
- `encodings`: the update encodings it can upload (`fp32`, `int8`; None: not said, the SDKs' fp32 at least);
- `unclipped_bit`: under SecAgg+ it appends its "not clipped" bit to the vector it masks (adaptive clipping).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from fedzoo.errors import InvalidInputError

# The SecAgg+ wire protocol of this checkout's fedzoo.secagg (2: signed keys and a consistency check; 3: signatures
# bound to one run of a round by fresh keys and nonces, and the graph drawn from every device's nonce); bumped with
# any change a device would notice.
SECURE_AGGREGATION_VERSION = 3
UPLOAD_ENCODINGS = ("fp32", "int8")
MAX_ENCODINGS = 8
ENCODINGS_PATTERN = rf"^[a-z0-9_]{{1,16}}(,[a-z0-9_]{{1,16}}){{0,{MAX_ENCODINGS - 1}}}$"


@dataclass(frozen=True)
class Capabilities:
    """A device's declared capabilities (the defaults: an SDK that declares nothing)."""

    secure_aggregation: int | None = None
    dp_clipping: bool = False
    encodings: tuple[str, ...] | None = None
    unclipped_bit: bool = False

    def to_query(self) -> dict[str, str]:
        """The check-in's query parameters that declare these capabilities."""
        query: dict[str, str] = {}
        if self.secure_aggregation is not None:
            query["secure_aggregation"] = str(self.secure_aggregation)
        if self.dp_clipping:
            query["dp_clipping"] = "true"
        if self.encodings is not None:
            query["encodings"] = ",".join(self.encodings)
        if self.unclipped_bit:
            query["unclipped_bit"] = "true"
        return query


# What this checkout's Python SDK can do (fedzoo.clients.participation and secure_participation).
PYTHON_SDK = Capabilities(secure_aggregation=SECURE_AGGREGATION_VERSION, dp_clipping=True, encodings=UPLOAD_ENCODINGS,
                          unclipped_bit=True)


def parse_encodings(text: str) -> tuple[str, ...]:
    """`fp32,int8` as a tuple, repeats dropped; names of lowercase letters, digits and `_`, at most MAX_ENCODINGS
    (`ENCODINGS_PATTERN`, which the REST schema carries too)."""
    if not re.fullmatch(ENCODINGS_PATTERN, text):
        raise InvalidInputError(f"encodings must be up to {MAX_ENCODINGS} comma-separated names such as "
                                f"'fp32,int8', got {text[:100]!r}", field="encodings")
    return tuple(dict.fromkeys(text.split(",")))

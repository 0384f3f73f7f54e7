"""SecAgg+ secure aggregation (Bonawitz et al. 2017, §6 against a lying server; Bell et al. 2020), over any transport.

The server learns the sum of the surviving clients' quantised updates and nothing else about any one of
them, even when clients drop out at any stage and even when it lies about who dropped out, swaps keys or
replays a round, as long as the devices' registered signing keys are genuine and no more devices work with it
than the devices' corruption budget allows (docs/privacy.md, "Threat model"). Modules,
in the order a round uses them:

- `config`: the round's public parameters (`SecAggConfig`: `round_id`, `num_clients`, `neighbour_count`,
  `threshold`, `vector_length`, `clip_range`, `levels`, `minimum_survivors`); `bounds`: the limits a
  device holds on them itself, derived from its corruption budget (`SecAggBounds`); `signed_rounds`: the round
  ids it took part in (it signs under one once).
- `graph`: the k-regular communication graph (a shuffled ring, seeded by every device's stage-1 nonce).
- `encoding`: clip, weight and quantise an update into Z_{2^16} or Z_{2^32}; read the sum back.
- `shamir`: t-of-k secret sharing over GF(2^256 + 297) (`shamir.PRIME`).
- `crypto`: X25519, HKDF, ChaCha20-Poly1305 and the AES-CTR mask generator; `signatures`: the Ed25519
  signatures on advertised keys and nonce and on the survivor set, and the bytes they cover (protocol v3).
- `client` / `server`: the two sides of the five stages (`advertise_keys`, `share_keys`, `masked_input`,
  `consistency_check`, `unmask`); `messages`: their JSON-compatible shapes; `framing`: the binary form
  of the share replies.
- `local`: a whole round in one process (tests, benches, the simulator).

Only numpy and `cryptography` are needed, so the device SDK imports this as the server does.
"""

from fedzoo.secagg.client import SecAggClient
from fedzoo.secagg.config import SecAggConfig
from fedzoo.secagg.encoding import dequantise_sum, example_weight, flatten, quantise, unflatten
from fedzoo.secagg.errors import ProtocolViolation, RoundAborted
from fedzoo.secagg.local import LocalRound, run_local_round
from fedzoo.secagg.server import SecAggResult, SecAggServer

__all__ = [
    "LocalRound", "ProtocolViolation", "RoundAborted", "SecAggClient", "SecAggConfig", "SecAggResult",
    "SecAggServer", "dequantise_sum", "example_weight", "flatten", "quantise", "run_local_round", "unflatten",
]

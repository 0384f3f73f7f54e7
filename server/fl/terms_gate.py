"""The server's own check of a plan against the operator's newest privacy terms (`fedzoo.privacy_terms`): a plan
every default device would refuse is refused when it is made (422 `breaks_privacy_terms`), and a plan made before
stricter terms arrived opens no further round (its last round records `plan_stopped`).

Devices stay the defence: each checks every task against the terms it verified itself, and a lying server skips
this check. It is here for the honest operator, who would otherwise learn of the mistake only when every device
refuses and the round fails at its deadline. So it runs the devices' own checks (`check_task_privacy`,
`check_noise_policy`, under `policy_for`) on what every task of the plan will carry, for every model line the plan
touches (`RoundKind.terms_lines`: the lines devices check, and the ledger lines the plan charges).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from sqlalchemy.orm import Session

from fedzoo.dp.distributed import NoisePolicy, check_noise_policy, check_task_privacy, policy_for
from fedzoo.privacy_terms import PrivacyTerms, held_privacy_terms
from fedzoo.secagg.errors import ProtocolViolation
from fedzoo.server.errors import BreaksPrivacyTerms
from fedzoo.server.fl.distributed_dp import is_distributed, requested_noise_multiplier
from fedzoo.server.fl.schemas import RoundConfig
from fedzoo.server.fl.secure_rounds import is_private
from fedzoo.server.privacy_terms import newest


def check_plan_terms(session: Session, config: RoundConfig, lines: Callable[[], list[str]]) -> None:
    """Raise `BreaksPrivacyTerms` (naming the plan's field, the terms' version, the line and its floor) when the
    newest terms the server holds cover one of `lines()` (asked for only when there are terms) and a default device
    would refuse the plan's tasks there."""
    record = newest(session)
    if record is None:
        return
    terms = held_privacy_terms(json.loads(record.document_json))
    privacy = planned_task_privacy(config)
    noise_multiplier = requested_noise_multiplier(config) if is_distributed(config) else None
    for line_id in dict.fromkeys(lines()):
        try:
            policy = policy_for(terms, line_id, NoisePolicy())
            check_task_privacy(privacy, policy)
            check_noise_policy(noise_multiplier, policy)
        except ProtocolViolation as violation:
            raise _breaks(config, terms, line_id, noise_multiplier, violation) from None


def planned_task_privacy(config: RoundConfig) -> dict[str, Any] | None:
    """The fields of every task's `privacy` that `check_task_privacy` reads, as the plan's tasks will carry them
    (`TaskPrivacy`; None for a plan with neither DP nor SecAgg+)."""
    if not is_private(config):
        return None
    dp, secure = config.privacy.dp, config.privacy.secure_aggregation
    return {"clip_norm": dp.clip_norm if dp is not None else None,
            "secure_aggregation": secure.model_dump() if secure is not None else None}


def _breaks(config: RoundConfig, terms: PrivacyTerms, line_id: str, noise_multiplier: float | None,
            violation: ProtocolViolation) -> BreaksPrivacyTerms:
    floor = terms.for_line(line_id).minimum_noise_multiplier
    dp = config.privacy.dp
    if violation.reason == "noise_below_floor":
        field = "privacy.dp.noise_multiplier"
        asked = f"; devices would be asked for z = {noise_multiplier:g}" + (
            f" (the plan's {dp.noise_multiplier:g} times 3 in a zoo-wide plan)" if config.zoo is not None else "")
    else:
        field = ("privacy.dp" if dp is None else "privacy.secure_aggregation"
                 if config.privacy.secure_aggregation is None else "privacy.dp.noise")
        asked = ""
    return BreaksPrivacyTerms(
        f"the operator's privacy terms (version {terms.version}) cover model line {line_id!r}: devices train there "
        f"only under SecAgg+ with distributed DP (privacy.dp.noise 'distributed') at a noise multiplier of at least "
        f"{floor:g}{asked}, and every device would refuse this plan's tasks ({violation.reason}: {violation})",
        field=field, terms_version=terms.version, line=line_id, minimum_noise_multiplier=floor,
        reason=violation.reason)

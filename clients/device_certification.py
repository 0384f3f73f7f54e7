"""The operator's offline certification of device keys, over the admin API (`fedzoo devices certify`,
`fedzoo devices revoke-keys`): the server lists the keys, the operator's machine signs, the server stores.

The private key never leaves the operator's machine; what travels is the device list (in) and the signed
certificates or the next version of the one revocation list (out; `fedzoo keys revoke` signs a whole list
offline instead).
"""

from __future__ import annotations

import base64
from datetime import timedelta
from typing import Any

from fedzoo.clients.errors import NotFoundAPIError
from fedzoo.clients.http import FedzooHTTP
from fedzoo.device_certificates import DEFAULT_CERTIFICATE_LIFETIME, issue_certificate
from fedzoo.errors import NotFoundError
from fedzoo.revocation import RevocationList, sign_revocation_list, verify_revocation_list
from fedzoo.signing import CardSigningKey, TrustedKeys

PAGE_LIMIT = 200


def signing_keys(api: FedzooHTTP, uncertified: bool) -> list[dict[str, Any]]:
    """Every registered device key (`GET /v1/devices/signing-keys`), only those awaiting a certificate with
    `uncertified`, every page."""
    devices: list[dict[str, Any]] = []
    offset: int | None = 0
    while offset is not None:
        page = api.get_json("/v1/devices/signing-keys", params={"uncertified": str(uncertified).lower(),
                                                                 "limit": PAGE_LIMIT, "offset": offset})
        devices.extend(page["devices"])
        offset = page["next_offset"]
    return devices


def certify_devices(api: FedzooHTTP, key: CardSigningKey, lifetime: timedelta = DEFAULT_CERTIFICATE_LIFETIME,
                    device_ids: set[str] | None = None) -> list[dict[str, Any]]:
    """Sign a certificate for each device whose key has none (only `device_ids`, if given) and upload it;
    returns the server's receipts."""
    receipts = []
    for device in signing_keys(api, uncertified=True):
        if device_ids is not None and device["device_id"] not in device_ids:
            continue
        certificate = issue_certificate(device["device_id"], base64.b64decode(device["signing_public_key"]), key,
                                        lifetime)
        receipts.append(api.request("PUT", f"/v1/devices/{device['device_id']}/certificate",
                                    json={"certificate": certificate}).json())
    return receipts


def revoke_device_keys(api: FedzooHTTP, key: CardSigningKey, device_ids: set[str]) -> RevocationList:
    """Publish the next version of the operator's one revocation list: the served list (read with this
    operator's key, so a list someone else signed is not carried over unnoticed) with its card sections
    unchanged and the signing keys of `device_ids` added."""
    try:
        served = api.get_json("/v1/revocations")
    except NotFoundAPIError:
        served = None
    current = (verify_revocation_list(served, TrustedKeys([key.public_key_raw])) if served is not None
               else RevocationList.nothing_revoked())
    keys = {device["device_id"]: device["fingerprint"] for device in signing_keys(api, uncertified=False)}
    unknown = sorted(device_ids - set(keys))
    if unknown:
        raise NotFoundError(f"no registered signing key for devices {unknown}")
    document = sign_revocation_list(key, current.version + 1, sorted(current.card_ids), sorted(current.card_sha256s),
                                    sorted(current.device_key_fingerprints | {keys[device] for device in device_ids}))
    api.request("POST", "/v1/revocations", json=document, expected=(201,))
    return verify_revocation_list(document, TrustedKeys([key.public_key_raw]))

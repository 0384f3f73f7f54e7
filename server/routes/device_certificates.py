"""Device certificates: the operator's signatures over device keys, stored and served here.

The admin lists the keys awaiting a certificate and uploads the certificates `fedzoo devices certify` signed
offline; the server relays them in SecAgg+ rounds. Revoked keys are a section of the operator's one revocation
list (`routes/revocations.py`, `GET /v1/revocations`).
"""

from __future__ import annotations

from flask import Blueprint, Response

from fedzoo.server import device_certificates
from fedzoo.server.openapi import documented
from fedzoo.server.routes.common import (
    context, json_body, json_response, next_offset, query_args, require_admin_token,
)
from fedzoo.server.routes.devices import DEVICE_ID
from fedzoo.server.schemas import (
    DeviceCertificateReceipt, DeviceCertificateUpload, DeviceSigningKeyList, SigningKeysQuery,
)

blueprint = Blueprint("device_certificates", __name__)


@documented(blueprint, "GET", "/v1/devices/signing-keys",
            summary="Admin: registered device signing keys and their certificates (`uncertified=true`: only those "
                    "awaiting one), what `fedzoo devices certify` signs", auth="admin", query=SigningKeysQuery,
            response=DeviceSigningKeyList, errors=(403, 422))
def list_signing_keys() -> Response:
    require_admin_token()
    query = query_args(SigningKeysQuery)
    with context().db.session() as session:
        page = device_certificates.signing_keys_page(session, query.uncertified, query.limit, query.offset)
    return json_response(DeviceSigningKeyList(
        **page, limit=query.limit, offset=query.offset,
        next_offset=next_offset(query.offset, len(page["devices"]), page["total"])))


@documented(blueprint, "PUT", "/v1/devices/<device_id>/certificate",
            summary="Admin: store the operator's certificate of this device's signing key (signed offline); SecAgg+ "
                    "rounds relay it to the device's neighbours", auth="admin", request=DeviceCertificateUpload,
            response=DeviceCertificateReceipt, path_params=DEVICE_ID, errors=(403, 404, 409, 422))
def put_certificate(device_id: str) -> Response:
    require_admin_token()
    body = json_body(DeviceCertificateUpload)
    with context().db.session() as session:
        read = device_certificates.store_certificate(session, device_id, body.certificate.model_dump(),
                                                     context().keys.operator_keys)
    return json_response(DeviceCertificateReceipt(device_id=device_id, key_id=read.key_id,
                                                  expires_at=read.expires_at))

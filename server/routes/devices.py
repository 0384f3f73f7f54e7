"""Devices: registration (with an enrollment token), token rotation, revocation (admin), telemetry."""

from __future__ import annotations

from flask import Blueprint, Response, request

from fedzoo.cards import IDENTIFIER_PATTERN
from fedzoo.device import DeviceProfile
from fedzoo.server import devices, enrollment
from fedzoo.server.auth import bearer_token
from fedzoo.server.errors import Forbidden, Unauthorized
from fedzoo.server.openapi import documented
from fedzoo.server.tables import as_utc
from fedzoo.server.routes.common import (
    calling_device, context, json_body, json_response, rate_limit, require_admin_token,
)
from fedzoo.server.schemas import (
    DeviceProfileRequest, DeviceRegistration, DeviceRevocation, TelemetryRequest, TelemetryResponse, TokenRotation,
)

blueprint = Blueprint("devices", __name__)
DEVICE_ID = {"device_id": {"type": "string", "pattern": IDENTIFIER_PATTERN}}


@documented(blueprint, "POST", "/v1/devices",
            summary="Register a device with an enrollment token (none needed only while the server enrolls "
                    "openly); returns its device token (shown once) and how long it lives",
            auth="enrollment", request=DeviceProfileRequest, response=DeviceRegistration, status=201,
            errors=(403, 409, 422, 429))
def register_device() -> Response:
    rate_limit("register_per_address")
    server = context()
    authorization = request.headers.get("Authorization")
    if authorization is None and not server.config.open_enrollment:
        raise Unauthorized("registering needs an enrollment token: 'Authorization: Bearer <enrollment token>' "
                           "(ask the fleet's operator: fedzoo enrollment create)", field="Authorization",
                           code="enrollment_required")
    enrollment_token = bearer_token(authorization) if authorization is not None else None
    body = json_body(DeviceProfileRequest)
    profile = DeviceProfile.model_validate(body.model_dump(exclude={"signing_public_key"}))
    signing_public_key = devices.signing_public_key(body.signing_public_key)
    scales = server.estimator.device_scales(profile)  # before the enrollment use takes the write lock
    with server.db.session() as session:
        enrolled_by = (enrollment.consume(session, enrollment_token, profile.device_class).id
                       if enrollment_token is not None else None)
        registration = devices.register(session, server.estimator, profile, server.config.device_token_ttl_s,
                                        enrolled_by, scales, signing_public_key)
    return json_response(DeviceRegistration(
        device_id=registration.device_id, token=registration.token,
        token_expires_in_s=registration.token_expires_in_s, latency_scales=registration.latency_scales,
        latency_scales_basis=registration.latency_scales_basis,
    ), status=201)


@documented(blueprint, "POST", "/v1/devices/<device_id>/token",
            summary="Trade this device's token for a fresh one (the old one works for a short grace, then stops)",
            auth="device", response=TokenRotation, status=201, path_params=DEVICE_ID, errors=(403, 429))
def rotate_token(device_id: str) -> Response:
    server = context()
    with server.db.session() as session:
        device = calling_device(session)
        if device.id != device_id:
            raise Forbidden(f"this token belongs to device {device.id!r}, not {device_id!r}", field="device_id",
                            code="not_this_device")
        rate_limit("token_per_device", device.id)
        token, lifetime_s = devices.rotate_token(session, device, server.config.device_token_ttl_s)
    return json_response(TokenRotation(token=token, token_expires_in_s=lifetime_s), status=201)


@documented(blueprint, "POST", "/v1/devices/<device_id>/revoke",
            summary="Admin: refuse every token of this device from the next request on; its pending round "
                    "updates are not aggregated",
            auth="admin", response=DeviceRevocation, path_params=DEVICE_ID, errors=(403, 404))
def revoke_device(device_id: str) -> Response:
    require_admin_token()
    with context().db.session() as session:
        record = devices.revoke(session, device_id)
    return json_response(DeviceRevocation(device_id=record.id, revoked_at=as_utc(record.revoked_at)))


@documented(blueprint, "POST", "/v1/telemetry", summary="Report this device's measured latency of a model",
            auth="device", request=TelemetryRequest, response=TelemetryResponse, status=201, errors=(404, 422))
def report_telemetry() -> Response:
    server = context()
    with server.db.session() as session:
        device = calling_device(session)
        report = json_body(TelemetryRequest)
        result = devices.report_latency(session, device.id, report.model_id, report.median_ms, report.p90_ms,
                                        report.threads, groups=len(server.estimator.groups))
    return json_response(TelemetryResponse(device_id=result.device_id, model_id=result.model_id,
                                           measured_median_ms=result.measured_median_ms, reports=result.reports),
                         status=201)

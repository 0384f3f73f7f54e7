"""Devices: registration and latency telemetry."""

from __future__ import annotations

from flask import Blueprint, Response

from fedzoo.device import DeviceProfile
from fedzoo.server import devices
from fedzoo.server.openapi import documented
from fedzoo.server.routes.common import calling_device, context, json_body, json_response
from fedzoo.server.schemas import DeviceProfileRequest, DeviceRegistration, TelemetryRequest, TelemetryResponse

blueprint = Blueprint("devices", __name__)


@documented(blueprint, "POST", "/v1/devices", summary="Register a device; returns its token (shown once)",
            request=DeviceProfileRequest, response=DeviceRegistration, status=201, errors=(409, 422))
def register_device() -> Response:
    profile = DeviceProfile.model_validate(json_body(DeviceProfileRequest).model_dump())
    server = context()
    with server.db.session() as session:
        registration = devices.register(session, server.estimator, profile)
    return json_response(DeviceRegistration(
        device_id=registration.device_id, token=registration.token, latency_scales=registration.latency_scales,
        latency_scales_basis=registration.latency_scales_basis,
    ), status=201)


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

"""The dashboard's pages: each parses its query, calls the operator's-view service and renders a template."""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import wraps
from typing import Any

from flask import Blueprint, Response, make_response, redirect, render_template, request, url_for
from markupsafe import Markup
from pydantic import ConfigDict, Field

from fedzoo.cards import IDENTIFIER_PATTERN
from fedzoo.errors import FedzooError
from fedzoo.server import devices, operator_view, registry
from fedzoo.server.dashboard import charts, session as login
from fedzoo.server.errors import Forbidden, from_domain_error
from fedzoo.server.fl import quarantine as device_quarantine
from fedzoo.server.fl.routes import service
from fedzoo.server.fl.tables import ROUND_STATES
from fedzoo.server.operator_schemas import DeviceListQuery, PageQuery, RoundListQuery
from fedzoo.server.routes.common import (
    EXTENSION_KEY, context, count_operator_auth_failure, query_args, refuse_operator_guess,
)
from fedzoo.server.schemas import ModelListQuery, StrictRequest

blueprint = Blueprint("dashboard", __name__, url_prefix="/ui", template_folder="templates",
                      static_folder="static", static_url_path="/static")
PLAN_ROUNDS_SHOWN = 200
# 'self' only: no CDN, no inline script or style, no framing, forms post only here
CONTENT_SECURITY_POLICY = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                           "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'")


class ZooQuery(StrictRequest):
    model_config = ConfigDict(extra="forbid", strict=False)  # query strings are text

    task: str | None = Field(default=None, pattern=IDENTIFIER_PATTERN)
    device_class: str | None = Field(default=None, pattern=IDENTIFIER_PATTERN)
    budget_ms: float | None = Field(default=None, gt=0.0, le=3_600_000.0)


@blueprint.record_once
def _configure_session(state) -> None:
    login.configure(state.app, state.app.extensions[EXTENSION_KEY].config)


@blueprint.after_request
def _security_headers(response: Response) -> Response:
    response.headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "no-referrer"
    if not request.path.startswith("/ui/static/"):
        response.headers["Cache-Control"] = "no-store"
    return response


@blueprint.errorhandler(FedzooError)
def _error_page(error: FedzooError) -> Response:
    api_error = from_domain_error(error)
    response = page("error.html", error=api_error)
    response.status_code = api_error.status
    return response


def page_url(offset: int | None) -> str | None:
    """This page with another `offset` and the same filters (None when there is no such page)."""
    if offset is None:
        return None
    return url_for(request.endpoint, **{**request.view_args, **request.args.to_dict(), "offset": offset})


def chart_json(config: dict[str, Any]) -> Markup:
    """A chart's configuration for a `<script type="application/json">`: `<` escaped so no value ends it."""
    return Markup(json.dumps(config).replace("<", "\\u003c"))


def page(template: str, **values: Any) -> Response:
    """Render with the role and the form token (re-set as a cookie) every page's logout form needs."""
    token = login.form_token()
    response = make_response(render_template(template, role=login.current_role(), form_token=token,
                                             chart_json=chart_json, page_url=page_url, **values))
    login.remember_form_token(response, token)
    return response


def needs_login(view: Callable[..., Response]) -> Callable[..., Response]:
    """Pages need a viewer or admin session; without one the browser goes to the login form."""

    @wraps(view)
    def guarded(*args: Any, **kwargs: Any) -> Response:
        if login.current_role() is None:
            return redirect(url_for("dashboard.login_form", next=request.path))
        return view(*args, **kwargs)

    return guarded


def _local_path(target: str | None) -> str:
    """Where to go after logging in: a dashboard path only (no open redirect)."""
    if target and target.startswith("/ui/"):
        return target
    return url_for("dashboard.overview")


@blueprint.get("/login")
def login_form() -> Response:
    return page("login.html", next=_local_path(request.args.get("next")), failed=False)


@blueprint.post("/login")
def login_submit() -> Response:
    login.check_form_token()
    target = _local_path(request.form.get("next"))
    token = request.form.get("token", "")
    ceiling = refuse_operator_guess(token) if token else None  # before the token is compared
    if login.log_in(token, context().config) is None:
        if token:
            count_operator_auth_failure(token, ceiling)
        response = page("login.html", next=target, failed=True)
        response.status_code = 401
        return response
    return redirect(target)


@blueprint.post("/logout")
def logout() -> Response:
    login.check_form_token()
    login.log_out()
    return redirect(url_for("dashboard.login_form"))


@blueprint.get("/")
@needs_login
def overview() -> Response:
    service().advance()
    context().last_seen.flush()
    with context().db.session() as session:
        models = registry.list_cards(session, None, None, 1, 0).total
        classes = operator_view.device_class_counts(session)
        active = operator_view.active_round_count(session)
        latest = operator_view.list_rounds(session, service().clock(), None, None, None, 10, 0)
    return page("overview.html", models=models, classes=classes, devices=sum(row["devices"] for row in classes),
                active_rounds=active, rounds=latest.items, chart=charts.devices_per_class(classes))


@blueprint.get("/models")
@needs_login
def models() -> Response:
    query = query_args(ModelListQuery)
    with context().db.session() as session:
        listed = registry.list_cards(session, query.task, query.precision, query.limit, query.offset)
        tasks, _ = operator_view.zoo_choices(session)
    result = operator_view.Page(listed.cards, listed.total, listed.limit, listed.offset)
    return page("models.html", page=result.as_dict("models"), query=query, tasks=tasks)


@blueprint.get("/models/<model_id>")
@needs_login
def model(model_id: str) -> Response:
    with context().db.session() as session:
        card = registry.get_card(session, model_id)
        lineage = operator_view.model_lineage(session, model_id)
        latency = operator_view.model_latency(session, model_id)
    return page("model.html", card=card, lineage=lineage, latency=latency,
                chart=charts.latency_per_class(latency["device_classes"]))


@blueprint.get("/zoo")
@needs_login
def zoo() -> Response:
    query = query_args(ZooQuery)
    with context().db.session() as session:
        tasks, classes = operator_view.zoo_choices(session)
        task = query.task or (tasks[0] if tasks else None)
        device_class = query.device_class or (classes[0] if classes else None)
        points = operator_view.pareto_points(session, task, device_class) if task and device_class else []
    return page("zoo.html", tasks=tasks, classes=classes, task=task, device_class=device_class,
                budget_ms=query.budget_ms, points=points, chart=charts.pareto(points, query.budget_ms))


@blueprint.get("/rounds")
@needs_login
def rounds() -> Response:
    query = query_args(RoundListQuery)
    service().advance()
    with context().db.session() as session:
        listed = operator_view.list_rounds(session, service().clock(), query.state, query.task, query.plan_id,
                                           query.limit, query.offset)
    return page("rounds.html", page=listed.as_dict("rounds"), query=query, states=ROUND_STATES)


@blueprint.get("/rounds/<int:round_id>")
@needs_login
def round_page(round_id: int) -> Response:
    view = service().round_view(round_id)
    with context().db.session() as session:
        summary = operator_view.round_summary(session, round_id, service().clock())
        participants = operator_view.round_participants(session, round_id)
        plan = operator_view.list_rounds(session, service().clock(), None, None, summary["plan_id"],
                                         PLAN_ROUNDS_SHOWN, 0).items
    plan.sort(key=lambda row: row["number"])
    return page("round.html", round=view, summary=summary, participants=participants, plan=plan,
                chart=charts.accuracy_over_plan(plan))


@blueprint.get("/rounds/<int:round_id>/state")
@needs_login
def round_state(round_id: int) -> Response:
    """The round's state cell, polled by htmx while the round runs."""
    return page("round_state.html", round=service().round_view(round_id))


@blueprint.get("/fleet")
@needs_login
def fleet() -> Response:
    query = query_args(DeviceListQuery)
    context().last_seen.flush()
    with context().db.session() as session:
        classes = operator_view.device_class_counts(session)
        listed = operator_view.list_devices(session, query.device_class, query.limit, query.offset)
    return page("fleet.html", classes=classes, page=listed.as_dict("devices"), query=query,
                chart=charts.devices_per_class(classes))


@blueprint.get("/quarantine")
@needs_login
def quarantine() -> Response:
    query = query_args(PageQuery)
    with context().db.session() as session:
        listed = operator_view.list_quarantined(session, query.limit, query.offset)
    return page("quarantine.html", page=listed.as_dict("devices"))


@blueprint.post("/quarantine/<device_id>/<any(release, revoke):action>")
@needs_login
def quarantine_action(device_id: str, action: str) -> Response:
    """An admin releases a quarantined device, or revokes it for good (`POST /v1/devices/<id>/revoke`'s effect)."""
    login.check_form_token()
    if login.current_role() != "admin":
        raise Forbidden("releasing or revoking a device needs the admin token; log in with it", field="token",
                        code="admin_required")
    with context().db.session() as session:
        if action == "release":
            device_quarantine.release(session, device_id, service().clock())
        else:
            devices.revoke(session, device_id)
    return redirect(url_for("dashboard.quarantine"))

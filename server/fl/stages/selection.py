"""Selection: devices check in with `GET /v1/fl/task`; an eligible device (its task and, if it says so, model
family match the round) is seated until `target x (1 + over_selection)` devices are, then the round is
**collecting**. Devices not selected are told when to come back (pace steering: `retry_after_s`); a
quarantined device (`fedzoo.server.fl.quarantine`) is selected by no round. A sampled DP plan seats by a secret
coin per device instead, until its selection window ends (`fedzoo.server.fl.sampling`)."""

from __future__ import annotations

import math
from collections.abc import Callable

from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from fedzoo.capabilities import UPLOAD_ENCODINGS, Capabilities
from fedzoo.server.errors import Forbidden
from fedzoo.server.fl import quarantine, sampling
from fedzoo.server.fl.base_models import max_upload_bytes
from fedzoo.server.fl.eligibility import DECLINED, missing_capabilities
from fedzoo.server.fl.tables import ACTIVE_STATES, FLParticipant, FLRefusedUpload, FLRound
from fedzoo.server.fl.round_context import (RoundContext, as_utc, count_rows, find_round, has_update,
                                            lock_round_before_deadline)
from fedzoo.aggregation.strategies import make_strategy
from fedzoo.server.fl.schemas import RoundConfig, Task, TaskResponse, UploadSpec, round_training
from fedzoo.server.fl.round_kinds import RoundKind

IDLE_RETRY_AFTER_S = 30.0


class Selection:
    """Seats devices in open rounds and tells each selected device its task."""

    def __init__(self, context: RoundContext, kind_of: Callable[[RoundConfig], RoundKind]) -> None:
        self.context, self.kind_of = context, kind_of

    def check_in(self, device_id: str, task: str, family: str | None = None,
                 capabilities: Capabilities = Capabilities()) -> TaskResponse:
        """Select the device for a round it is capable of and return its task, or tell it when to come back."""
        private = self.context.private
        with self.context.database.session() as session:
            if quarantine.is_quarantined(session, device_id):
                return TaskResponse(task=None, retry_after_s=IDLE_RETRY_AFTER_S,
                                    reason="this device is quarantined: its updates kept being left out of "
                                           "aggregation; the operator can release it")
            query = select(FLRound).where(FLRound.task == task, FLRound.state.in_(ACTIVE_STATES)).order_by(FLRound.id)
            if family is not None:
                query = query.where(FLRound.family == family)
            rounds = list(session.scalars(query))
            incapable, refusal = [], None
            unfit = False  # an open zoo-wide round had no zoo model within this device's budget
            not_sampled: int | None = None  # a sampled round whose coin told this device to wait for the next
            for round_row in rounds:
                if has_update(session, round_row.id, device_id) or private.has_finished(
                        session, round_row.id, device_id) or self._declined(session, round_row.id, device_id):
                    continue
                if session.get(FLParticipant, (round_row.id, device_id)) is not None:
                    return TaskResponse(task=self.task(session, round_row, device_id), retry_after_s=None)
                if sampling.drew_tails(session, round_row.id, device_id):
                    not_sampled = round_row.id
                    continue
                if round_row.state == "open":
                    config = RoundConfig.model_validate_json(round_row.config_json)
                    refusal = private.seat_refusal(session, config, device_id)
                    if refusal is not None:  # what the device is (keyless) before what it says it can do
                        continue
                    missing = missing_capabilities(config, capabilities)
                    if missing:
                        incapable.append(f"round {round_row.id} needs {' and '.join(missing)}")
                        continue
                    claimed = self._claim(session, round_row, config)
                    # read again once the row lock is ours (or the round moved on): a concurrent check-in of this
                    # device may have taken its seat, or drawn its coin, meanwhile
                    if session.get(FLParticipant, (round_row.id, device_id)) is not None:
                        return TaskResponse(task=self.task(session, round_row, device_id), retry_after_s=None)
                    if not claimed:
                        continue  # another check-in just filled it, or its selection window ended
                    if sampling.is_sampled(config):  # the coin, drawn under the round's row lock
                        if sampling.drew_tails(session, round_row.id, device_id) or not sampling.heads(
                                sampling.sampling_probability(config)):
                            self._tails(session, round_row, device_id)
                            not_sampled = round_row.id
                            continue
                    if self._select(session, round_row, device_id):
                        return TaskResponse(task=self.task(session, round_row, device_id), retry_after_s=None)
                    unfit = True
            if incapable and refusal is None:
                return TaskResponse(task=None, retry_after_s=IDLE_RETRY_AFTER_S,
                                    reason=f"{'; '.join(incapable)}, which this device did not declare "
                                           "(GET /v1/fl/task's secure_aggregation, dp_clipping, encodings)")
            if rounds:
                config = RoundConfig.model_validate_json(rounds[0].config_json)
                remaining_s = (as_utc(rounds[0].deadline_at) - self.context.clock()).total_seconds()
                return TaskResponse(
                    task=None,
                    retry_after_s=round(max(0.1, min(config.poll_interval_s, remaining_s)), 3),
                    reason=refusal or (f"not sampled for round {not_sampled}: this DP plan seats each device with "
                                       "a secret coin (privacy.dp.sampling_probability), drawn once a round; ask "
                                       "again for the next one" if not_sampled is not None else
                                       "no zoo model fits this device's latency budget in the current zoo-wide round; "
                                       "ask again for the next one" if unfit else
                                       "the current round has selected its devices; ask again for the next one"),
                )
            return TaskResponse(task=None, retry_after_s=IDLE_RETRY_AFTER_S, reason=f"no round is running for task {task!r}")

    @staticmethod
    def _declined(session: Session, round_id: int, device_id: str) -> bool:
        return session.scalar(select(func.count()).select_from(FLRefusedUpload).where(
            FLRefusedUpload.round_id == round_id, FLRefusedUpload.device_id == device_id,
            FLRefusedUpload.kind == DECLINED)) > 0

    def decline(self, device_id: str, round_id: int, reason: str, message: str) -> dict[str, Any]:
        """A selected device will not do the round's task: recorded with its reason, and the round no longer offers
        it to the device. Its seat stays taken (under SecAgg+ it misses the stages: a dropout)."""
        with self.context.database.session() as session:
            find_round(session, round_id)
            if session.get(FLParticipant, (round_id, device_id)) is None:
                raise Forbidden(f"device {device_id!r} was not selected for round {round_id}; only a selected device "
                                "declines its task", field="round_id", code="not_selected")
            if not self._declined(session, round_id, device_id):
                session.add(FLRefusedUpload(round_id=round_id, device_id=device_id, kind=DECLINED,
                                            reason=f"{reason}: {message}"[:2000], upload_bytes=0,
                                            received_at=self.context.clock()))
        return {"round_id": round_id, "reason": reason}

    def _claim(self, session: Session, round_row: FLRound, config: RoundConfig) -> bool:
        """Whether the round is still open and before its deadline (a sampled round: before its selection window
        ends), asked by locking its row before seating (`lock_round_before_deadline`): concurrent check-ins seat one
        at a time, each counting the seats taken before its own, and the round seats exactly its goal (an extra
        seat would train and upload only to be refused)."""
        now = self.context.clock()
        if sampling.is_sampled(config) and now >= sampling.selection_closes_at(round_row, config):
            self._close_selection(session, round_row.id)
            return False
        return lock_round_before_deadline(session, round_row.id, ("open",), now)

    @staticmethod
    def _close_selection(session: Session, round_id: int) -> None:
        session.execute(update(FLRound).where(FLRound.id == round_id, FLRound.state == "open")
                        .values(state="collecting").execution_options(synchronize_session=False))

    def _tails(self, session: Session, round_row: FLRound, device_id: str) -> None:
        """The device's coin came up tails: stored, so it cannot re-roll; selection closes once everyone drew."""
        if not sampling.drew_tails(session, round_row.id, device_id):
            sampling.record_tails(session, round_row, device_id, self.context.clock())
            session.flush()
        if sampling.everyone_drew(session, round_row.id):
            self._close_selection(session, round_row.id)

    def sampled_rounds_ready(self) -> list[int]:
        """Sampled rounds to aggregate now: selection closed (its window ended: closed here) and every seated device
        uploaded, at least `min_clients` of them. Rounds past their deadline are the deadline check's."""
        now, ready = self.context.clock(), []
        with self.context.database.session() as session:
            for round_row in session.scalars(select(FLRound).where(FLRound.state.in_(ACTIVE_STATES),
                                                                   FLRound.deadline_at > now)):
                config = RoundConfig.model_validate_json(round_row.config_json)
                if not sampling.is_sampled(config):
                    continue
                if round_row.state == "open" and now >= sampling.selection_closes_at(round_row, config):
                    self._close_selection(session, round_row.id)
                    session.refresh(round_row)
                if sampling.cohort_complete(session, round_row, config.min_clients):
                    ready.append(round_row.id)
        return ready

    def _select(self, session: Session, round_row: FLRound, device_id: str) -> bool:
        """Seat the device if the round's kind can (in a zoo-wide round, only with a subnet that fits its budget;
        the round claimed by `_claim`); at the selection goal the round stops selecting and SecAgg+ forms its
        cohorts of the seated devices (`RoundKind.seat_group`)."""
        config = RoundConfig.model_validate_json(round_row.config_json)
        kind = self.kind_of(config)
        if not kind.seat(session, round_row, config, device_id):
            return False
        goal = math.ceil(config.target_clients * (1 + config.over_selection))
        session.add(FLParticipant(round_id=round_row.id, device_id=device_id, selected_at=self.context.clock()))
        session.flush()
        if sampling.is_sampled(config):  # no cap on a sampled cohort: it closes with its window (or the fleet)
            if sampling.everyone_drew(session, round_row.id):
                self._close_selection(session, round_row.id)
        elif count_rows(session, FLParticipant, round_row.id) >= goal:
            round_row.state = "collecting"
            if config.privacy.secure_aggregation is not None:
                self.context.private.start_stages(session, round_row, config,
                                                  lambda seated: kind.seat_group(session, round_row, seated))
        return True

    def task(self, session: Session, round_row: FLRound, device_id: str) -> Task:
        """What a selected device is to do: the model and training graph to fetch, how to train, where to upload."""
        config = RoundConfig.model_validate_json(round_row.config_json)
        base = self.context.bases.get(session, self.context.device_model_id(session, round_row, config, device_id))
        strategy_fields = make_strategy(config.strategy).configure_fit(round_row.number)
        return Task(
            round_id=round_row.id,
            round_number=round_row.number,
            model_id=base.card.id,
            base_version=round_row.base_version,
            model_sha256=base.card.sha256,
            model_url=f"/v1/models/{base.card.id}/blob",
            training_graph_sha256=base.card.training_graph,
            training_graph_url=f"/v1/blobs/{base.card.training_graph}",
            deadline_at=as_utc(round_row.deadline_at),
            training=round_training(config, round_row.number, strategy_fields),
            upload=UploadSpec(
                url=f"/v1/fl/rounds/{round_row.id}/updates",
                encodings=list(UPLOAD_ENCODINGS),
                max_bytes=max_upload_bytes(base),
            ),
            privacy=self.context.private.task_privacy(
                session, round_row, config, device_id,
                config.max_examples_per_update or self.context.max_examples_per_update),
        )

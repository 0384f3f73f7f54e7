"""Tables of federated rounds, on the registry's `Base` so one Alembic history covers the server.

Nothing about a round lives only in memory: the round row holds its state, configuration and
deadline; a participant row records each selected device; an update row is written, in the same
transaction as the check that admits it, after the update's bytes are safely in the blob store. A
server restarted mid-round therefore finds every accepted update where it left it and carries on.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import DateTime, Float, ForeignKey, Index, Integer, LargeBinary, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from fedzoo.server.db import Base
from fedzoo.server.tables import utc_now

ROUND_STATES = ("open", "collecting", "aggregating", "closed", "failed")
ACTIVE_STATES = ("open", "collecting")


class FLRound(Base):
    """One round: its base model, configuration, strategy, state and outcome."""

    __tablename__ = "fl_rounds"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    task: Mapped[str] = mapped_column(String(128))
    family: Mapped[str] = mapped_column(String(200))
    number: Mapped[int] = mapped_column(Integer, doc="1 for the first round of a plan, then 2, 3, ...")
    rounds_remaining: Mapped[int] = mapped_column(Integer, doc="rounds of the plan still to run, this one included")
    previous_round_id: Mapped[int | None] = mapped_column(ForeignKey("fl_rounds.id"), nullable=True)
    plan_id: Mapped[int | None] = mapped_column(Integer, nullable=True, index=True,
                                                doc="the id of the plan's first round (null only while inserting)")
    state: Mapped[str] = mapped_column(String(16), default="open")
    base_model_id: Mapped[str] = mapped_column(ForeignKey("models.id"))
    base_version: Mapped[int] = mapped_column(Integer)
    config_json: Mapped[str] = mapped_column(Text, doc="the RoundConfig, as JSON")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utc_now)
    deadline_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    aggregation_lease_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    result_model_id: Mapped[str | None] = mapped_column(String(128), nullable=True)
    strategy_state_sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)
    outcome_json: Mapped[str | None] = mapped_column(Text, nullable=True, doc="metrics or the failure reason")
    aggregation_owner: Mapped[str | None] = mapped_column(
        String(64), nullable=True, doc="the round service holding the aggregation lease (it renews the lease)")
    publication_json: Mapped[str | None] = mapped_column(
        Text, nullable=True, doc="a zoo round's background publication as it goes: stage, models done, times")

    __table_args__ = (Index("ix_fl_rounds_task_state", "task", "state"),)


class FLParticipant(Base):
    """A device selected for a round at check-in."""

    __tablename__ = "fl_participants"

    round_id: Mapped[int] = mapped_column(ForeignKey("fl_rounds.id", ondelete="CASCADE"), primary_key=True)
    device_id: Mapped[str] = mapped_column(ForeignKey("devices.id", ondelete="CASCADE"), primary_key=True)
    selected_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utc_now)


SCREENING_OUTCOMES = ("counted", "clipped", "rejected")


class FLUpdate(Base):
    """A stored update: its bytes (a blob), the example count the device claimed and the weight the server
    grants it, its norm, the client's own metrics, and how aggregation screened it (null until then)."""

    __tablename__ = "fl_updates"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    round_id: Mapped[int] = mapped_column(ForeignKey("fl_rounds.id", ondelete="CASCADE"))
    device_id: Mapped[str] = mapped_column(ForeignKey("devices.id", ondelete="CASCADE"))
    blob_sha256: Mapped[str] = mapped_column(String(64))
    encoding: Mapped[str] = mapped_column(String(8))
    upload_bytes: Mapped[int] = mapped_column(Integer)
    num_examples: Mapped[int] = mapped_column(Integer, doc="as the device reported it")
    delta_norm: Mapped[float] = mapped_column(Float)
    metrics_json: Mapped[str] = mapped_column(Text, default="{}")
    received_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utc_now)
    counted_examples: Mapped[int | None] = mapped_column(Integer, nullable=True,
                                                         doc="the FedAvg weight: num_examples capped by the round")
    screening: Mapped[str | None] = mapped_column(String(16), nullable=True, doc="one of SCREENING_OUTCOMES")
    screening_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    counted_norm: Mapped[float | None] = mapped_column(Float, nullable=True, doc="the norm after clipping")
    aggregation_weight: Mapped[float | None] = mapped_column(
        Float, nullable=True,
        doc="the weight it had in the aggregate (bounded, times its root-set trust); null: left out")
    root_cosine: Mapped[float | None] = mapped_column(
        Float, nullable=True, doc="cosine with the server's own update on the root set (null: no root set)")

    # the database itself refuses a second update from one device in one round, even under races
    __table_args__ = (UniqueConstraint("round_id", "device_id", name="uq_fl_updates_round_device"),)


REFUSAL_KINDS = ("late", "rejected", "declined", "aborted", "not_sampled", "sat_out")
SEAT_FAILURES = ("declined", "aborted")  # in a SecAgg+ round, these count towards quarantine (server.fl.quarantine)


class FLRefusedUpload(Base):
    """An upload a selected device sent but the round refused: `late` (the round no longer took updates) or
    `rejected` (stale base version, too large, malformed delta); or a task the device `declined` (one it cannot do,
    or a server that broke the protocol: `fedzoo.server.fl.eligibility`); or a SecAgg+ seat the device `aborted`
    (it did not answer a stage it was asked for before the stage closed); or a coin of a sampled DP round that came
    up tails, `not_sampled` (`fedzoo.server.fl.sampling`: stored so the device cannot re-roll); or a device seated in
    a zoo-wide SecAgg+ round whose subnet had too few devices for a cohort, `sat_out`. Kept so operators see more than
    the counted."""

    __tablename__ = "fl_refused_uploads"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    round_id: Mapped[int] = mapped_column(ForeignKey("fl_rounds.id", ondelete="CASCADE"))
    device_id: Mapped[str] = mapped_column(ForeignKey("devices.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(16), doc="one of REFUSAL_KINDS")
    reason: Mapped[str] = mapped_column(Text)
    upload_bytes: Mapped[int] = mapped_column(Integer)
    received_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utc_now)

    __table_args__ = (Index("ix_fl_refused_uploads_round_device", "round_id", "device_id"),)


class FLPrivateRound(Base):
    """A round of a plan with SecAgg+ and/or DP-FedAvg: where its secure stages stand (every cohort's together:
    `FLSecureCohort`), and the plan's privacy ledger (as it was when the round opened, and after it released a noised
    aggregate). The next round of the plan starts from `ledger_after_json` or, without a release, `ledger_json`."""

    __tablename__ = "fl_private_rounds"

    round_id: Mapped[int] = mapped_column(ForeignKey("fl_rounds.id", ondelete="CASCADE"), primary_key=True)
    stage: Mapped[str | None] = mapped_column(String(16), nullable=True,
                                              doc="SecAgg+: selection, advertise_keys, ..., unmask, done; else null")
    stage_deadline_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    ledger_json: Mapped[str | None] = mapped_column(Text, nullable=True, doc="DP: the plan's ledger at the start")
    ledger_after_json: Mapped[str | None] = mapped_column(Text, nullable=True,
                                                          doc="DP: the ledger after this round released its aggregate")
    line_id: Mapped[str | None] = mapped_column(String(128), nullable=True, index=True,
                                                doc="DP: the model line whose ledger the plan continues")


class PrivacyLine(Base):
    """One model line's privacy ledger across all its DP plans: every round a plan released, composed in
    order. A plan on the line starts from here (one plan at a time), and each release writes the line back."""

    __tablename__ = "privacy_lines"

    line_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    delta: Mapped[float] = mapped_column(Float, doc="every plan on the line accounts at this delta")
    mechanism: Mapped[str] = mapped_column(String(8), doc="rdp or pld")
    events_json: Mapped[str] = mapped_column(Text, doc="[[noise_multiplier, sampling_probability, rounds], ...]")
    epsilon: Mapped[float] = mapped_column(Float, doc="the line's epsilon at delta after those rounds")
    revision: Mapped[int] = mapped_column(Integer, default=0, doc="raised by each plan opening on the line")
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utc_now)


class FLSecureCohort(Base):
    """One SecAgg+ instance of a private round: its devices in client-number order and its SecAggConfig, fixed when
    selection closes. An ordinary round has one cohort (0); a zoo-wide round one per subnet (`name`: its arch key)."""

    __tablename__ = "fl_secure_cohorts"

    round_id: Mapped[int] = mapped_column(ForeignKey("fl_rounds.id", ondelete="CASCADE"), primary_key=True)
    cohort: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), doc="what the cohort shares: '' or a subnet's arch key")
    participants_json: Mapped[str] = mapped_column(Text, doc="the cohort's device ids in client-number order")
    secagg_config_json: Mapped[str] = mapped_column(Text, doc="the cohort's SecAggConfig")


class FLSecureMessage(Base):
    """One device's reply to one SecAgg+ stage, stored before the device hears "received": the server's
    protocol state is a function of these rows, so any worker, or a restarted server, rebuilds it."""

    __tablename__ = "fl_secure_messages"

    round_id: Mapped[int] = mapped_column(ForeignKey("fl_rounds.id", ondelete="CASCADE"), primary_key=True)
    cohort: Mapped[int] = mapped_column(Integer, primary_key=True, doc="the FLSecureCohort it belongs to")
    stage: Mapped[str] = mapped_column(String(16), primary_key=True)
    client: Mapped[int] = mapped_column(Integer, primary_key=True)
    device_id: Mapped[str] = mapped_column(ForeignKey("devices.id", ondelete="CASCADE"))
    body: Mapped[bytes] = mapped_column(LargeBinary, doc="the reply: JSON, or the masked vector's raw bytes")
    received_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utc_now)


class FLQuarantine(Base):
    """A device the quarantine policy stopped selecting: when, which round's decision tipped it, and why. A
    released device keeps its row (`released_at`); only exclusions after the release count towards the next."""

    __tablename__ = "fl_quarantine"

    device_id: Mapped[str] = mapped_column(ForeignKey("devices.id", ondelete="CASCADE"), primary_key=True)
    round_id: Mapped[int] = mapped_column(ForeignKey("fl_rounds.id", ondelete="CASCADE"))
    reason: Mapped[str] = mapped_column(Text)
    quarantined_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utc_now)
    released_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class FLSubnetAssignment(Base):
    """In a zoo-wide round, the subnet a selected device trains: the zoo model its lookup chose under its budget,
    and the training card extracted for that model's arch from the round's supernet."""

    __tablename__ = "fl_subnet_assignments"

    round_id: Mapped[int] = mapped_column(ForeignKey("fl_rounds.id", ondelete="CASCADE"), primary_key=True)
    device_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    zoo_model_id: Mapped[str] = mapped_column(String(128), doc="the zoo model lookup chose for the device")
    training_model_id: Mapped[str] = mapped_column(String(128), doc="the subnet card the device trains")
    arch_json: Mapped[str] = mapped_column(Text, doc="the subnet's arch")

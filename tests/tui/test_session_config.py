"""The session's configuration is fixed once built, its runtime state is only read from
outside, and each change a screen asks for is one of the session's verbs."""

from __future__ import annotations

import dataclasses

import pytest

from core.checkpoint.base import PendingRequest
from core.checkpoint.memory import MemoryCheckpointer
from core.hitl import ConfirmRequest, HumanRequest
from core.messages import UserMessage
from core.recovery import Diagnosis, ThreadState, diagnose
from tests.helpers.tui import fast_session
from tui.attention import Alerts
from tui.session import Session, ThreadRow
from tui.session_config import SessionConfig


async def _no_store() -> MemoryCheckpointer:
    return MemoryCheckpointer()


def _config(**changes: object) -> SessionConfig:
    return SessionConfig(_no_store, lambda: None, **changes)  # type: ignore[arg-type]


def test_the_configuration_cannot_be_changed() -> None:
    config = _config(location="here.sqlite", alerts=Alerts(bell=False))
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.location = "elsewhere.sqlite"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.alerts = Alerts()  # type: ignore[misc]
    with pytest.raises(TypeError):
        config.agent_options["approvals"] = {}  # type: ignore[index]
    assert config.location == "here.sqlite" and not config.alerts.bell


def test_what_the_configuration_was_given_is_copied() -> None:
    tools: list[object] = ["a tool"]
    options = {"workflow": "v1"}
    config = _config(tools=tools, agent_options=options)
    tools.append("another")
    options["workflow"] = "v2"
    assert config.tools == ("a tool",)
    assert dict(config.agent_options) == {"workflow": "v1"}


def test_the_cli_builds_the_configuration_once_with_what_it_was_given() -> None:
    alerts = Alerts(notices=False)
    session = fast_session(MemoryCheckpointer(), alerts=alerts, agent_options={"abort_grace": 2.0}, input_quiet=7.0)
    assert session.config.alerts is alerts and session.config.input_quiet == 7.0
    assert dict(session.config.agent_options) == {"abort_grace": 2.0, "workflow": None}
    assert session.config.location == "memory" and session.config.model == "demo"


def test_the_runtime_state_is_read_only_from_outside() -> None:
    session = Session(_config())
    with pytest.raises(AttributeError):
        session.config = _config(location="elsewhere")  # type: ignore[misc]
    with pytest.raises(AttributeError):
        session.store = MemoryCheckpointer()  # type: ignore[misc]
    with pytest.raises(AttributeError):
        session.ending = True  # type: ignore[misc]
    with pytest.raises(TypeError):
        session.agents["t"] = None  # type: ignore[index]
    with pytest.raises(TypeError):
        session.runs["t"] = None  # type: ignore[index]
    assert session.store is None and not session.ending and dict(session.agents) == {}


def test_report_to_names_who_is_told_of_the_store() -> None:
    session = Session(_config())
    busy: list[int] = []
    told: list[str] = []
    session.report_to(on_busy=busy.append, on_status=lambda: told.append(session.store_notice))
    session.report_busy(3)
    session.set_store_notice("reconnecting")
    session.set_store_notice("reconnecting")  # unchanged: not told again
    session.set_store_notice("")
    assert busy == [3] and told == ["reconnecting", ""]
    session.report_to()  # no one
    session.report_busy(4)
    session.set_store_notice("lost")
    assert busy == [3] and told == ["reconnecting", ""] and session.store_notice == "lost"


async def test_a_kept_prompt_is_saved_when_the_app_ends_before_its_run_began() -> None:
    store = MemoryCheckpointer()
    session = fast_session(store)
    await session.open()
    session.keep_pending_prompt("t", "first words")
    session.keep_pending_prompt("t", "the words sent")  # the newer replaces it
    assert session.running_count() == 1  # a run about to start counts as running
    await session.close()
    data = await store.load("t")
    assert data is not None and [m.text for m in data.messages if isinstance(m, UserMessage)] == ["the words sent"]
    assert diagnose(data.messages, data.runs).state is ThreadState.ABORTED


async def test_a_dropped_prompt_is_not_saved() -> None:
    store = MemoryCheckpointer()
    session = fast_session(store)
    await session.open()
    session.keep_pending_prompt("t", "never mind")
    session.drop_pending_prompt("t")
    session.drop_pending_prompt("t")  # none kept: nothing happens
    assert session.running_count() == 0
    await session.close()
    assert await store.load("t") is None


def _waiting_row(thread_id: str) -> ThreadRow:
    request = HumanRequest(
        question_id="q1", thread_id=thread_id, payload=ConfirmRequest(prompt="Ship it?"), created_at=0.0
    )
    diagnosis = Diagnosis(
        ThreadState.WAITING, pending=PendingRequest(request.model_dump_json(), run_id="r1", created_at=0.0)
    )
    return ThreadRow(thread_id, diagnosis.label, 2, 0.0, "go", diagnosis)


def test_rows_to_alert_alerts_once_after_the_first_complete_listing() -> None:
    session = Session(_config())
    waiting = _waiting_row("b")
    assert session.rows_to_alert([_waiting_row("a")], complete=True) == []  # the baseline
    assert session.rows_to_alert([waiting], complete=True) == [waiting]
    assert session.rows_to_alert([waiting], complete=True) == []  # alerted already

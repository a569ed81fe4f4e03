"""Approval policy per tool: which calls wait for a person's approval before they start.

Set in the agent definition, one rule per tool name::

    Agent(..., approvals={
        "delete_file": ALWAYS,                               # every call asks
        "read_file": NEVER,                                  # never asks (as an unlisted tool)
        "write_file": ask_for(path=["/etc/*", "*.env"]),     # asks when an argument matches
    })

The rules are declarative values, not predicates, so they can be printed
(:func:`describe`) and fingerprinted with the rest of the definition
(:func:`approval_parts`, used by :func:`core.fingerprints.definition_parts`): a thread
written under one policy is not continued under another unnoticed.

:func:`ask_for` matches each named argument's string value against shell-style glob
patterns with :func:`fnmatch.fnmatchcase` (case-sensitive on every platform; ``*`` also
matches ``/``, so ``"/etc/*"`` covers ``/etc/ssh/sshd_config``). The value is the
*validated* argument (after the tool's parameter model parsed it), read as: a string as
it is; a list or tuple element by element (the call asks when any element matches);
``None`` never matches; any other value as ``str(value)``. The match is on the text the
model sent: ``"/etc/../etc/passwd"`` does not match ``"/etc/*"``'s idea of a path
unless a pattern says so, so list the forms to catch, or use :data:`ALWAYS`.

A rule may carry ``timeout`` (seconds the call waits for the answer, counted from when
the request was persisted, so it survives a crash) and ``default`` (``"approve"`` or
``"deny"``, recorded when nobody answered in time; without one the run ends *waiting
for an answer* at the deadline). How the wait happens is :mod:`core.human_wait`.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel

from core.errors import ToolDefinitionError

ApprovalDefault = Literal["approve", "deny"]
"""What is recorded when an approval times out with a default."""


@dataclass(frozen=True, slots=True)
class Always:
    """Every call of the tool asks for approval. ``timeout`` seconds (``None``: wait until
    answered, aborted or detached) and ``default`` as the module docstring says."""

    timeout: float | None = None
    default: ApprovalDefault | None = None


@dataclass(frozen=True, slots=True)
class Never:
    """No call of the tool asks (the same as leaving the tool out of ``approvals``)."""


@dataclass(frozen=True, slots=True)
class AskFor:
    """A call asks when one of its arguments matches: ``patterns`` holds ``(argument name,
    glob patterns)`` pairs, sorted by name (build it with :func:`ask_for`). ``timeout`` and
    ``default`` as for :class:`Always`."""

    patterns: tuple[tuple[str, tuple[str, ...]], ...]
    timeout: float | None = None
    default: ApprovalDefault | None = None


ApprovalRule = Always | Never | AskFor
"""One tool's rule."""

Approvals = Mapping[str, ApprovalRule]
"""Tool name -> its rule; tools not named never ask."""

ALWAYS = Always()
"""Always ask, wait without a timeout."""

NEVER = Never()
"""Never ask."""


def ask_for(
    *, timeout: float | None = None, default: ApprovalDefault | None = None, **patterns: str | Sequence[str]
) -> AskFor:
    """A rule that asks when a named argument's value matches one of its glob patterns
    (``ask_for(path=["/etc/*", "*.env"], mode="w*")``; a single pattern may be a string).

    Raises ``ValueError`` (one sentence) when no argument is named, an argument has no
    pattern or a pattern is not a non-empty string, and for a bad ``timeout`` / ``default``
    (:func:`check_wait`)."""
    if not patterns:
        raise ValueError("ask_for() needs at least one argument and its patterns, e.g. ask_for(path=['/etc/*']).")
    pairs: list[tuple[str, tuple[str, ...]]] = []
    for name, given in sorted(patterns.items()):
        listed = (given,) if isinstance(given, str) else tuple(given)
        if not listed or not all(isinstance(p, str) and p for p in listed):
            raise ValueError(f"ask_for(): argument {name!r} needs one or more non-empty glob patterns.")
        pairs.append((name, listed))
    check_wait(timeout, default)
    return AskFor(tuple(pairs), timeout, default)


def always(*, timeout: float | None = None, default: ApprovalDefault | None = None) -> Always:
    """:data:`ALWAYS` with a ``timeout`` and/or ``default`` (checked by :func:`check_wait`)."""
    check_wait(timeout, default)
    return Always(timeout, default)


def check_wait(timeout: float | None, default: str | None) -> None:
    """Raise ``ValueError`` (one sentence) unless ``timeout`` is ``None`` or a positive
    number of seconds and ``default`` is ``None``, ``"approve"`` or ``"deny"``; a default
    without a timeout is refused too (it could never apply)."""
    if timeout is not None and not timeout > 0:
        raise ValueError(f"An approval timeout is a positive number of seconds, not {timeout!r}.")
    if default is not None and default not in ("approve", "deny"):
        raise ValueError(f"An approval default is 'approve' or 'deny', not {default!r}.")
    if default is not None and timeout is None:
        raise ValueError("An approval default needs a timeout: without one nobody's silence ever ends.")


def check_approvals(approvals: Approvals, parameters: Mapping[str, type[BaseModel]]) -> dict[str, ApprovalRule]:
    """``approvals`` as a plain dict, checked against the agent's tools (``parameters``:
    tool name -> its parameter model). Raises
    :class:`~core.errors.ToolDefinitionError` for a rule that names a tool the agent does
    not have, an :class:`AskFor` argument that tool does not take, or a value that is not
    a rule: a misspelt name would otherwise silently never ask."""
    checked: dict[str, ApprovalRule] = {}
    for name, rule in approvals.items():
        if not isinstance(rule, Always | Never | AskFor):
            raise ToolDefinitionError(
                f"The approval rule for {name!r} must be ALWAYS, NEVER, always(...) or ask_for(...), "
                f"not {type(rule).__name__}."
            )
        model = parameters.get(name)
        if model is None:
            known = ", ".join(sorted(parameters)) or "none"
            raise ToolDefinitionError(
                f"approvals names tool {name!r}, which this agent does not have (tools: {known})."
            )
        if isinstance(rule, AskFor):
            for argument, _ in rule.patterns:
                if argument not in model.model_fields:
                    raise ToolDefinitionError(f"approvals: tool {name!r} takes no argument {argument!r}.")
        checked[name] = rule
    return checked


def needs_approval(rule: ApprovalRule | None, params: BaseModel) -> bool:
    """Whether a call with the validated ``params`` asks, under ``rule`` (``None``: the
    tool is not listed, so it never asks). Never raises."""
    if rule is None or isinstance(rule, Never):
        return False
    if isinstance(rule, Always):
        return True
    for argument, patterns in rule.patterns:
        for text in _texts(getattr(params, argument, None)):
            if any(fnmatch.fnmatchcase(text, p) for p in patterns):
                return True
    return False


def _texts(value: Any) -> Iterable[str]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list | tuple):
        return tuple(t for v in value for t in _texts(v))
    return (str(value),)


def describe(rule: ApprovalRule) -> str:
    """The rule for people, and as it is fingerprinted: ``"always"``, ``"never"``,
    ``"ask for path matching /etc/* or *.env"``, each followed by ``"; wait 60 s, then
    deny"`` (or ``"; wait 60 s, then end waiting"`` without a default) when it has a
    timeout."""
    if isinstance(rule, Never):
        return "never"
    if isinstance(rule, Always):
        text = "always"
    else:
        text = "ask for " + "; ".join(f"{name} matching {' or '.join(pats)}" for name, pats in rule.patterns)
    if rule.timeout is not None:
        then = rule.default or "end waiting"
        text += f"; wait {rule.timeout:g} s, then {then}"
    return text


APPROVAL_PART = "approval:"
"""The prefix of each tool's approval part in :func:`core.fingerprints.definition_parts`."""


def approval_parts(approvals: Approvals) -> dict[str, str]:
    """``"approval:NAME"`` -> :func:`describe` of each rule that asks at all. :data:`NEVER`
    adds no part: it means what leaving the tool out means, so writing it down is no change
    of the definition."""
    return {
        APPROVAL_PART + name: describe(rule) for name, rule in sorted(approvals.items()) if not isinstance(rule, Never)
    }

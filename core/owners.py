"""Who a thread belongs to: the owner every store read and write is scoped by.

A store is opened for one owner (``open_store(..., owner=...)``) and every query it makes
filters by that owner in the query itself, so another owner's thread is answered exactly
like a missing one (:func:`core.checkpoint.base.thread_unavailable`). Threads that record no
owner - written by cubeloop, or by cubepi-tui before owners existed - belong to the explicit
owner :data:`UNOWNED`, which ``--unowned`` opens.

The rule follows the lesson on resuming interrupted agents that this store design follows:
"reading filters by id *and* owner in the query, and a miss is 'run unavailable' whether the
run is absent or someone else's".
"""

from __future__ import annotations

import getpass
import os

from core.untrusted import holds_control

UNOWNED = ""
"""The owner of threads that record none. Stored as no owner (SQL ``NULL``, no hash field);
queries compare ``coalesce(owner, '')`` with the store's owner, so this value selects them."""

UNOWNED_LABEL = "unowned"
"""How :data:`UNOWNED` is shown and named on the command line (``--unowned``)."""

OWNER_ENV = "CUBEPI_OWNER"
"""The environment variable that overrides the OS user name as the default owner."""

MAX_OWNER_CHARS = 200
"""Longest owner name accepted, in characters (a user name or an e-mail fits many times over)."""


def check_owner(name: str) -> str:
    """Return ``name`` when it can be an owner; raise ``ValueError`` (one sentence) when it is
    empty or all spaces, longer than :data:`MAX_OWNER_CHARS`, or holds a control or format
    character (it is shown in headers and stored in every backend)."""
    if not name.strip():
        raise ValueError("An owner name cannot be empty; use --unowned for threads that have no owner.")
    if len(name) > MAX_OWNER_CHARS:
        raise ValueError(f"An owner name is at most {MAX_OWNER_CHARS} characters, not {len(name)}.")
    if holds_control(name):
        raise ValueError(f"The owner name {name!r} holds a control character.")
    return name


def default_owner() -> str:
    """The owner used when none is given: ``$CUBEPI_OWNER`` if set and not empty, else the OS
    user name (:func:`getpass.getuser`), else ``"user-<uid>"`` when the system has no name for
    this user. Raises ``ValueError`` (one sentence) for a ``$CUBEPI_OWNER`` that
    :func:`check_owner` refuses."""
    given = os.environ.get(OWNER_ENV, "")
    if given:
        try:
            return check_owner(given)
        except ValueError as error:
            raise ValueError(f"{OWNER_ENV}: {error}") from None
    try:
        return check_owner(getpass.getuser())
    except (KeyError, OSError, ValueError):
        return f"user-{os.getuid()}"


def resolve_owner(owner: str | None) -> str:
    """The owner a store opens for: ``owner`` checked (:data:`UNOWNED` passes as is), or
    :func:`default_owner` when ``None``. Raises ``ValueError`` as :func:`check_owner` does."""
    if owner is None:
        return default_owner()
    return owner if owner == UNOWNED else check_owner(owner)


def owner_label(owner: str) -> str:
    """``owner`` as shown to people: the name, or ``"unowned"`` for :data:`UNOWNED`."""
    return UNOWNED_LABEL if owner == UNOWNED else owner

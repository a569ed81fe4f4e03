"""The user's keymap file: which keys run which action, by the action's id.

The file is TOML (read with :mod:`tomllib`)::

    [keys]
    "thread.abort" = "ctrl+a"
    "thread.steer" = "s,m"          # several keys: comma-separated

Each id is an :attr:`tui.actions.Action.id` (the README lists them); each value is one or
more of Textual's key names (``"a"``, ``"A"``, ``"ctrl+a"``, ``"f5"``, ``"?"``). The file
is ``--keymap PATH``, else ``$CUBEPI_KEYMAP``, else ``$XDG_CONFIG_HOME/cubepi-tui/keymap.toml``
(``~/.config/...`` without it). It is applied with Textual's ``App.set_keymap``.

A file that cannot be used (unreadable, not TOML, an unknown id, a value that is not keys,
a key given to two actions of one screen) is ignored as a whole: the app starts with the
default keys and says why in one sentence, as a notice once it is drawn (standard error
would be hidden by the screen the app takes over). The default file may be missing; a
file the user named may not.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from textual.keys import format_key

from tui.actions import BY_ID, TABLES

KEYMAP_ENV = "CUBEPI_KEYMAP"
"""The environment variable naming the keymap file (``--keymap`` outranks it)."""

DEFAULT_NAME = Path("cubepi-tui") / "keymap.toml"
"""The keymap file's path inside the user's configuration directory."""


@dataclass(frozen=True)
class UserKeymap:
    """A keymap as read: what to apply, and why nothing was, if so."""

    keys: Mapping[str, str] = field(default_factory=dict)
    """Binding id → keys (Textual's names, comma-separated), for ``App.set_keymap``; empty
    when there is no file or it could not be used."""
    problem: str | None = None
    """One sentence saying why the file was not used (``None``: used, or none to use)."""


def keymap_path(given: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None) -> tuple[Path, bool]:
    """Where the keymap is, and whether the user named it (``given``, else ``$CUBEPI_KEYMAP``,
    each ``True``) or it is the default under ``$XDG_CONFIG_HOME`` (``False``)."""
    env = os.environ if env is None else env
    if given is not None:
        return Path(given).expanduser(), True
    if env.get(KEYMAP_ENV):
        return Path(env[KEYMAP_ENV]).expanduser(), True
    config = env.get("XDG_CONFIG_HOME") or str(Path("~/.config").expanduser())
    return Path(config) / DEFAULT_NAME, False


def load_keymap(given: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None) -> UserKeymap:
    """Read the keymap :func:`keymap_path` chooses. Never raises: a problem is the
    returned :attr:`UserKeymap.problem`, with no keys."""
    path, named = keymap_path(given, env)
    try:
        with path.open("rb") as file:
            data = tomllib.load(file)
    except FileNotFoundError:
        if not named:
            return UserKeymap()
        return _unused(path, "there is no such file")
    except OSError as error:
        return _unused(path, f"it could not be read ({error.strerror or error})")
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        return _unused(path, f"it is not TOML ({error})")
    try:
        return UserKeymap(keys=parse_keymap(data))
    except ValueError as error:
        return _unused(path, str(error))


def parse_keymap(data: Mapping[str, object]) -> dict[str, str]:
    """The keys of a keymap file's ``data`` (as :func:`tomllib.load` returns it): binding
    id → keys. ``ValueError`` with a phrase ("it names no action 'x'") when the file
    holds anything but a ``[keys]`` table of known ids and key strings, or makes one key
    run two actions of one screen (the defaults of the actions it leaves alone count)."""
    others = sorted(set(data) - {"keys"})
    if others:
        raise ValueError(f"it holds {others[0]!r}, and only a [keys] table is read")
    keys = data.get("keys", {})
    if not isinstance(keys, dict):
        raise ValueError("its 'keys' is not a table")
    chosen: dict[str, str] = {}
    for action_id, value in keys.items():
        if action_id not in BY_ID:
            raise ValueError(f"it names no action {action_id!r} (the README lists them)")
        if not isinstance(value, str) or not all(key.strip() and " " not in key.strip() for key in value.split(",")):
            raise ValueError(f"its {action_id!r} is not one or more key names separated by commas: {value!r}")
        chosen[action_id] = ",".join(key.strip() for key in value.split(","))
    _check_clashes(chosen)
    return chosen


SCOPES: Mapping[str, tuple[str, ...]] = {"threads": ("app",), "thread": ("app", "tool")}
"""For each screen's table, the other tables whose keys are live on it too: the app's on
every screen, a focused tool call's on the thread screen."""


def _check_clashes(chosen: Mapping[str, str]) -> None:
    """``ValueError`` when ``chosen`` makes one key run two actions of one screen."""
    for screen, others in SCOPES.items():
        seen: dict[str, str] = {}
        for prefix in (screen, *others):
            for action in TABLES[prefix]:
                for key in (chosen.get(action.id) or action.keys).split(","):
                    # Textual's display of a key is one per key however it is spelled ("?", "question_mark").
                    shown = format_key(key.strip())
                    if shown in seen:
                        raise ValueError(f"it binds {shown!r} to both {seen[shown]!r} and {action.id!r}")
                    seen[shown] = action.id


def _unused(path: Path, why: str) -> UserKeymap:
    return UserKeymap(problem=f"The keymap {str(path)!r} was not used, so the default keys apply: {why}.")

"""A store URL fit to show: the one rule that keeps passwords out of sentences and the screen.

Used by the store opener (:mod:`core.checkpoint.locations`) and by each networked backend
for its own error sentences, so every message names a server the same way.
"""

from __future__ import annotations

import os
import re

SECRET_PARAMETERS = frozenset({"password", "sslpassword"})
"""Query parameters that carry a password (libpq's ``password`` and ``sslpassword``, the
client key's; redis-py's ``unix://...?password=``)."""


_KEYWORD_SECRET = re.compile(r"\b(" + "|".join(SECRET_PARAMETERS) + r")\s*=\s*('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)
"""A password in libpq's keyword form (``password=secret``, ``password='a b'``)."""

KEYWORD_FORM = re.compile(r"^\s*\w+\s*=\s*\S*(\s+\w+\s*=\s*\S*)+\s*$")
"""libpq's keyword/value connection string (``host=db dbname=threads user=me``): two or
more ``key=value`` words, which no one means as a file name."""


def redacted(url: str | os.PathLike[str]) -> str:
    """``url`` without its password: ``user:secret@`` becomes ``user@`` (``:secret@`` goes
    whole) and the query parameters in :data:`SECRET_PARAMETERS` are dropped; the rest
    is kept as written. Works on malformed URLs too (text only, no parsing that can
    fail); never raises. A string without ``://`` keeps all but the values of
    ``password=`` / ``sslpassword=`` words (libpq's keyword form)."""
    text = os.fspath(url)
    scheme, sep, rest = text.partition("://")
    if not sep:
        return _KEYWORD_SECRET.sub(lambda m: m.group(1) + "=…", text)
    cut = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    authority, tail = rest[:cut], rest[cut:]
    if "@" in authority:
        userinfo, _, host = authority.rpartition("@")
        user = userinfo.partition(":")[0]
        authority = f"{user}@{host}" if user else host
    path, mark, query = tail.partition("?")
    if mark:
        query, hash_mark, fragment = query.partition("#")
        kept = [p for p in query.split("&") if p and p.partition("=")[0].lower() not in SECRET_PARAMETERS]
        tail = path + ("?" + "&".join(kept) if kept else "") + hash_mark + fragment
    return f"{scheme}://{authority}{tail}"

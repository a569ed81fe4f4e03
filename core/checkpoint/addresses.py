"""What both server backends check in a URL's address, and their words for a server they cannot reach.

The Postgres and Redis backends each word their own sentence ("Cannot open the PostgreSQL
database …: <reason>.", "Cannot open the Redis store at …: <reason>."); the reasons that
mean the same thing on both come from here, so the two never say one fault two ways.
Text only: nothing here imports a driver.
"""

from __future__ import annotations

from urllib.parse import unquote

UNREACHABLE = "the server cannot be reached"
"""The reason for a server that refused the connection, timed out or has no such socket."""

PORTS = range(0, 65536)
"""TCP port numbers (RFC 793: a 16-bit field)."""


def port_problem(url: str) -> str | None:
    """The reason clause for the first port in ``url``'s address that is not a TCP port
    number - ``"port 99999 is not a port number (0–65535)"`` - else ``None``.

    ``url`` is ``scheme://[user[:password]@]host[:port][,host[:port]...][/...]``: libpq's
    several-host form (``postgresql://h1:5432,h2:5433/db``) is checked host by host, an
    IPv6 host is bracketed (``[::1]:5432``), and an empty or missing port is left to the
    driver's default. Never raises; the password never appears in what it returns.
    """
    _, sep, rest = url.partition("://")
    if not sep:
        return None
    cut = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    hosts = rest[:cut].rpartition("@")[2]
    for host in hosts.split(","):
        port = host.rpartition("]")[2] if host.startswith("[") else host
        if ":" not in port:
            continue
        text = unquote(port.rpartition(":")[2])
        if text == "":
            continue
        if not (text.isascii() and text.isdigit()) or int(text) not in PORTS:
            shown = text if text.isascii() and text.isdigit() else repr(text)
            return f"port {shown} is not a port number ({PORTS.start}–{PORTS.stop - 1})"
    return None

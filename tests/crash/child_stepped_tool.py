"""Child process of the stepped-tool crash test: runs one thread's agent until it is killed.

Usage: python -m tests.crash.child_stepped_tool REQUEST_JSON, the request holding
``store`` (a location, see :mod:`tests.helpers.store_locations`), ``thread``, ``ledger``,
``process`` (its label in the ledger), ``mode`` (``"prompt"`` or ``"resume"``) and ``args``
(the ``assemble`` call's arguments; see :mod:`tests.crash.stepped`). Prints ``MARK opened``
once the store is open, and ``MARK done <outcome>`` if the run ends before the kill.
"""

from __future__ import annotations

import asyncio
import json
import sys

from tests.crash.stepped import make_agent, prompt_text
from tests.helpers.store_locations import open_location


async def main(req: dict) -> None:
    store = await open_location(req["store"], create=False)
    print("MARK opened", flush=True)
    agent = make_agent(store, req["thread"], req["args"], req["ledger"], req["process"])
    outcome = await (agent.prompt(prompt_text(req["thread"])) if req["mode"] == "prompt" else agent.resume())
    print(f"MARK done {outcome} {agent.state.error or ''}", flush=True)
    await store.close()


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))

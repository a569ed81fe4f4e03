"""After a hang-up, Textual's output queue keeps moving even if its writer thread died."""

from __future__ import annotations

import threading
from queue import Queue

from tui.hangup import drain_output


class DeadWriter(threading.Thread):
    """A writer thread that ended (as Textual's does on EIO), with a full bounded queue."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self._queue: Queue[str | None] = Queue(3)

    def run(self) -> None:
        return


class Driver:
    def __init__(self) -> None:
        self._writer_thread = DeadWriter()


def test_writes_queued_for_a_dead_writer_no_longer_block() -> None:
    driver = Driver()
    writer = driver._writer_thread
    writer.start()
    writer.join()
    for text in ("a", "b", "c"):
        writer._queue.put(text)
    drain_output(driver)
    done = threading.Event()

    def write_more() -> None:
        for _ in range(50):
            writer._queue.put("frame")  # blocked for good without the drain
        done.set()

    threading.Thread(target=write_more, daemon=True).start()
    assert done.wait(10), "writes to the dead writer's queue blocked"

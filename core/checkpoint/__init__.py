"""Thread storage: the contract and the in-memory reference backend.

Drivers are imported by path (``core.checkpoint.sqlite``), so importing this package
never loads a database driver.
"""

from core.checkpoint.base import CheckpointData, Checkpointer, RunRecord, ThreadSummary
from core.checkpoint.memory import MemoryCheckpointer

__all__ = ["CheckpointData", "Checkpointer", "MemoryCheckpointer", "RunRecord", "ThreadSummary"]

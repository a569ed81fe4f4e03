"""One line per figure: what was measured, median, p95, target, met or not, the peer and the ratio.

A :class:`Figure` holds samples in the figure's unit (milliseconds, MB, turns per
second...) and says how it compares with its target (``at_most`` or ``at_least``) and
with a peer's figure measured in the same run. Printing is :func:`line`; nothing here
measures anything.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field


def median(samples: Sequence[float]) -> float:
    """The median of ``samples`` (``nan`` for none)."""
    return statistics.median(samples) if samples else math.nan


def p95(samples: Sequence[float]) -> float:
    """The 95th percentile of ``samples``, nearest rank (``nan`` for none): with 20 or fewer
    samples it is the largest, so a p95 of few samples never hides the worst one."""
    if not samples:
        return math.nan
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


@dataclass
class Figure:
    """One measured figure.

    ``samples`` are in ``unit``; ``at_most`` / ``at_least`` is the target (``None``: no
    target, the figure is printed for comparison); ``higher_is_better`` for rates;
    ``peer`` / ``peer_samples`` the peer's name and samples of the same work, or
    ``peer_note`` one sentence when there is no peer figure (missing package, no such API);
    ``note`` says what else a reader needs (durability, sample windows).
    """

    name: str
    label: str
    unit: str
    samples: list[float] = field(default_factory=list)
    at_most: float | None = None
    at_least: float | None = None
    higher_is_better: bool = False
    percentile: bool = True
    """Whether a p95 means something here (many samples of one thing)."""
    peer: str = ""
    peer_samples: list[float] = field(default_factory=list)
    peer_note: str = ""
    note: str = ""
    error: str = ""
    """Why the figure could not be measured (one sentence), instead of samples."""

    @property
    def median(self) -> float:
        """The median of ``samples``."""
        return median(self.samples)

    @property
    def p95(self) -> float:
        """The nearest-rank 95th percentile of ``samples``."""
        return p95(self.samples)

    @property
    def judged(self) -> float:
        """The value held against the target: the p95 when it applies, else the median."""
        return self.p95 if self.percentile else self.median

    @property
    def met(self) -> bool | None:
        """Whether the target is met (``None``: no target, or nothing measured)."""
        value = self.judged
        if math.isnan(value):
            return None
        if self.at_most is not None:
            return value <= self.at_most
        if self.at_least is not None:
            return value >= self.at_least
        return None

    @property
    def ratio(self) -> float | None:
        """ours / peer of the medians, so below 1 ours is faster for times and, with
        ``higher_is_better``, above 1 ours does more per second (``None``: no peer figure)."""
        if not self.peer_samples or not self.samples:
            return None
        theirs = median(self.peer_samples)
        return self.median / theirs if theirs else None


def _number(value: float) -> str:
    if math.isnan(value):
        return "-"
    if value == int(value) and abs(value) >= 1:
        return f"{value:,.0f}"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}" if abs(value) >= 0.1 else f"{value:.3f}"


def target_words(figure: Figure) -> str:
    """``"<= 50 ms"``, ``">= 1000 turns/s"`` or ``"-"``."""
    if figure.at_most is not None:
        return f"<= {_number(figure.at_most)} {figure.unit}"
    if figure.at_least is not None:
        return f">= {_number(figure.at_least)} {figure.unit}"
    return "-"


def ratio_words(ratio: float | None) -> str:
    """``"x0.47"``; a small ratio also as a fraction, ``"x0.00005 (1/20,000)"``."""
    if ratio is None or math.isnan(ratio):
        return "-"
    text = f"x{ratio:.2g}" if ratio < 0.1 else f"x{ratio:.2f}"
    return f"{text} (1/{1 / ratio:,.0f})" if 0 < ratio < 0.1 else text


HEADER = f"{'figure':<74} {'median':>9} {'p95':>9} {'n':>4}  {'target':<15} {'met':<8} peer"
"""The column heads of :func:`line`."""


def line(figure: Figure) -> str:
    """The figure as one line (then its note, indented, when it has one)."""
    if figure.error:
        return f"{figure.label:<74} not measured: {figure.error}"
    unit = f" {figure.unit}"
    p95_text = _number(figure.p95) if figure.percentile and len(figure.samples) > 1 else "-"
    met = {True: "met", False: "NOT MET", None: "-"}[figure.met]
    peer = figure.peer_note
    if figure.peer_samples:
        ratio = figure.ratio
        word = "ours/peer" if not figure.higher_is_better else "ours/peer (rate)"
        peer = f"{figure.peer} {_number(median(figure.peer_samples))}{unit}; {word} {ratio_words(ratio)}"
    text = (
        f"{figure.label:<74} {_number(figure.median):>9} {p95_text:>9} {len(figure.samples):>4}  "
        f"{target_words(figure):<15} {met:<8} {peer}"
    )
    if figure.note:
        text += f"\n{'':4}{figure.note}"
    return text

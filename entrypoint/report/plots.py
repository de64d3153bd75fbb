"""The PNG plots of a rentune report: loss per trial and a metric per category, returned as bytes.

Drawn with matplotlib's object-oriented API (`Figure` + `FigureCanvasAgg`), never pyplot: no global state,
no backend switch, no display needed, safe to call from any thread. Every figure is 100 DPI and saved
without the "Software" PNG tag, so the same data gives the same bytes with the same matplotlib.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence

from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

__all__ = ["category_bars_png", "loss_curves_png"]

DPI = 100
LOSS_FIGSIZE = (10.0, 6.0)  # inches: 1000x600 px, wide enough for a legend beside the axes
BARS_WIDTH = 10.0  # inches; categories go down the y axis, so only the height grows with them
BARS_MIN_HEIGHT, BARS_MAX_HEIGHT = 3.0, 16.0  # inches; past the cap the bars get thinner, not the image taller
MAX_LABEL_CHARS = 40  # longer category names are cut with an ellipsis so the bars keep their width
LEGEND_ROWS = 24  # legend entries per column before another column starts


def _png(fig: Figure) -> bytes:
    FigureCanvasAgg(fig)  # attaches itself to fig; savefig then renders with Agg
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    return buf.getvalue()


def _finite(points: Sequence[tuple[int, float]]) -> tuple[list[int], list[float], bool]:
    """Steps and losses of the finite points, and whether any point was dropped as nan/inf."""
    kept = [(step, float(loss)) for step, loss in points if math.isfinite(loss)]
    return [s for s, _ in kept], [loss for _, loss in kept], len(kept) < len(points)


def _legend(fig: Figure, entries: int) -> None:
    """Beside the axes, not on them: many trials or series must not hide the data."""
    if entries:
        fig.legend(loc="outside right upper", fontsize="small", ncols=1 + (entries - 1) // LEGEND_ROWS)


def loss_curves_png(
    trials: Mapping[str, Mapping[str, Sequence[tuple[int, float]]]], title: str = "Loss per trial"
) -> bytes:
    """Train (solid) and eval (dashed, markers) loss against optimizer step, one colour per trial.

    `trials` is `{trial_id: {"train": [(step, loss), ...], "eval": [(step, loss), ...], "resumed": [step]}}`;
    any list may be missing or empty; each resumed step (where a fresh process went on) is a dotted line.
    Non-finite losses are skipped and the line's legend entry says so; a trial with no points at all still
    gets a legend entry "<trial> (no losses recorded)". Raises ValueError if `trials` is empty.
    """
    if not trials:
        raise ValueError("loss_curves_png: no trials to plot")
    fig = Figure(figsize=LOSS_FIGSIZE, dpi=DPI, layout="constrained")
    ax = fig.add_subplot()
    palette = colormaps["tab10" if len(trials) <= 10 else "tab20"]
    entries = 0
    for i, (trial, curves) in enumerate(trials.items()):
        colour = palette(i % palette.N)
        drawn = False
        for kind, style in (("train", {"linestyle": "-"}), ("eval", {"linestyle": "--", "marker": "o"})):
            steps, losses, dropped = _finite(curves.get(kind, ()))
            if not steps and not dropped:
                continue
            label = f"{trial} {kind}" + (" (non-finite losses omitted)" if dropped else "")
            if len(steps) == 1:
                style = {**style, "marker": "o"}  # a lone point has no line to show it
            ax.plot(steps, losses, color=colour, label=label, markersize=4, **style)
            drawn, entries = True, entries + 1
        if not drawn:
            ax.plot([], [], color=colour, linestyle=":", label=f"{trial} (no losses recorded)")
            entries += 1
        for n, step in enumerate(curves.get("resumed", ())):  # a fresh process went on from this step
            ax.axvline(step, color=colour, linestyle=":", alpha=0.7, label=f"{trial} resumed" if n == 0 else None)
            entries += n == 0
    ax.set_title(title)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss")
    ax.grid(True, alpha=0.3)
    _legend(fig, entries)
    return _png(fig)


def _short(name: str) -> str:
    return name if len(name) <= MAX_LABEL_CHARS else name[: MAX_LABEL_CHARS - 1] + "\u2026"


def category_bars_png(
    categories: Sequence[str], series: Mapping[str, Sequence[float]], metric: str = "F1", title: str = ""
) -> bytes:
    """Grouped horizontal bars: one group per category (top to bottom, in order), one bar per series.

    Values are a score in [0, 1] (F1, accuracy, ...) on an axis fixed to 0..1; `series` maps a name such as
    "baseline" or "main" to one value per category, in the order of `categories`. The image grows taller
    with the number of categories up to BARS_MAX_HEIGHT. Raises ValueError, listing every problem, if
    `categories` or `series` is empty, a series' length differs from len(categories), or a value is not a
    finite number in [0, 1].
    """
    problems = []
    if not categories:
        problems.append("categories is empty")
    if not series:
        problems.append("series is empty")
    for name, values in series.items():
        if len(values) != len(categories):
            problems.append(f"series {name!r}: {len(values)} values for {len(categories)} categories")
        bad = [f"#{i}={v!r}" for i, v in enumerate(values) if not (math.isfinite(v) and 0.0 <= v <= 1.0)]
        if bad:
            problems.append(f"series {name!r}: values outside [0, 1]: {', '.join(bad)}")
    if problems:
        raise ValueError("category_bars_png: " + "; ".join(problems))

    n_cat, n_series = len(categories), len(series)
    height = 1.5 + n_cat * (0.16 * n_series + 0.2)  # about 0.7 in per category with 3 series
    fig = Figure(
        figsize=(BARS_WIDTH, min(max(height, BARS_MIN_HEIGHT), BARS_MAX_HEIGHT)), dpi=DPI, layout="constrained"
    )
    ax = fig.add_subplot()
    palette = colormaps["tab10" if n_series <= 10 else "tab20"]
    bar = 0.8 / n_series  # the group fills 80% of the slot between two categories
    for i, (name, values) in enumerate(series.items()):
        offsets = [c + (i - (n_series - 1) / 2) * bar for c in range(n_cat)]
        ax.barh(offsets, values, height=bar, color=palette(i % palette.N), label=name)
    ax.set_yticks(range(n_cat), [_short(c) for c in categories])
    ax.invert_yaxis()  # first category at the top, first series at the top of each group
    ax.set_xlim(0.0, 1.0)
    ax.set_xlabel(metric)
    ax.set_title(title or f"{metric} per category")
    ax.grid(True, axis="x", alpha=0.3)
    _legend(fig, n_series)
    return _png(fig)

"""The report's PNG plots: valid PNG bytes of a plausible size that depend on the data; bad input raises."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from entrypoint.report.plots import category_bars_png, loss_curves_png

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
NAN, INF = float("nan"), float("inf")


def open_png(png: bytes) -> Image.Image:
    """Check the signature and the whole file (verify), then reopen: verify leaves the image unusable."""
    assert png.startswith(PNG_SIGNATURE)
    Image.open(io.BytesIO(png)).verify()
    image = Image.open(io.BytesIO(png))
    assert image.format == "PNG"
    assert image.mode in {"RGB", "RGBA"}
    assert image.width >= 600
    assert 200 <= image.height <= 2000
    return image


def curve(start: float, steps: int = 20) -> list[tuple[int, float]]:
    return [(step, start / (1 + step)) for step in range(0, steps * 10, 10)]


def test_loss_curves_three_trials_with_nan_and_empty():
    trials = {
        "main": {"train": curve(2.0), "eval": curve(2.2, steps=5)},
        "lr-3e-3": {"train": [(0, 2.0), (10, NAN), (20, INF), (30, 1.1)], "eval": [(30, 1.3)]},
        "lr-1e-5": {"train": [], "eval": []},
    }
    open_png(loss_curves_png(trials, title="Loss per trial"))


def test_loss_curves_single_trial_train_only_and_all_nan():
    open_png(loss_curves_png({"main": {"train": curve(2.0)}}))
    open_png(loss_curves_png({"diverged": {"train": [(0, NAN), (10, NAN)], "eval": []}}))


def test_loss_curves_depend_on_data():
    first = loss_curves_png({"main": {"train": curve(2.0), "eval": []}})
    assert loss_curves_png({"main": {"train": curve(2.0), "eval": []}}) == first  # deterministic
    assert loss_curves_png({"main": {"train": curve(5.0), "eval": []}}) != first


def test_loss_curves_empty_raises():
    with pytest.raises(ValueError, match="no trials"):
        loss_curves_png({})


def scores(n: int, offset: float) -> list[float]:
    return [(offset + 0.07 * i) % 1.0 for i in range(n)]


def test_category_bars_grow_with_categories():
    series_names = ["baseline", "main", "lr-3e-3"]
    small = open_png(
        category_bars_png(["billing", "outage"], {s: scores(2, i / 3) for i, s in enumerate(series_names)})
    )
    categories = [f"category {i}: a long descriptive name for a support-ticket queue" for i in range(12)]
    large = open_png(
        category_bars_png(categories, {s: scores(12, i / 3) for i, s in enumerate(series_names)}, metric="recall")
    )
    assert large.width * large.height > small.width * small.height
    assert large.height > small.height


def test_category_bars_accept_bounds():
    open_png(category_bars_png(["a", "b"], {"main": [0.0, 1.0]}, title="F1: main vs baseline"))


def test_category_bars_depend_on_data():
    first = category_bars_png(["a", "b"], {"baseline": [0.2, 0.4], "main": [0.6, 0.8]})
    assert category_bars_png(["a", "b"], {"baseline": [0.2, 0.4], "main": [0.6, 0.8]}) == first  # deterministic
    assert category_bars_png(["a", "b"], {"baseline": [0.2, 0.4], "main": [0.9, 0.1]}) != first


@pytest.mark.parametrize(
    ("categories", "series", "message"),
    [
        ([], {"main": []}, "categories is empty"),
        (["a"], {}, "series is empty"),
        (["a", "b"], {"main": [0.5]}, "'main': 1 values for 2 categories"),
        (["a"], {"main": [1.5]}, r"'main': values outside \[0, 1\]"),
        (["a"], {"main": [NAN]}, r"'main': values outside \[0, 1\]"),
    ],
)
def test_category_bars_bad_input_raises(categories, series, message):
    with pytest.raises(ValueError, match=message):
        category_bars_png(categories, series)


def test_category_bars_lists_every_problem():
    with pytest.raises(ValueError) as excinfo:
        category_bars_png(["a", "b"], {"baseline": [0.5], "main": [0.5, -0.1]})
    assert "'baseline': 1 values" in str(excinfo.value)
    assert "'main': values outside" in str(excinfo.value)


def test_the_bar_plot_breakdown_comes_from_the_task_or_from_what_older_results_hold():
    from entrypoint.report.results import bar_family

    metrics = {"macro_f1": 0.5, "accuracy": 0.6, "f1/a": 0.4, "f1/b": 0.6, "recall/a": 0.3}
    assert bar_family("f1", metrics) == ("f1", ["f1/a", "f1/b"])
    assert bar_family(None, metrics) == ("f1", ["f1/a", "f1/b"])  # results.json of an earlier rentune
    rates = {"format_valid_rate": 0.9, "json_valid_rate": 0.95}
    assert bar_family(None, rates) == ("metric", ["format_valid_rate", "json_valid_rate"])  # no breakdown held

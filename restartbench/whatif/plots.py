"""The what-if's figures: the restart's parts stacked per engine, and goodput against scale."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from restartbench.whatif.predict import RESTART_PARTS  # noqa: E402


def draw(result: dict[str, Any], folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"whatif-{result['preset']}-{result['layout']}"
    return [*_save(restart_parts(result), folder / f"{stem}-restart"),
            *_save(goodput_scale(result), folder / f"{stem}-goodput-scale")]


def _save(figure: plt.Figure, stem: Path) -> list[Path]:
    paths = [stem.with_suffix(".png"), stem.with_suffix(".svg")]
    for path in paths:
        figure.savefig(path, bbox_inches="tight")
    plt.close(figure)
    return paths


def restart_parts(result: dict[str, Any]) -> plt.Figure:
    engines = result["engines"]
    figure, axes = plt.subplots(figsize=(7, 4))
    bottoms = [0.0] * len(engines)
    names = [r["engine"] for r in engines]
    for name in RESTART_PARTS:
        heights = [r["restart"][name]["s"] for r in engines]
        label = name + (" (assumed)" if any(r["restart"][name]["assumed"] for r in engines) else "")
        axes.bar(names, heights, bottom=bottoms, label=label)
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    for i, r in enumerate(engines):
        total = r["restart"]["total"]
        axes.errorbar(i, total["s"], yerr=[[total["s"] - total["low_s"]], [total["high_s"] - total["s"]]],
                      color="black", capsize=4)
    axes.set_ylabel("predicted restart, s")
    axes.set_title(f"{result['preset']} {result['layout']} on {result['cluster']}: restart parts (prediction)",
                   fontsize=9)
    axes.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1, 1))
    figure.text(0, -0.04, "error bars: the range the calibration's spread gives; (assumed): a cited constant entered "
                "the part", fontsize=7)
    return figure


def goodput_scale(result: dict[str, Any]) -> plt.Figure:
    figure, axes = plt.subplots(figsize=(7, 4))
    for engine in dict.fromkeys(row["engine"] for row in result["scale"]):
        rows = [row for row in result["scale"] if row["engine"] == engine]
        gpus = [row["gpus"] for row in rows]
        axes.plot(gpus, [row["goodput_pct"] for row in rows], marker="o", label=engine)
        axes.fill_between(gpus, [row["goodput_pct_low"] for row in rows], [row["goodput_pct_high"] for row in rows],
                          alpha=0.15)
        for row in rows:
            if row["assumed"]:
                axes.annotate("a", (row["gpus"], row["goodput_pct"]), fontsize=6, xytext=(2, 3),
                              textcoords="offset points")
    axes.set_xscale("log", base=2)
    axes.set_xlabel("GPUs")
    axes.set_ylabel("predicted goodput, %")
    axes.set_title(f"{result['preset']} at tp·pp of {result['layout']}, dp grown, on {result['cluster']} "
                   f"(prediction)", fontsize=9)
    axes.legend(fontsize=8)
    figure.text(0, -0.06, f"Young/Daly at {result['failures_per_gpu_hour']:.3g} failures per GPU-hour; 'a': a cited "
                "constant (assumed) entered the point: " + ", ".join(result["assumed"]) + "; band: calibration "
                "spread", fontsize=6, wrap=True)
    return figure

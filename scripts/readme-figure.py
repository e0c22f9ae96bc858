#!/usr/bin/env python3
"""The README's picture: the report's two key figures, from real runs, into docs/img/readme-figure.png.

    python scripts/readme-figure.py                 # three tiny real runs (none, torch, lazy), a few minutes
    python scripts/readme-figure.py --logs DIR      # the run folders under DIR instead (e.g. a sweep's logs)

Without ``--logs`` it runs ``./submit-job.sh tiny tp1pp1dp2 --dtype fp32 --engine E`` for E in none, torch and lazy
into a temporary logs folder: a synchronous engine, an asynchronous one, and the relaunch that restores nothing.
It then reads the run folders with ``restartbench.analysis.collect``, draws the report's own figures
(``restartbench.report.figures``: the checkpoint's whole cost per engine and the restart's parts), and stacks the
two into one palette PNG under 300 KB. The command, the commit and the runs are kept in the PNG's text chunks
(``python -c "from PIL import Image; print(Image.open('docs/img/readme-figure.png').text)"``). The picture is never
drawn by hand: rerun this script when the code or the figures change.
"""

from __future__ import annotations

import argparse
import io
import subprocess
import sys
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
from PIL import Image, PngImagePlugin  # noqa: E402

from restartbench import analysis, report  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "img" / "readme-figure.png"
FIGURES = ("checkpoint_cost", "restart_phases")  # keys of report.figures, top to bottom
ENGINES = ("none", "torch", "lazy")
RUN = ("tiny", "tp1pp1dp2", "--dtype", "fp32")
MAX_BYTES = 300_000


def run_engines(logs: Path) -> None:
    """One real run per engine into ``logs``; a failed run stops the script (the picture must show real runs)."""
    for engine in ENGINES:
        command = ["./submit-job.sh", *RUN, "--engine", engine, "--logs", str(logs)]
        print("$", " ".join(command), flush=True)
        done = subprocess.run(command, cwd=ROOT)
        if done.returncode:
            sys.exit(f"readme-figure: {' '.join(command)} exited {done.returncode}")


def rendered(fig, dpi: int) -> Image.Image:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, facecolor="white")
    return Image.open(io.BytesIO(buffer.getvalue())).convert("RGB")


def stack(images: list[Image.Image]) -> Image.Image:
    width = max(image.width for image in images)
    picture = Image.new("RGB", (width, sum(image.height for image in images)), "white")
    top = 0
    for image in images:
        picture.paste(image, ((width - image.width) // 2, top))
        top += image.height
    return picture


def commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short=10", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--logs", type=Path, help="read the run folders under this folder instead of running")
    parser.add_argument("--out", type=Path, default=OUT, help=f"the PNG to write (default: {OUT.relative_to(ROOT)})")
    parser.add_argument("--dpi", type=int, default=100)
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="readme-figure-") as scratch:
        logs = args.logs
        if logs is None:
            logs = Path(scratch) / "logs"
            run_engines(logs)
        collected = analysis.collect(logs)
        table = collected.table()
        if table.empty:
            sys.exit(f"readme-figure: no complete run under {logs} ({len(collected.excluded)} left out)")
        figures = report.figures(collected)
        missing = [name for name in FIGURES if name not in figures]
        if missing:
            sys.exit(f"readme-figure: restartbench.report.figures has no {missing}; it has {sorted(figures)}")
        picture = stack([rendered(figures[name], args.dpi) for name in FIGURES])
        runs = sorted(set(table["run_id"].dropna().astype(str)))

    info = PngImagePlugin.PngInfo()
    info.add_text("Software", "scripts/readme-figure.py")
    info.add_text("Command", " ".join(["python", "scripts/readme-figure.py", *(argv or sys.argv[1:])]))
    info.add_text("Commit", commit())
    info.add_text("Runs", ", ".join(runs))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    picture.quantize(colors=64, method=Image.Quantize.MEDIANCUT).save(args.out, optimize=True, pnginfo=info)
    size = args.out.stat().st_size
    print(f"{args.out}: {picture.width}x{picture.height}, {size / 1000:.0f} KB, from {len(runs)} runs")
    if size > MAX_BYTES:
        sys.exit(f"readme-figure: {args.out} is {size} bytes, above {MAX_BYTES}: lower --dpi")
    return 0


if __name__ == "__main__":
    sys.exit(main())

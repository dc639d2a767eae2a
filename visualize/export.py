"""Write every analysis chart of a panel-data JSON file as a static PNG (Matplotlib).

python -m visualize.export assets/analysis_default.json out/figures
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from csd.records.panel_data import Panels
from visualize.panels import analysis_charts
from visualize.render import save_png


def export_pngs(panels: Panels, directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    return [save_png(chart, directory / f"{key}.png") for key, chart in analysis_charts(panels).items()]


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("panels", type=Path)
    ap.add_argument("out", type=Path)
    args = ap.parse_args(argv)
    for path in export_pngs(Panels.load(args.panels), args.out):
        print(path)


if __name__ == "__main__":
    main()

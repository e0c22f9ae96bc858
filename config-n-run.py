#!/usr/bin/env python3
"""Render the DeepSpeed JSON and launch script for one study run, then run it (or --dry-run).

    python config-n-run.py 13B tp2pp4 --dry-run
    python config-n-run.py tiny tp2pp2 --engine torch --iters 4 --save-interval 2

Options are generated from the run configuration tree (restartbench/config.py); --help lists them.
"""

import sys

from restartbench.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""``python -m restartbench.whatif``: see restartbench.whatif.cli."""

import sys

from restartbench.whatif.cli import main

sys.exit(main())

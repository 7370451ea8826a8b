"""``python -m lcmoe_recipes.calibrate``: the calibration command (:mod:`lcmoe_recipes.cli.calibrate`)."""

import sys

from .cli.calibrate import main

if __name__ == "__main__":
    sys.exit(main())

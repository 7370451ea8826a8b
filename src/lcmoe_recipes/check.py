"""``python -m lcmoe_recipes.check``: the checking command (:mod:`lcmoe_recipes.cli.check`)."""

import sys

from .cli.check import main

if __name__ == "__main__":
    sys.exit(main())

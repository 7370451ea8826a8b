"""python -m lcmoe_recipes.plan: the search's command line (:func:`lcmoe_recipes.plan.cli.main`)."""

import sys

from .cli import main

sys.exit(main())

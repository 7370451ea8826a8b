"""``python -m lcmoe_recipes.plan``: the planner's command (:mod:`lcmoe_recipes.cli.plan`)."""

import sys

from ..cli.plan import main

sys.exit(main())

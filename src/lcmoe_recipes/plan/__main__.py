"""python -m lcmoe_recipes.plan: the planner's command line (lcmoe_recipes.planner.main)."""

import sys

from ..planner import main

sys.exit(main())

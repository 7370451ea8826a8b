"""``python -m lcmoe_recipes.launch``: the main job's command (:mod:`lcmoe_recipes.cli.launch`)."""

import sys

from ..cli.launch import main

sys.exit(main())

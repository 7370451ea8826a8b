"""``python -m lcmoe_recipes.plan``: the planner's command (:mod:`lcmoe_recipes.cli.plan`)."""

if __name__ == "__main__":
    import sys

    from .cli.plan import main

    sys.exit(main())

"""``python -m lcmoe_recipes.check``: the checking command (:mod:`lcmoe_recipes.cli.check`)."""

if __name__ == "__main__":
    import sys

    from .cli.check import main

    sys.exit(main())

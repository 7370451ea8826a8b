"""``python -m lcmoe_recipes.train``: the entry script every rank of a job runs (:mod:`lcmoe_recipes.cli.train`)."""

if __name__ == "__main__":
    import sys

    from .cli.train import main

    sys.exit(main())

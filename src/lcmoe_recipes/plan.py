"""``python -m lcmoe_recipes.plan``: the planner's command (:mod:`lcmoe_recipes.cli.plan`)."""

if __name__ == "__main__":
    import sys

    from .cli.plan import main

    try:
        sys.exit(main())
    except BrokenPipeError:  # `plan ... | head`: the reader has what it wanted; no traceback
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)

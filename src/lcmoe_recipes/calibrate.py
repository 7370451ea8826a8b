"""``python -m lcmoe_recipes.calibrate``: the calibration command (:mod:`lcmoe_recipes.cli.calibrate`)."""

if __name__ == "__main__":
    import sys

    from .cli.calibrate import main

    sys.exit(main())

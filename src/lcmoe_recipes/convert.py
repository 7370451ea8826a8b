"""``python -m lcmoe_recipes.convert``: a Hugging Face checkpoint converted into a Megatron checkpoint (:mod:`lcmoe_recipes.cli.convert`)."""

if __name__ == "__main__":
    import sys

    from .cli.convert import main

    sys.exit(main())

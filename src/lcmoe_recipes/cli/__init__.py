"""The commands: each parses its flags into a request (or a config to examine), calls the library, and prints.

``launch`` (:mod:`.launch`), ``plan`` (:mod:`.plan`), ``check`` (:mod:`.check`); :mod:`.common` holds what they
share. They run as ``python -m lcmoe_recipes.launch|plan|check`` and as the ``lcmoe-*`` console scripts.
"""

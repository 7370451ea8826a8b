"""The commands: each parses its flags into a request (or a config to examine), calls the library, and prints.

``launch`` (:mod:`.launch`), ``plan`` (:mod:`.plan`), ``check`` (:mod:`.check`), ``calibrate`` (:mod:`.calibrate`),
``convert`` (:mod:`.convert`) and the entry script each rank runs, ``train`` (:mod:`.train`); :mod:`.common` holds what
they share (the parser, a request from flags, errors written with flags). They run as ``python -m
lcmoe_recipes.launch|plan|check|calibrate|convert|train`` (the doors at the package root) and as the ``lcmoe-*``
console scripts.
"""

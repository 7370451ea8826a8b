"""The types every floor reads: the request (:mod:`.request`), the Plan and its reasons (:mod:`.plan`), the parallel
layout (:mod:`.layout`), rank placement (:mod:`.ranks`) and the pipeline split (:mod:`.pipeline`). Nothing here imports
torch or megatron, and nothing here decides: the rules do (:mod:`lcmoe_recipes.rules`)."""

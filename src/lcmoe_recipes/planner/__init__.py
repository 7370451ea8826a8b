"""The planner: a :class:`~lcmoe_recipes.core.request.TrainingRequest` answered by one resolver
(:mod:`.resolve`: the one door to the search, returning a :class:`~lcmoe_recipes.planner.resolve.Resolution`), the
search over layouts (:mod:`.search`), the named recipes (:mod:`.recipes`), retargeting a config to a longer length
(:mod:`.retarget`), and examining a config before it is queued (:mod:`.examine`). No torch or megatron import here
(the YAML readers load megatron-bridge when called)."""

"""Probes: megatron-core's real model of a config, built on the CPU at its full world size with fake process groups on
the meta device (:mod:`.build`, with the build-only stand-ins of :mod:`.substitutions` and the one-rank world of
:mod:`.fake_world`), one layer's saved activations measured (:mod:`.activations`), and one rank run on one GPU
(:mod:`.rank_run`). Each reads a ConfigContainer and reports; none changes it (docs/build.md)."""

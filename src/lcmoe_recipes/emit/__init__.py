"""Plan -> megatron-bridge ConfigContainer (:mod:`.config`), ConfigContainer -> Plan (:mod:`.readback`), a config
validated for its target (:mod:`.validate`), overrides, YAML files, and the probes that build and measure a config's
real model (:mod:`.probe`). The only package besides :mod:`lcmoe_recipes.jobs` that imports megatron.

Importing this package is cheap and changes nothing: megatron-bridge loads on the first call that needs it
(:func:`.stack.load_bridge`, which first puts the light-environment guard on ``sys.meta_path``: inert when Transformer
Engine is installed).
"""

from .config import config_from_plan
from .derived import follow_overrides
from .overrides import apply_overrides, data_overrides, save_overrides
from .readback import plan_from_config
from .settings import retarget_config
from .validate import config_findings, validate_config
from .yaml_io import read_meta, read_tree, read_yaml, target_meta, target_of, write_yaml

__all__ = ["config_from_plan", "config_findings", "follow_overrides", "plan_from_config", "validate_config", "apply_overrides",
           "data_overrides", "save_overrides", "read_meta", "read_tree", "read_yaml", "write_yaml", "retarget_config",
           "target_meta", "target_of"]

"""Plan -> megatron-bridge ConfigContainer and back; the only package that imports megatron (lazily).

Importing this package is cheap; megatron-bridge loads on the first call that needs it (:func:`.stack.load_bridge`).
Importing it also puts the light-environment guard on ``sys.meta_path`` (inert when Transformer Engine is
installed), so ``import megatron.bridge`` works afterwards in either environment.
"""

from .stack import install_te_guard

install_te_guard()

from .config import build_config, config_findings, plan_from_config, validate_config
from .overrides import apply_overrides, data_overrides, save_overrides
from .settings import retarget_config
from .yaml_io import read_meta, read_tree, read_yaml, target_meta, target_of, write_yaml

__all__ = ["build_config", "config_findings", "plan_from_config", "validate_config", "apply_overrides",
           "data_overrides", "save_overrides", "read_meta", "read_tree", "read_yaml", "write_yaml", "retarget_config", "target_meta",
           "target_of"]

"""The full environment (Transformer Engine installed: scripts/setup.sh --with-te).

There, upstream runtime_config_update / validate() runs on our configs with nothing answered but the world size and
the GPU (this machine has none), and the emitted YAML is byte-identical to the light environment's (recipes/*.yaml).
"""

import copy
from pathlib import Path

import pytest

from lcmoe_recipes.emit.stack import te_installed
from scripts_loader import load_script

pytestmark = [pytest.mark.te, pytest.mark.slow,
              pytest.mark.skipif(not te_installed(), reason="needs Transformer Engine (scripts/setup.sh --with-te)")]
ROOT = Path(__file__).resolve().parent.parent


def test_guard_is_inert_with_te(configs):
    import sys

    lora = sys.modules["megatron.bridge.peft.lora_layers"]
    assert lora.te.__name__ == "transformer_engine.pytorch"  # the real module, not our placeholder
    from megatron.core.extensions.transformer_engine import HAVE_TE

    assert HAVE_TE


def test_upstream_runtime_config_update_unchanged(configs):
    import megatron.core.transformer.moe.moe_utils as moe_utils
    import megatron.core.utils as mcore_utils
    from megatron.bridge.training.config import runtime_config_update

    from lcmoe_recipes.emit.target import target_environment

    for name, (plan, cfg) in configs.items():
        trial = copy.deepcopy(cfg)
        with target_environment(plan.hardware_spec, plan.layout.world):
            assert str(mcore_utils.get_te_version()).startswith("2.")  # the installed TE answers
            assert moe_utils.fused_permute is not None and "target" not in moe_utils.fused_permute.__name__
            runtime_config_update(trial)
        assert trial.data_parallel_size == plan.layout.dp


def test_full_env_emits_the_light_env_yaml(tmp_path):
    regen = load_script("regen_recipes")
    for name, path in regen.emit_all(tmp_path).items():
        assert path.read_text() == (ROOT / "recipes" / path.name).read_text(), name

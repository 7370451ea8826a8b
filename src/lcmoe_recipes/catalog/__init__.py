"""Catalogues of models and hardware (architecture numbers and datasheet values, each with its source)."""

from .hardware import HARDWARE, Hardware, get_hardware
from .models import MODELS, ModelSpec
from .registry import get_model, models_by_hf_id
from .user import load_model_config

__all__ = ["HARDWARE", "Hardware", "get_hardware", "MODELS", "ModelSpec", "get_model", "load_model_config",
           "models_by_hf_id"]

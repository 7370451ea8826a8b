"""What a run that trains needs before it starts: real data, a tokenizer for it, the weights a context extension
starts from, and (here, on the local executor) the GPUs.

megatron-bridge 0.6.2 trains on megatron-core's mock dataset whenever ``dataset.blend``, ``blend_per_split`` and
``data_path`` are all unset (``GPTDatasetConfig.finalize`` then sets ``mock``; the YAML still says ``mock: false``),
with whatever tokenizer the config names -- ``NullTokenizer`` in our configs until ``--tokenizer`` is given -- and
from random weights when ``checkpoint.pretrained_checkpoint`` is unset. A dry run or a ``--smoke`` check needs none of
these; a launch that trains does, so :func:`start_blockers` lists what is missing and :func:`refuse_to_start`
refuses the launch before anything is written or submitted, unless the user opts in (``mock_data``: train on
synthetic tokens on purpose; ``from_scratch``: random initialisation on purpose).
"""

from __future__ import annotations

from typing import NamedTuple

from ..emit.paths import real_data
from ..errors import LcmoeError
from .executors.local import local_gpus


class Blocker(NamedTuple):
    """One reason a run cannot start as a real training run: its rule (``start/*``), what is wrong, the fix, and the
    request fields the fix names (the commands show them as flags)."""

    rule: str
    message: str
    fix: str
    fields: tuple[str, ...]


def extends_positions(cfg) -> bool:
    """True when ``cfg`` stretches the model's positions past the length it was trained at (a YaRN / RoPE scaling
    factor above 1: ``model.rotary_scaling_factor`` or ``model.yarn_rotary_scaling_factor``): a context extension,
    which only makes sense from pretrained weights (DeepSeek-V3 went 4K -> 32K -> 128K from its 4K model,
    arXiv 2412.19437 §4.3)."""
    model = getattr(cfg, "model", None)
    factors = (getattr(model, name, None) for name in ("rotary_scaling_factor", "yarn_rotary_scaling_factor"))
    return any(isinstance(f, (int, float)) and f > 1 for f in factors)


def start_blockers(cfg, *, mock_data: bool = False, from_scratch: bool = False,
                   local_ranks: int | None = None) -> list[Blocker]:
    """What stops ``cfg`` from training as a real run (rules ``start/*``), each with its fix.

    Args:
        cfg: the ConfigContainer the ranks will run (with the data and weights overrides applied).
        mock_data: the user asked for mock data on purpose (``--mock-data``).
        from_scratch: the user asked for random initialisation on purpose (``--from-scratch``).
        local_ranks: the ranks a local run starts on this machine, one GPU each (None: not a local run).
    """
    out: list[Blocker] = []
    tok = getattr(getattr(cfg, "tokenizer", None), "tokenizer_type", None)
    if not real_data(cfg) and not mock_data:
        out.append(Blocker("start/mock-data", "the config names no dataset (`dataset.blend` is null): "
                           "megatron-core would train on its mock dataset of synthetic tokens",
                           "give data_path=PREFIX (Megatron .bin/.idx prefixes) with tokenizer=NAME, or set "
                           "`mock_data` to train on mock data on purpose", ("data_path", "tokenizer", "mock_data")))
    elif real_data(cfg) and tok == "NullTokenizer":
        out.append(Blocker("start/null-tokenizer", "real data with `tokenizer.tokenizer_type` NullTokenizer: "
                           "its ids would not match the data's", "give tokenizer=NAME_OR_DIR (the data's Hugging "
                           "Face tokenizer)", ("tokenizer",)))
    pretrained = getattr(getattr(cfg, "checkpoint", None), "pretrained_checkpoint", None)
    if extends_positions(cfg) and not pretrained and not from_scratch:
        out.append(Blocker("start/random-init", "the config extends the model's positions (a RoPE/YaRN "
                           "scaling factor above 1) but starts from random weights (`checkpoint.pretrained_checkpoint` "
                           "is null)", "give from_hf=DIR (a Hugging Face folder, converted) or "
                           "from_checkpoint=DIR (a Megatron checkpoint), or set `from_scratch` to start from random "
                           "weights on purpose", ("from_hf", "from_checkpoint", "from_scratch")))
    if local_ranks is not None and (here := local_gpus()) < local_ranks:
        out.append(Blocker("start/gpus-here", f"this machine has {here} GPU(s); the config needs "
                           f"{local_ranks}", "run it on the cluster (executor=slurm or executor=kubeflow), or check it here "
                           "with `smoke`", ("executor", "smoke")))
    return out


def refuse_to_start(cfgs, *, mock_data: bool = False, from_scratch: bool = False,
                    local_ranks: int | None = None) -> None:
    """Raise one error listing every :func:`start_blockers` of the configs of one launch (its phases), each once;
    nothing raised when there are none.

    Raises:
        LcmoeError: the blockers' messages, then their fixes, in order (exit 2: nothing was started or written).
    """
    blockers = list(dict.fromkeys(b for cfg in cfgs for b in start_blockers(  # phases share most: each said once
        cfg, mock_data=mock_data, from_scratch=from_scratch, local_ranks=local_ranks)))
    if not blockers:
        return
    fields = tuple(dict.fromkeys(name for b in blockers for name in b.fields))
    raise LcmoeError("this launch would not train as asked: " + "; ".join(f"({i}) {b.message}" for i, b in
                                                                      enumerate(blockers, 1)),
                     "; ".join(f"({i}) {b.fix}" for i, b in enumerate(blockers, 1))
                     + " (a dry run or a smoke check needs none of these)", fields=fields)

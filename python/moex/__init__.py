"""moex: Mixture-of-Experts layers and models with interchangeable experts backends.

Plain Python (numpy, torch, cupy, ... arrays; no copies)::

    out = moex.experts_forward(hidden, top_k_index, top_k_weights, gate_up_proj, down_proj,
                               implementation="grouped_mm")
    lm = moex.from_pretrained("path/to/checkpoint", experts_implementation="grouped_mm")
    logits = lm.logits(input_ids)

Inside transformers::

    import moex.transformers
    moex.transformers.register()   # adds moex_eager, moex_batched_mm, moex_grouped_mm
    model = AutoModelForCausalLM.from_pretrained(path, experts_implementation="moex_grouped_mm")

Errors: moex.Error (a RuntimeError) and its subclasses InvalidInput / UnknownName (also
ValueError), Unsupported (also NotImplementedError) and DeviceError; argument types a TypeError.
"""
from ._moex import (  # noqa: F401
    DeviceError,
    Error,
    Experts,
    InvalidInput,
    UnknownName,
    Unsupported,
    backends,
    built_with_cuda,
    env_switches,
    supported_model_types,
)
from ._experts import experts_forward  # noqa: F401
from ._model import CausalLM, from_pretrained  # noqa: F401

__all__ = [
    "CausalLM",
    "DeviceError",
    "Error",
    "Experts",
    "InvalidInput",
    "UnknownName",
    "Unsupported",
    "backends",
    "built_with_cuda",
    "env_switches",
    "experts_forward",
    "from_pretrained",
    "supported_model_types",
]

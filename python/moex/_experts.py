"""The functional experts call with transformers' argument names."""
from . import _arrays
from ._moex import Experts


def experts_forward(
    hidden,
    top_k_index,
    top_k_weights,
    gate_up_proj,
    down_proj,
    *,
    gate_up_proj_bias=None,
    down_proj_bias=None,
    has_gate=True,
    is_transposed=False,
    is_concatenated=True,
    activation="silu",
    swiglu_limit=7.0,
    swiglu_alpha=1.702,
    implementation="grouped_mm",
    out=None,
    stream=None,
):
    """out[t] = sum_j w(t, j) * expert_{top_k_index[t, j]}(hidden[t]) (moex/experts.hpp).

    hidden [T, H] (float32 / bfloat16 / float16); top_k_index [T, k] int64 or int32 (ids >= E
    are expert-parallel sentinels and add nothing; negative ids are an error); top_k_weights
    [T, k] or [T, E], any float dtype; gate_up_proj [E, 2I, H] ([E, I, H] when has_gate=False;
    [E, H, 2I] when is_transposed), down_proj [E, H, I] ([E, I, H] when is_transposed); optional
    biases [E, 2I] and [E, H]. activation: a Hugging Face hidden_act name or "swiglu_oai" (gpt-oss,
    with swiglu_limit / swiglu_alpha). Every array is used in place (no copy): all must be
    contiguous and on one device. Returns `out` ([T, H], hidden's dtype), allocated with hidden's
    library (torch.empty, numpy.empty, ...) when not given. On CUDA the call is enqueued on
    `stream` (default: torch's current stream for torch tensors) and returns without waiting.

    Each call prepares the backend afresh (the CPU grouped_mm packs the weights): build a
    moex.Experts once to call it repeatedly.
    """
    s, from_torch = _arrays.call_stream(hidden, stream)
    experts = Experts(
        _arrays.plain(gate_up_proj),
        _arrays.plain(down_proj),
        _arrays.plain(gate_up_proj_bias),
        _arrays.plain(down_proj_bias),
        has_gate=has_gate,
        is_transposed=is_transposed,
        is_concatenated=is_concatenated,
        activation=activation,
        swiglu_limit=swiglu_limit,
        swiglu_alpha=swiglu_alpha,
        stream=s,
        torch_stream=from_torch,
    )
    if out is None:
        out = _arrays.empty_like(hidden)
    experts.forward(
        implementation,
        _arrays.plain(hidden),
        _arrays.plain(top_k_index),
        _arrays.plain(top_k_weights),
        out,
        stream=s,
        capturing=_arrays.capturing(hidden),
        torch_stream=from_torch,
    )
    return out

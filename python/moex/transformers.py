"""moex's experts backends inside transformers (5.x): `register()` adds `moex_eager`,
`moex_batched_mm`, `moex_grouped_mm` and `moex_auto` to transformers' ExpertsInterface, so that

    moex.transformers.register()
    model = AutoModelForCausalLM.from_pretrained(path, experts_implementation="moex_grouped_mm")

runs every MoE layer's experts in moex, on the model's own weights (no copy) and on torch's
current CUDA stream. The rest of the model stays transformers'.

How it fits transformers (transformers/integrations/moe.py):
- An experts function is called as fn(experts_module, hidden_states [T, H], top_k_index [T, k],
  top_k_weights [T, k]); the module carries the layout flags set by @use_experts_implementation
  (has_gate, has_bias, is_transposed, is_concatenated), its weights (gate_up_proj or up_proj,
  down_proj, and *_bias) and its activation (act_fn from config.hidden_act, or gpt-oss'
  _apply_gate with `limit` and `alpha`). All of it maps onto one moex ExpertsSpec.
- The call goes through the torch custom op `moex::experts_forward` (with a fake implementation),
  so torch.compile traces it as one node instead of breaking the graph.
- transformers' generate switches "grouped_mm" to "batched_mm" for the decode stage on non-CPU
  devices, by name. register() extends that switch to "moex_grouped_mm" -> "moex_batched_mm"
  (same condition, same restore), so the moex names behave as transformers' own. `moex_auto`
  is left as it is: it picks grouped_mm or batched_mm per call size itself, from both backends'
  times measured on the GPU at its first call of a shape (include/moex/experts_auto.hpp), so
  that first call must come before any graph capture (torch.compile's warm-up runs do that).
- Backend preparation (the CPU grouped_mm packs the weights) is cached per weight tensor and
  redone when the weights change (data pointer, shape, strides or in-place version).
"""
import contextlib
import threading
import weakref

from . import _arrays, _moex

BACKENDS = ("eager", "batched_mm", "grouped_mm", "auto")
_lock = threading.Lock()
_registered = False
# id(gate_up weight tensor) -> (weak reference to it, signature, moex Experts). Not a
# WeakKeyDictionary: that compares keys with ==, which torch tensors answer elementwise.
_prepared = {}

# transformers' hidden_act names moex computes (moex::parse_activation).
_ACTIVATIONS = {"silu", "swish", "gelu", "gelu_pytorch_tanh", "gelu_new", "gelu_fast", "relu"}


def layout(module):
    """The moex layout of a transformers experts module: a dict of experts_forward's keyword
    arguments (has_gate, is_transposed, is_concatenated, activation, swiglu_limit, swiglu_alpha).
    Raises moex.Unsupported for an activation or gating moex does not compute."""
    from transformers.integrations.moe import _default_apply_gate

    apply_gate = getattr(type(module), "_apply_gate", _default_apply_gate)
    if apply_gate is not _default_apply_gate:
        # gpt-oss: clamped SwiGLU, (up + 1) * g * sigmoid(alpha g), on interleaved rows.
        if not (hasattr(module, "limit") and hasattr(module, "alpha")):
            raise _moex.Unsupported(
                f"{type(module).__name__} has its own _apply_gate, which moex does not know; "
                "use one of transformers' experts implementations for it")
        activation = "swiglu_oai"
    else:
        activation = getattr(getattr(module, "config", None), "hidden_act", None)
        if activation not in _ACTIVATIONS:
            raise _moex.Unsupported(
                f"{type(module).__name__}: activation {activation!r} is not one moex computes "
                f"({', '.join(sorted(_ACTIVATIONS))})")
    return dict(
        has_gate=bool(getattr(module, "has_gate", True)),
        is_transposed=bool(getattr(module, "is_transposed", False)),
        is_concatenated=bool(getattr(module, "is_concatenated", True)),
        activation=activation,
        swiglu_limit=float(getattr(module, "limit", 7.0)),
        swiglu_alpha=float(getattr(module, "alpha", 1.702)),
    )


def _signature(t):
    if t is None:
        return None
    try:
        version = t._version
    except RuntimeError:  # inference tensors keep no version counter
        version = None
    return (t.data_ptr(), version, tuple(t.shape), tuple(t.stride()), t.dtype, t.device)


def _experts_for(gate_up, down, gate_up_bias, down_bias, flags, stream, torch_stream=False):
    """The cached moex Experts over these weights, rebuilt when they changed. The moex object
    views detached aliases of the weights, so it never keeps the weight objects themselves
    alive and the weak entry dies with them."""
    sig = (flags, _signature(gate_up), _signature(down), _signature(gate_up_bias), _signature(down_bias))
    hit = _prepared.get(id(gate_up))
    if hit is not None and hit[0]() is gate_up and hit[1] == sig:
        return hit[2]
    detach = lambda t: None if t is None else t.detach()  # noqa: E731
    experts = _moex.Experts(detach(gate_up), detach(down), detach(gate_up_bias), detach(down_bias),
                            stream=stream, torch_stream=torch_stream, **flags)
    try:
        ref = weakref.ref(gate_up, lambda _, key=id(gate_up): _prepared.pop(key, None))
    except TypeError:  # not weak-referenceable: no cache
        return experts
    _prepared[id(gate_up)] = (ref, sig, experts)
    return experts


def clear_cache():
    """Drops every cached backend preparation (packed CPU weights)."""
    _prepared.clear()


def _define_op():
    import torch
    from typing import Optional

    def experts_impl(
        hidden: torch.Tensor,
        top_k_index: torch.Tensor,
        top_k_weights: torch.Tensor,
        gate_up_proj: torch.Tensor,
        down_proj: torch.Tensor,
        gate_up_proj_bias: Optional[torch.Tensor],
        down_proj_bias: Optional[torch.Tensor],
        has_gate: bool,
        is_transposed: bool,
        is_concatenated: bool,
        activation: str,
        swiglu_limit: float,
        swiglu_alpha: float,
        implementation: str,
    ) -> torch.Tensor:
        flags = dict(has_gate=has_gate, is_transposed=is_transposed, is_concatenated=is_concatenated,
                     activation=activation, swiglu_limit=swiglu_limit, swiglu_alpha=swiglu_alpha)
        stream, from_torch = _arrays.call_stream(hidden)
        experts = _experts_for(gate_up_proj, down_proj, gate_up_proj_bias, down_proj_bias, flags,
                               stream, from_torch)
        # Torch tensors are read in place through their attributes (no DLPack export, no detach
        # needed); only the layout must be what the kernels read.
        hidden = hidden.contiguous()
        out = torch.empty_like(hidden)
        experts.forward(implementation, hidden, top_k_index.contiguous(), top_k_weights.contiguous(),
                        out, stream=stream, capturing=_arrays.capturing(hidden),
                        torch_stream=from_torch)
        return out

    experts_op = torch.library.custom_op("moex::experts_forward", mutates_args=())(experts_impl)

    @experts_op.register_fake
    def _(hidden, top_k_index, top_k_weights, gate_up_proj, down_proj, gate_up_proj_bias,
          down_proj_bias, has_gate, is_transposed, is_concatenated, activation, swiglu_limit,
          swiglu_alpha, implementation):
        return hidden.new_empty(hidden.shape)

    global _experts_impl
    _experts_impl = experts_impl
    return experts_op


# The op's body, called directly outside torch.compile: the dispatcher's round trip through a
# Python custom op costs tens of microseconds per call, as much as a decode-sized experts call.
_experts_impl = None


def _experts_function(backend):
    import torch

    def forward(self, hidden_states, top_k_index, top_k_weights):
        # The layout is a property of the module's class and config: read once per module.
        flags = self.__dict__.get("_moex_layout")
        if flags is None:
            flags = self.__dict__["_moex_layout"] = layout(self)
        if flags["has_gate"]:
            gate_up, gate_up_bias = self.gate_up_proj, getattr(self, "gate_up_proj_bias", None)
        else:
            gate_up, gate_up_bias = self.up_proj, getattr(self, "up_proj_bias", None)
        has_bias = bool(getattr(self, "has_bias", False))
        # torch.compile traces the custom op (one graph node); eager calls skip the dispatcher.
        op = torch.ops.moex.experts_forward if torch.compiler.is_compiling() else _experts_impl
        return op(
            hidden_states, top_k_index, top_k_weights, gate_up, self.down_proj,
            gate_up_bias if has_bias else None, self.down_proj_bias if has_bias else None,
            flags["has_gate"], flags["is_transposed"], flags["is_concatenated"], flags["activation"],
            flags["swiglu_limit"], flags["swiglu_alpha"], backend)

    forward.__name__ = forward.__qualname__ = f"moex_{backend}_experts_forward"
    return forward


def decode_stage_map(experts_implementation, device_type):
    """transformers' decode-stage switch applied to the moex names: on a non-CPU device every
    "moex_grouped_mm" becomes "moex_batched_mm"; other entries are kept."""
    if device_type == "cpu":
        return dict(experts_implementation)
    return {k: "moex_batched_mm" if v == "moex_grouped_mm" else v for k, v in experts_implementation.items()}


def _patch_decode_switch():
    from transformers.generation.utils import GenerationMixin

    original = GenerationMixin._optimize_model_for_decode
    if getattr(original, "_moex", False):
        return

    @contextlib.contextmanager
    def _optimize_model_for_decode(self):
        before = self.get_experts_implementation()
        during = decode_stage_map(before, self.device.type)
        switch = during != before
        if switch:
            self.set_experts_implementation(during)
        try:
            with original(self):  # transformers' own switch, for its own names
                yield
        finally:
            if switch:
                self.set_experts_implementation(before)

    _optimize_model_for_decode._moex = True
    _optimize_model_for_decode.__wrapped__ = original
    GenerationMixin._optimize_model_for_decode = _optimize_model_for_decode


def register():
    """Registers moex_eager, moex_batched_mm, moex_grouped_mm and moex_auto in transformers'
    experts interface (idempotent). Returns the registered names."""
    global _registered
    from transformers.integrations.moe import ExpertsInterface

    with _lock:
        if not _registered:
            _define_op()
            for backend in BACKENDS:
                ExpertsInterface.register(f"moex_{backend}", _experts_function(backend))
            _patch_decode_switch()
            _registered = True
    return [f"moex_{b}" for b in BACKENDS]

"""The model API with transformers' names: from_pretrained, logits, generate,
get/set_experts_implementation. Token ids are small: they are converted (lists, int32, torch
tensors on any device) to a host int64 array; results come back as numpy arrays, or torch CPU
tensors when the ids were torch tensors."""
import numpy

from . import _arrays, _moex


def _host_ids(x):
    if x is None:
        return None
    if _arrays.is_torch(x):
        return x.detach().to("cpu").contiguous()
    a = numpy.asarray(x)
    if a.dtype.kind == "b":  # attention masks may be bool
        a = a.astype(numpy.int64)
    if a.dtype not in (numpy.int64, numpy.int32):
        a = a.astype(numpy.int64)
    return numpy.ascontiguousarray(a)


def _result(arr, like):
    if like is not None and _arrays.is_torch(like):
        import torch

        return torch.from_numpy(arr)
    return arr


def _name(x):
    """"float32" for torch.float32 and "cuda:0" for torch.device("cuda:0"); strings unchanged."""
    if x is None:
        return None
    s = str(x)
    return s[len("torch."):] if s.startswith("torch.") else s


class CausalLM:
    """A loaded model (moex::CausalLM). Build it with moex.from_pretrained."""

    def __init__(self, lm):
        self._lm = lm

    @property
    def info(self):
        return self._lm.info

    @property
    def last_generation_stats(self):
        return self._lm.last_generation_stats

    def logits(self, input_ids, attention_mask=None):
        """int [B, T] (left-padded with attention_mask) -> float32 [B, T, vocab]."""
        return _result(self._lm.logits(_host_ids(input_ids), _host_ids(attention_mask)), input_ids)

    def generate(self, input_ids, attention_mask=None, *, max_new_tokens=20, do_sample=False,
                 temperature=1.0, top_k=0, top_p=1.0, seed=0, eos_token_id=None,
                 decode_switch="auto", cuda_graph=True):
        """Greedy (default) or sampled continuation: int [B, T] -> int64 [B, T + n], prompts
        included. eos_token_id: an int or a list (None: the checkpoint's generation_config)."""
        if isinstance(eos_token_id, int):
            eos_token_id = [eos_token_id]
        out = self._lm.generate(
            _host_ids(input_ids), _host_ids(attention_mask), max_new_tokens=max_new_tokens,
            do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
            eos_token_id=eos_token_id, decode_switch=decode_switch, cuda_graph=cuda_graph)
        return _result(out, input_ids)

    def get_experts_implementation(self):
        return self._lm.get_experts_implementation()

    def set_experts_implementation(self, experts_implementation):
        self._lm.set_experts_implementation(experts_implementation)


def from_pretrained(path, *, experts_implementation=None, dtype=None, device=None):
    """Loads a Hugging Face checkpoint folder. experts_implementation: a backend name, a JSON
    object or a dict {"": default, "text_config": ...}; dtype "float32" / "bfloat16" (or a torch
    dtype; None: the checkpoint's); device "cpu" / "cuda" / "cuda:1" (or a torch.device)."""
    return CausalLM(_moex.from_pretrained(str(path), experts_implementation=experts_implementation,
                                          dtype=_name(dtype), device=_name(device)))

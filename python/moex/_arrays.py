"""What moex needs to know about the caller's array library, without importing it.

torch is recognised by the type's module, so numpy-only users never import torch.
Streams use DLPack's encoding: 0 or 1 = the legacy default stream, 2 = per-thread default,
anything else a cudaStream_t.
"""
import sys


def is_torch(x):
    return type(x).__module__.split(".")[0] == "torch" and hasattr(x, "detach")


def plain(x):
    """The array moex reads: torch tensors that track gradients are detached (DLPack refuses
    them); nothing is copied."""
    if x is not None and is_torch(x) and x.requires_grad:
        return x.detach()
    return x


def empty_like(x):
    """A new contiguous array of x's shape, dtype and device, from x's own library."""
    if not (hasattr(x, "shape") and hasattr(x, "dtype")):
        raise TypeError("hidden: expected an array (buffer protocol, DLPack, __cuda_array_interface__ "
                        "or __array_interface__), got " + type(x).__name__)
    if is_torch(x):
        import torch

        return torch.empty(x.shape, dtype=x.dtype, device=x.device)
    lib = sys.modules.get(type(x).__module__.split(".")[0])
    if lib is not None and hasattr(lib, "empty"):
        return lib.empty(tuple(x.shape), dtype=x.dtype)
    import numpy

    return numpy.empty(tuple(x.shape), dtype=x.dtype)


def stream_of(x, stream=None):
    """The stream a call on x runs on: the one given, else torch's current stream of x's device,
    else the stream x's __cuda_array_interface__ names, else the legacy default stream."""
    return call_stream(x, stream)[0]


def call_stream(x, stream=None):
    """(stream, from_torch): stream_of's answer, and whether it is torch's current stream of x's
    device (then torch tensors are read without a DLPack export; tensor_import.hpp)."""
    if stream is not None:
        return int(stream), False
    if is_torch(x):
        if x.is_cuda:
            import torch

            raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # ~1 us; the public call ~5
            if raw is not None:
                return int(raw(x.get_device())), True
            return int(torch.cuda.current_stream(x.device).cuda_stream), True
        return 0, True
    cai = getattr(x, "__cuda_array_interface__", None) if hasattr(type(x), "__cuda_array_interface__") else None
    if isinstance(cai, dict) and cai.get("stream") is not None:
        return int(cai["stream"]), False
    return 0, False


def capturing(x):
    """Whether torch is recording a CUDA graph on x's device (moex then refuses to allocate)."""
    if is_torch(x) and x.is_cuda:
        import torch

        probe = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None)
        return bool(probe() if probe is not None else torch.cuda.is_current_stream_capturing())
    return False

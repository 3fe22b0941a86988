"""llamacpp_ref.py — opening a model in llama.cpp (llama-cpp-python) as the reference.

Our machines' CPUs advertise AMX, but the tile instructions trap (SIGILL) under the hypervisor,
and llama.cpp's native build routes quantized matmuls to AMX through its "extra buffer types".
Turning those off (llama_model_params.use_extra_bufts = false, the same as llama.cpp's
--no-extra-bufts) keeps llama.cpp on its ordinary AVX-512 kernels.
"""
import llama_cpp
import llama_cpp.llama_cpp as _api  # the module llama_cpp.Llama takes its defaults from

_default_params = _api.llama_model_default_params


def _params_without_extra_bufts():
    p = _default_params()
    p.use_extra_bufts = False
    return p


def open_llama(path, **kw):
    """llama_cpp.Llama(path, **kw) with extra buffer types (AMX, repacking) disabled."""
    _api.llama_model_default_params = _params_without_extra_bufts
    try:
        return llama_cpp.Llama(model_path=path, verbose=kw.pop("verbose", False), **kw)
    finally:
        _api.llama_model_default_params = _default_params

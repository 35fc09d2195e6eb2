"""`specfleet models quantize SRC DST TYPE`: llama.cpp's own quantiser, through llama-cpp-python.

`llama_model_quantize` with requantisation allowed (a Q4_1 file may become Q8_0, F16 or Q2_K:
a draft of the same model, or a type another engine reads). TYPE is a `LLAMA_FTYPE_MOSTLY_*` name
(Q8_0, Q4_0, Q4_1, F16, Q2_K, Q4_K_M, ...). The file is written beside DST and renamed into place
once whole.
"""

from __future__ import annotations

import os
from pathlib import Path

PREFIX = "LLAMA_FTYPE_MOSTLY_"


def types() -> list[str]:
    """Every type name the installed llama.cpp quantises to."""
    import llama_cpp

    return sorted(n[len(PREFIX) :] for n in dir(llama_cpp) if n.startswith(PREFIX) and n[len(PREFIX) :].isupper())


def quantize(src: Path, dst: Path, kind: str, threads: int = 0) -> Path:
    from agent.engines import llamacpp_lib

    llamacpp_lib.use_project_build()
    import llama_cpp

    name = kind.upper()
    ftype = getattr(llama_cpp, PREFIX + name, None)
    if ftype is None:
        raise ValueError(f"unknown type {kind!r}: one of {', '.join(types())}")
    src, dst = Path(src), Path(dst)
    if not src.is_file():
        raise FileNotFoundError(f"no such GGUF: {src}")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = threads or (os.cpu_count() or 1)
    params.allow_requantize = True
    partial = dst.with_name(dst.name + ".partial")
    code = llama_cpp.llama_model_quantize(str(src).encode(), str(partial).encode(), params)
    if code != 0 or not partial.exists():
        partial.unlink(missing_ok=True)
        raise RuntimeError(f"llama_model_quantize failed ({code}) making {name} of {src}")
    partial.rename(dst)
    return dst

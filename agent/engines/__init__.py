"""Engines by name. Importing this module is cheap: an engine's libraries (mlx, llama.cpp) are
imported only when `make_engine` builds that engine."""

from __future__ import annotations

from importlib import import_module

from specfleet.record import ENGINE_METHODS  # noqa: F401  (what each engine's generate() accepts)

from .base import Engine, EngineError
from .llamacpp_lib import use_project_build

use_project_build()  # before llama_cpp is imported: a CUDA build of this checkout, if there is one

# name -> "module:class", relative to this package; the names are specfleet.record.ENGINES
ENGINES = {
    "mlx": "mlx:MlxEngine",
    "llama.cpp": "llamacpp:LlamaCppEngine",
    "llama-server": "llama_server:LlamaServerEngine",
    "openai": "openai_server:OpenAIServerEngine",
}


def make_engine(name: str, **options) -> Engine:
    """A new, unloaded engine. `options` go to the engine's constructor."""
    if name not in ENGINES:
        raise EngineError(f"unknown engine {name!r}; known engines: {', '.join(ENGINES)}")
    module, cls = ENGINES[name].split(":")
    return getattr(import_module(f".{module}", __name__), cls)(**options)

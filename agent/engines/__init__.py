"""Engines by name. Importing this module is cheap: an engine's libraries (mlx, llama.cpp) are
imported only when `make_engine` builds that engine."""

from __future__ import annotations

from importlib import import_module

from .base import Engine, EngineError

# name -> "module:class", relative to this package
ENGINES = {
    "mlx": "mlx:MlxEngine",
    "llama.cpp": "llamacpp:LlamaCppEngine",
}
# What each engine's generate() accepts. Kept here, not only on the classes, so that the
# coordinator can check a sweep without importing mlx or llama.cpp.
ENGINE_METHODS = {
    "mlx": ("baseline", "draft", "ngram", "mtp", "ref-baseline", "ref-draft"),
    "llama.cpp": ("baseline", "draft", "ngram", "mtp", "ref-baseline", "ref-ngram"),
}


def make_engine(name: str, **options) -> Engine:
    """A new, unloaded engine. `options` go to the engine's constructor."""
    if name not in ENGINES:
        raise EngineError(f"unknown engine {name!r}; known engines: {', '.join(ENGINES)}")
    module, cls = ENGINES[name].split(":")
    return getattr(import_module(f".{module}", __name__), cls)(**options)

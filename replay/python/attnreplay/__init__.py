"""attnreplay: bring your own attention kernel, in Python.

    from attnreplay import Backend, host
    class MyKernel(Backend):
        name = "my-kernel"; device = "cuda"
        def check(self, config): ...          # None, or why not
        def plan(self, step): ...             # once per step (vLLM's FlashAttentionMetadata)
        def forward(self, layer, q, k_new, v_new, kv_cache, out, lse): ...

    attnreplay-py replay TRACE --backend mymodule:MyKernel --db results.db

Replay, data generation, verification and SQLite run in the C library (libattnreplay.so).
"""
from .backend import Backend, Config, Step, host, register


def replay(args):
    """`attnreplay replay` with args (a list, as on its command line) through the C engine; a
    Python backend named by --backend is registered first.  Returns the exit code."""
    from .cli import replay as run
    return run(args)


__all__ = ["Backend", "Config", "Step", "host", "register", "replay"]

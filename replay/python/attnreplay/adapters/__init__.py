"""Adapters: third-party attention kernels as attnreplay backends (imported lazily)."""


def import_built(module, folder):
    """The Python module `module` of a peer kernel, from the path or else from the build in
    $AR_PEERS_BUILT/folder (kernels/peers/build_peers.py's layout); raises ImportError saying both."""
    import importlib
    import os
    import sys
    try:
        return importlib.import_module(module)
    except ImportError as first:
        built = os.environ.get("AR_PEERS_BUILT")
        d = os.path.join(built, folder) if built else None
        if not d:
            raise ImportError("%s is not importable (%s) and AR_PEERS_BUILT, the folder of "
                              "kernels/peers' build, is not set" % (module, first)) from first
        if not os.path.isdir(d):
            raise ImportError("%s is not importable (%s) and %s is not a folder"
                              % (module, first, d)) from first
        sys.path.insert(0, d)
        return importlib.import_module(module)


def hopper_reason(import_peer, name, kernels):
    """Why a peer built for Hopper cannot run here, or None: import_peer() must succeed, torch must
    see a CUDA device of compute capability 9.x.  name and kernels word the messages."""
    try:
        import torch
        import_peer()
    except Exception as e:   # ImportError, or the extension failing to load
        return "%s is not importable here (%s: %s)" % (name, type(e).__name__, e)
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    major, _ = torch.cuda.get_device_capability()
    if major != 9:
        return "%s run on compute capability 9.x, not %d.x" % (kernels, major)
    return None


def half_dtype_reason(config, name):
    """Why an adapter that runs float16 / bfloat16 on a cache of the same dtype, without planted
    faults, cannot run config, or None; name words the messages."""
    if config.dtype not in ("float16", "bfloat16"):
        return "dtype %s: %s runs float16/bfloat16" % (config.dtype, name)
    if config.kv_dtype != config.dtype:
        return "KV cache %s: %s reads a cache in the model dtype only" % (config.kv_dtype, name)
    if config.inject != "none":
        return "planted fault '%s' is not implemented by the %s adapter" % (config.inject, name)
    return None

"""Python classes as attnreplay backends.

A backend is a class with check(config), plan(step) and forward(layer, q, k_new, v_new, kv_cache,
out, lse) (see Backend).  register() wraps an instance as a plugin of attnreplay_plugin.h: ctypes
callbacks fill the plugin descriptor, and libattnreplay registers it exactly as it registers a
plugin .so (the backend is then "py:<name>").  The C engine calls back into Python per step and
per layer; every tensor is a zero-copy view (dlpack.py): numpy arrays for a CPU backend, torch
tensors for a CUDA one, used on the host's CUDA stream.

Errors: check() returning a string refuses the config with that reason (exit 2); an exception
in open() refuses it too (exit 2); an exception in plan() or forward() is a runtime failure
(exit 3).  The host shows the message, so say what went wrong.
"""
import ctypes
import sys
import traceback

from . import _abi, dlpack

DTYPE_NAMES = {(_abi.kDLFloat, 32): "float32", (_abi.kDLFloat, 16): "float16", (_abi.kDLBfloat, 16): "bfloat16",
               (_abi.kDLFloat8_e4m3fn, 8): "float8_e4m3fn"}


class Config:
    """The run configuration (attnreplay_config): plain Python values."""

    def __init__(self, c):
        self.model_name = (c.model_name or b"").decode()
        self.num_q_heads = c.num_q_heads
        self.num_kv_heads = c.num_kv_heads
        self.head_size = c.head_size
        self.scale = c.scale
        self.sliding_window = c.sliding_window
        self.logits_soft_cap = c.logits_soft_cap
        self.block_size = c.block_size
        self.num_blocks = c.num_blocks
        self.num_layers = c.num_layers
        self.dtype = DTYPE_NAMES.get((c.dtype.code, c.dtype.bits), f"code{c.dtype.code}/{c.dtype.bits}")
        self.kv_dtype = DTYPE_NAMES.get((c.kv_dtype.code, c.kv_dtype.bits), f"code{c.kv_dtype.code}/{c.kv_dtype.bits}")
        self.kv_scale = c.kv_scale
        self.cascade = c.cascade
        self.inject = (c.inject or b"none").decode()
        self.repeat = c.repeat
        self.device = "cuda:%d" % c.device.device_id if c.device.device_type == _abi.kDLCUDA else "cpu"
        self.attention = "mla" if c.attention == _abi.ATTENTION_MLA else "mha"
        self.kv_lora_rank = c.kv_lora_rank
        self.qk_rope_head_dim = c.qk_rope_head_dim

    def __repr__(self):
        return "Config(%s)" % ", ".join("%s=%r" % kv for kv in sorted(vars(self).items()))


class Step:
    """One step's metadata, vLLM's FlashAttentionMetadata (attnreplay_metadata): arrays on the
    backend's device (numpy or torch); the *_cpu twins on the host; cascade fields None when
    use_cascade is false."""

    def __init__(self, md, convert, convert_cpu):
        self.step = md.step
        self.num_reqs = md.num_reqs
        self.num_actual_tokens = md.num_actual_tokens
        self.max_query_len = md.max_query_len
        self.max_seq_len = md.max_seq_len
        self.use_cascade = bool(md.use_cascade)
        self.common_prefix_len = md.common_prefix_len
        for name in _abi.METADATA_TENSORS:
            setattr(self, name, convert(getattr(md, name)))
        for name in _abi.CASCADE_TENSORS:
            t = getattr(md, name)
            setattr(self, name, convert(t) if self.use_cascade and t.data else None)
        for name in _abi.CPU_TENSORS:
            setattr(self, name, convert_cpu(getattr(md, name)))


class Backend:
    """Base class of a Python backend.  Subclasses set name (short, no spaces; the backend is
    "py:<name>"), device ("cpu": numpy arrays, or "cuda": torch tensors), writes_kv (forward
    writes k_new/v_new into kv_cache itself) and cascade (plan/forward handle use_cascade), and
    implement forward.  Shapes: q [T, Hq, D], k_new / v_new [T, Hkv, D], kv_cache [2, num_blocks,
    block_size, Hkv, D] (already holding k_new/v_new unless writes_kv), out [T, Hq, D] in the
    run's dtype, lse [Hq, T] float32 natural log; write out and lse in place.  A backend with
    mla = True is also offered MLA models (config.attention "mla"):
    then q [T, Hq, L + R] is the absorbed query, k_new [T, 1, L + R] the new latent entries,
    v_new None, kv_cache [num_blocks, block_size, L + R], values the first L = kv_lora_rank
    elements of each entry, and out [T, Hq, L] the latent output (the host applies W_UV)."""

    name = None
    summary = ""
    capabilities = ""
    device = "cpu"
    writes_kv = False
    cascade = False
    mla = False

    def check(self, config):
        """None when this backend can run config, else the reason (a string)."""
        return None

    def open(self, config):
        """Once per run, after check: allocate workspaces."""

    def plan(self, step):
        """Once per step (the MetadataBuilder): step is a Step."""

    def forward(self, layer, q, k_new, v_new, kv_cache, out, lse):
        raise NotImplementedError

    def close(self):
        """At the end of the run."""


class Host:
    """The host's services while a backend runs (the attnreplay_host_api of the plugin ABI)."""

    def __init__(self):
        self._api = None

    def _bind(self, api):
        self._api = api

    def time_mark(self, name):
        """Ends the timed part of forward that began at its start (or the last mark) and names it,
        e.g. "gather"; the rest of forward is "attn"."""
        if self._api:
            self._api.time_mark(name.encode())

    def log(self, level, message):
        if self._api:
            self._api.log(level, message.encode())

    def cuda_stream(self):
        """The host's cudaStream_t as an int (0 on the CPU)."""
        return (self._api.cuda_stream() or 0) if self._api else 0


host = Host()

_registered = {}   # "py:<name>" -> its bridge, alive for the life of the process like a dlopened plugin


class _Bridge:
    """One backend instance as an attnreplay_plugin."""

    def __init__(self, backend, source):
        self.backend = backend
        self.source = source
        self.cuda = backend.device.startswith("cuda")
        self.api = None
        self.step = None
        self.views = {}          # data pointer, shape, dtype -> array (per step, and the caches)
        self.cache_views = {}
        self.stream_ctx = None
        name = backend.name or type(backend).__name__
        flags = ((_abi.WRITES_KV if backend.writes_kv else 0) | (_abi.CASCADE if backend.cascade else 0)
                 | (_abi.MLA if backend.mla else 0))
        self._strings = [s.encode() for s in (name, backend.summary or name, backend.capabilities or "")]
        self.callbacks = [_abi.CheckFn(self._check), _abi.OpenFn(self._open), _abi.PlanFn(self._plan),
                          _abi.ForwardFn(self._forward), _abi.CloseFn(self._close)]
        self.plugin = _abi.Plugin(_abi.ABI_VERSION, ctypes.sizeof(_abi.Plugin), *self._strings,
                                  _abi.kDLCUDA if self.cuda else _abi.kDLCPU, flags, *self.callbacks)
        self.init = _abi.InitFn(self._init)

    # -- helpers --
    def _error(self, text):
        if self.api:
            self.api.set_error(text.encode(errors="replace")[:1000])
        return 1

    def _exception(self, where):
        # any exception, SystemExit and KeyboardInterrupt included: one escaping a ctypes callback
        # is only printed, and the call fails with no reason given
        # the message names the exception by its type and first line (the last line of a
        # traceback can be a hint, as torch.compile's errors end); the whole traceback goes to
        # stderr, where the run's log keeps it
        e = sys.exc_info()[1]
        first = (str(e).strip().splitlines() or [""])[0]
        sys.stderr.write(traceback.format_exc())
        return self._error("%s raised %s: %s" % (where, type(e).__name__, first))

    def _convert(self, t):
        return dlpack.as_torch(t) if self.cuda else dlpack.as_numpy(t)

    def _convert_cpu(self, t):
        return dlpack.as_torch(t) if self.cuda else dlpack.as_numpy(t)

    def _view(self, t, table):
        key = (t.data, tuple(t.shape[i] for i in range(t.ndim)), t.dtype.code, t.dtype.bits)
        v = table.get(key)
        if v is None:
            v = table[key] = self._convert(t)
        return v

    def _stream(self):
        if not self.cuda:
            return None
        import torch
        if self.stream_ctx is None:
            self.stream_ctx = torch.cuda.ExternalStream(self.api.cuda_stream())
        return torch.cuda.stream(self.stream_ctx)

    # -- the ABI --
    def _init(self, api_ptr, version):
        self.api = api_ptr.contents
        host._bind(self.api)
        if version != _abi.ABI_VERSION:
            self._error("the attnreplay package speaks plugin ABI %d, the library %d" % (_abi.ABI_VERSION, version))
            return None
        return ctypes.addressof(self.plugin)

    def _check(self, cfg_ptr):
        try:
            reason = self.backend.check(Config(cfg_ptr.contents))
        except BaseException:
            return self._exception("check()")
        return self._error(str(reason)) if reason else 0

    def _open(self, cfg_ptr, state_ptr):
        # a new run (another replay in this process): nothing of the last one's buffers or stream
        self.views, self.cache_views, self.stream_ctx, self.step = {}, {}, None, None
        try:
            self.backend.open(Config(cfg_ptr.contents))
        except BaseException:
            return self._exception("open()")
        state_ptr[0] = 1   # non-NULL: the host calls close() for a non-NULL state
        return 0

    def _plan(self, state, md_ptr):
        try:
            self.views = {}
            ctx = self._stream()
            if ctx is None:
                self.step = Step(md_ptr.contents, self._convert, self._convert_cpu)
                self.backend.plan(self.step)
            else:
                with ctx:
                    self.step = Step(md_ptr.contents, self._convert, self._convert_cpu)
                    self.backend.plan(self.step)
        except BaseException:
            return self._exception("plan()")
        return 0

    def _forward(self, state, args_ptr):
        try:
            a = args_ptr.contents
            ctx = self._stream()
            if ctx is None:
                self._call_forward(a)
            else:
                with ctx:
                    self._call_forward(a)
        except BaseException:
            return self._exception("forward()")
        return 0

    def _call_forward(self, a):
        v = self.views
        self.backend.forward(a.layer, self._view(a.q, v), self._view(a.k_new, v), self._view(a.v_new, v),
                             self._view(a.kv_cache, self.cache_views), self._view(a.out, v), self._view(a.lse, v))

    def _close(self, state):
        try:
            self.backend.close()
        except BaseException:
            traceback.print_exc()


def register(backend, source=None):
    """Registers a Backend instance with libattnreplay; returns the backend's name ("py:<name>")
    for --backend.  Raises ValueError with the library's message when it is refused.  Another
    instance of a class registered before takes that registration over (the next run calls it)."""
    cls = type(backend).__name__
    device = getattr(backend, "device", None)
    if not (device == "cpu" or (isinstance(device, str) and device.startswith("cuda"))):
        raise ValueError("%s: device %r: \"cpu\" or \"cuda\"" % (cls, device))
    if backend.name is not None and not isinstance(backend.name, str):
        raise ValueError("%s: name %r: a str (or None: the class's name)" % (cls, backend.name))
    for attr in ("summary", "capabilities"):
        value = getattr(backend, attr)
        if value is not None and not isinstance(value, str):
            raise ValueError("%s: %s %r: a str" % (cls, attr, value))
    full = "py:" + (backend.name or type(backend).__name__)
    b = _registered.get(full)
    if b is not None and type(b.backend) is type(backend):
        # the same class again (replay() called once more in this process): the library keeps
        # the first registration, whose plugin now calls this instance
        b.backend = backend
        return full
    b = _Bridge(backend, source or type(backend).__name__)
    err = ctypes.create_string_buffer(2048)
    ok = _abi.lib().ar_plugin_register_init(b.init, b"py:", (source or b.source).encode(), err, len(err))
    if not ok:
        raise ValueError(err.value.decode(errors="replace"))
    _registered[full] = b
    return full

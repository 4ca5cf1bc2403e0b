"""attnreplay-py: the command line of the Python package.

    attnreplay-py replay TRACE --backend SPEC --db DB [every option of `attnreplay replay`]
    attnreplay-py backends              the Python backends installed (entry points)
    attnreplay-py ratios DB [--base RUN] [--run RUN ...] [--runs-in DB2] [--by-context] [--text]
                                        per-step time ratios against a base run, by step kind

SPEC is module:Class (a Backend subclass), a short name from the entry-point group
"attnreplay.backends" (numpy, torch-fa2, torch-cudnn, flex, flashinfer, fa3, flashmla,
flashinfer-mla), or anything
`attnreplay replay --backend` takes (auto, cpu, cuda, plugin:PATH.so), passed on unchanged.
The replay itself is the C engine's (ar_replay_main): same options, same database, same exit
codes (0 passed, 1 a step failed, 2 bad input or a backend that cannot run, 3 runtime error,
4 nothing verified, 130 SIGINT, 143 SIGTERM).  `backends` and `ratios` exit 3 when their output
cannot be written (stdout full or closed).  `python -m attnreplay ARGS` is `attnreplay-py ARGS`.
"""
import ctypes
import importlib
import os
import sys

from . import _abi

BUILTIN = {
    "numpy": "attnreplay.adapters.numpy_ref:NumpyPaged",
    "torch-fa2": "attnreplay.adapters.torch_sdpa:TorchFlashVarlen",
    "torch-cudnn": "attnreplay.adapters.torch_sdpa:TorchCudnnSDPA",
    "flex": "attnreplay.adapters.flex:FlexPaged",
    "flashinfer": "attnreplay.adapters.flashinfer:FlashInferPaged",
    "fa3": "attnreplay.adapters.fa3:FA3Paged",
    "flashmla": "attnreplay.adapters.flashmla:FlashMLADense",
    "flashinfer-mla": "attnreplay.adapters.flashinfer_mla:FlashInferMLA",
}
C_BACKENDS = ("auto", "cpu", "cpu-mla", "cuda", "cuda-mla")


def _entry_points():
    try:
        from importlib.metadata import entry_points
        eps = entry_points()
        group = eps.select(group="attnreplay.backends") if hasattr(eps, "select") else eps.get("attnreplay.backends", [])
        return {ep.name: ep.value for ep in group}
    except Exception:
        return {}


def resolve(spec):
    """The Backend class SPEC names, or None when SPEC is one of the C engine's own."""
    if spec in C_BACKENDS or spec.startswith("plugin:"):
        return None
    target = _entry_points().get(spec) or BUILTIN.get(spec) or spec
    if ":" not in target:
        raise ValueError("--backend %s: not module:Class, not a C backend (%s, plugin:PATH.so) and not an "
                         "installed Python backend (%s)" % (spec, ", ".join(C_BACKENDS),
                                                            ", ".join(sorted(set(BUILTIN) | set(_entry_points())))))
    module, _, cls = target.partition(":")
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        raise ValueError("--backend %s: cannot import %s: %s" % (spec, module, e)) from e
    except Exception as e:   # the module itself failing: RuntimeError, SyntaxError, a relative name
        raise ValueError("--backend %s: cannot import %s: %s: %s" % (spec, module, type(e).__name__, e)) from e
    try:
        found = getattr(mod, cls)
    except AttributeError:
        raise ValueError("--backend %s: module %s has no %s" % (spec, module, cls)) from None
    from .backend import Backend
    if not (isinstance(found, type) and issubclass(found, Backend)):
        raise ValueError("--backend %s: not a subclass of attnreplay.Backend (%s)" % (spec, type(found).__name__))
    return found


def instantiate(spec, cls):
    """cls() for --backend SPEC; ValueError saying so when the constructor raises."""
    try:
        return cls()
    except Exception as e:
        first = (str(e).strip().splitlines() or [""])[0]
        raise ValueError("--backend %s: %s() raised %s: %s" % (spec, cls.__name__, type(e).__name__, first)) from e


def replay(args):
    """Runs `attnreplay replay` with args (TRACE and options, as on its command line) through the C
    engine, after registering a Python backend named by --backend.  Returns the exit code: the
    engine's, or 2 when the backend or libattnreplay cannot be loaded."""
    try:
        argv = _engine_argv(args)
        if isinstance(argv, int):
            return argv
        engine = _abi.lib().ar_replay_main
    except _abi.LibraryError as e:
        print("attnreplay-py replay: %s; nothing was replayed" % e, file=sys.stderr)
        return 2
    except KeyboardInterrupt:   # the engine answers SIGINT itself once it runs
        print("attnreplay-py replay: interrupted (SIGINT) before the replay began; nothing was stored",
              file=sys.stderr)
        return 130
    c_argv = (ctypes.c_char_p * (len(argv) + 1))(*argv, None)
    sys.stdout.flush()
    sys.stderr.flush()
    return engine(len(argv), c_argv)


def _arg(a):
    """One argument as a str: paths (str, bytes, os.PathLike) as file names, numbers by str()."""
    if isinstance(a, (str, bytes, os.PathLike)):
        return os.fsdecode(a)
    if isinstance(a, (int, float)) and not isinstance(a, bool):
        return str(a)
    raise TypeError("attnreplay replay: argument %r is not a str, a path or a number" % (a,))


def _engine_argv(args):
    """The engine's argv (bytes) for args, with a Python --backend registered and renamed; or 2
    (said on stderr) when that backend cannot be made."""
    if isinstance(args, (str, bytes, os.PathLike)):
        raise TypeError("attnreplay replay: args is a list of arguments (as on the command line), not one string")
    args = [_arg(a) for a in args]
    # the last --backend is the one the engine runs (as on its own command line)
    last, i = None, 0
    while i < len(args):
        if args[i] == "--backend" and i + 1 < len(args):
            last, i = (args[i + 1], i + 1, ""), i + 2
            continue
        if args[i].startswith("--backend="):
            last = (args[i][len("--backend="):], i, "--backend=")
        i += 1
    if last is not None:
        spec, where, prefix = last
        try:
            cls = resolve(spec)
            if cls is not None:
                from .backend import register
                name = register(instantiate(spec, cls), "python %s" % spec)
                args[where] = prefix + name
        except ValueError as e:
            print("attnreplay-py replay: %s" % e, file=sys.stderr)
            return 2
    # file names as the system gave them (bytes on Linux, not necessarily UTF-8)
    return [b"replay"] + [os.fsencode(a) for a in args]


BACKENDS_USAGE = ("usage: attnreplay-py backends\n"
                  "  the Python backends installed (entry points of \"attnreplay.backends\"): device and\n"
                  "  summary, or why one cannot load; `attnreplay backends` lists the C engine's")


def _backends(args):
    if args and args[0] in ("-h", "--help"):
        print(BACKENDS_USAGE)
        return 0
    if args:
        print("attnreplay-py backends: unexpected argument '%s'\n%s" % (args[0], BACKENDS_USAGE), file=sys.stderr)
        return 2
    names = dict(BUILTIN)
    names.update(_entry_points())
    for name, target in sorted(names.items()):
        try:
            cls = resolve(name)
            summary = str(getattr(cls, "summary", "") or cls.__doc__ or "")
            print(("%-12s %-6s %s" % (name, getattr(cls, "device", "?"), (summary.strip().splitlines() or [""])[0]))
                  .rstrip())
        except ValueError as e:
            print("%-12s        unavailable: %s" % (name, e))
    return 0


USAGE = __doc__


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    cmd = argv[0] if argv else ""
    try:
        code = _main(argv)
        sys.stdout.flush()
        return code
    except KeyboardInterrupt:
        print("attnreplay-py %s: interrupted (SIGINT)" % cmd, file=sys.stderr)
        return 130
    except OSError as e:   # stdout full, closed or gone (the table, the list, the usage)
        try:   # what is still buffered goes nowhere, so that the exit's flush does not fail again
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        print("attnreplay-py %s: cannot write the output (%s)" % (cmd, e.strerror or e), file=sys.stderr)
        return 3


def _main(argv):
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE, file=sys.stdout if argv else sys.stderr)   # asked for, or a usage error
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "replay":
        return replay(rest)
    if cmd == "backends":
        return _backends(rest)
    if cmd == "ratios":
        from .ratios import main as ratios_main
        return ratios_main(rest)
    print("attnreplay-py: unknown command '%s'\n%s" % (cmd, USAGE), file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())

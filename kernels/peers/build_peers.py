#!/usr/bin/env python3
"""build_peers.py - builds the third-party attention kernels that kernels/peers/ times beside
ours, offline, on the GPU machine: FlashAttention 3 (hopper/, as the flash_attn_3._C torch
extension) and FlashMLA's sm90 dense decode (as flash_mla.cuda).

Nothing here touches the network or git.  The upstream setup.py files are not run: FA3's calls
`git submodule update`, reads ../README.md and, on CUDA < 13, downloads an nvcc/ptxas toolchain;
FlashMLA's calls git and builds every kernel family (sm100 included).  Instead this script writes
one ninja file per peer with the sources and flags those setup.py files would use, trimmed to the
instantiations the benchmarks need, and runs it with N parallel jobs:

  fa3       bf16 forward, head sizes 128 and 256, paged KV (page size 16 goes through the
            non-TMA paged kernels), varlen, split-KV (+ its combine kernel), causal, PackGQA;
            e4m3 only for head size 128 paged-KV decode (the fp8 KV peer), the other e4m3
            entry points come from kernels/peers/fa3_unbuilt_stubs.cu.  Disabled: backward,
            fp16, softcap, local/sliding window, append-KV, clusters, sm80, head sizes 64 / 96 /
            192 and the MLA head-size pairs.  The API file is hopper/flash_api_stable.cpp (what
            setup.py picks for torch >= 2.9); if it does not compile, hopper/flash_api.cpp.  If
            an e4m3 kernel does not compile, the extension is linked without fp8.
  flashmla  csrc/sm90/decode/dense (bf16), the decode scheduler-metadata and combine kernels and
            kernels/peers/flashmla_dense_binding.cpp (FLASH_MLA_DISABLE_FP16).

Sources come from the tarballs staged in --src (default .peers/src; see kernels/peers/README.md):
fa3-hopper-*.tar.gz, cutlass-7127592.tar.gz (FA3's CUTLASS), flashmla-*.tar.gz,
cutlass-147f567.tar.gz (FlashMLA's CUTLASS).  Results go to --dest (default .peers/built):

  fa3/flash_attn_3/_C.so, fa3/flash_attn_interface.py, fa3/flash_attn_config.py, fa3/BUILD.txt
  flashmla/flash_mla/{__init__.py, flash_mla_interface.py, cuda.so}, flashmla/BUILD.txt

so that PYTHONPATH=.peers/built/fa3:.peers/built/flashmla makes `import flash_attn_interface` and
`import flash_mla` work.  After the build each module is imported in a fresh interpreter (this
catches a missing symbol).  The last line per peer is
  BUILD peer=<fa3|flashmla> status=<ok|failed> seconds=<wall> so_bytes=<size> variant=<...>

Usage: python3 kernels/peers/build_peers.py [fa3] [flashmla] [--jobs N] [--deadline S]
       [--src DIR] [--work DIR] [--dest DIR] [--torch-root DIR --only-light]
--deadline stops the compile phase after S seconds (the objects finished so far stay in --work).
--torch-root (a torch/ folder with include/ and lib/) and --only-light are for checking the
script on a machine without torch or a GPU: they compile the host-side files only."""
import argparse
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import sysconfig
import tarfile
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))

FA3_FEATURES = ["BACKWARD", "APPENDKV", "LOCAL", "SOFTCAP", "FP16", "CLUSTER", "HDIM64", "HDIM96", "HDIM192",
                "SM8x", "HDIMDIFF64", "HDIMDIFF192"]
# FA3's flash_attn_config.py keys (hopper/setup.py create_build_config_file) and their values here
FA3_CONFIG_KEYS = ["BACKWARD", "SPLIT", "PAGEDKV", "APPENDKV", "LOCAL", "SOFTCAP", "PACKGQA", "FP16", "FP8",
                   "VARLEN", "CLUSTER", "HDIM64", "HDIM96", "HDIM128", "HDIM192", "HDIM256", "SM8x"]
# forward instantiations compiled: (head size, dtype, suffix) -> hopper/instantiations/flash_fwd_hdim{h}_{dt}{sfx}_sm90.cu
FA3_BF16_SUFFIXES = ["", "_packgqa", "_paged", "_split", "_paged_split"]
FA3_E4M3_SUFFIXES = ["_paged", "_paged_split"]
FA3_NVCC = ["-O3", "-std=c++17", "--ftemplate-backtrace-limit=0", "--use_fast_math", "--resource-usage",
            "-DCUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED", "-DCUTLASS_ENABLE_GDC_FOR_SM90",
            "-DCUTLASS_DEBUG_TRACE_LEVEL=0", "-DNDEBUG"]
MLA_NVCC = ["-O3", "-std=c++20", "-DNDEBUG", "-D_USE_MATH_DEFINES", "-Wno-deprecated-declarations",
            "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__", "-U__CUDA_NO_HALF2_OPERATORS__",
            "-U__CUDA_NO_BFLOAT16_CONVERSIONS__", "--expt-relaxed-constexpr", "--expt-extended-lambda",
            "--use_fast_math", "--ptxas-options=-v,--register-usage-level=10,--warn-on-spills,"
            "--warn-on-local-memory-usage", "-DFLASH_MLA_DISABLE_FP16"]
SM90A = ["-gencode", "arch=compute_90a,code=sm_90a"]


def log(msg):
    print(f"[build_peers {time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Toolchain:
    """Compiler paths and the flags torch.utils.cpp_extension would add, read from the installed
    torch (or from --torch-root's headers when checking without torch)."""

    def __init__(self, torch_root):
        self.cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
        if torch_root:
            self.torch_version = "unknown (--torch-root)"
            self.include = [os.path.join(torch_root, "include"),
                            os.path.join(torch_root, "include", "torch", "csrc", "api", "include")]
            self.libdirs = [os.path.join(torch_root, "lib")]
            self.cxx11_abi = 1
            self.pybind_flags = []
            self.common_nvcc = ["-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
                                "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__",
                                "--expt-relaxed-constexpr"]
            self.stable_api = True
        else:
            import torch
            from torch.utils import cpp_extension as ce
            self.torch_version = torch.__version__
            self.cuda_home = self.cuda_home or ce.CUDA_HOME
            self.include = ce.include_paths(device_type="cuda")
            self.libdirs = ce.library_paths(device_type="cuda")
            self.cxx11_abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
            with warnings.catch_warnings():   # deprecated in torch 2.10+ (where it returns [])
                warnings.simplefilter("ignore")
                self.pybind_flags = (ce._get_pybind11_abi_build_flags()
                                     if hasattr(ce, "_get_pybind11_abi_build_flags") else [])
            self.common_nvcc = list(ce.COMMON_NVCC_FLAGS)
            # hopper/setup.py: flash_api_stable.cpp for torch >= 2.9.0.dev20250830
            from packaging.version import parse
            self.stable_api = parse(torch.__version__) >= parse("2.9.0.dev20250830")
        if not self.cuda_home:
            nvcc = shutil.which("nvcc")
            self.cuda_home = os.path.dirname(os.path.dirname(os.path.realpath(nvcc))) if nvcc else "/usr/local/cuda"
        self.nvcc = os.path.join(self.cuda_home, "bin", "nvcc")
        self.cxx = os.environ.get("CXX", "c++")
        self.py_include = sysconfig.get_paths()["include"]
        # CUDA 13 moved CCCL (cub, thrust, libcu++) under include/cccl; hopper/setup.py adds it to
        # CPLUS_INCLUDE_PATH for every compiler; named explicitly here
        cccl = os.path.join(self.cuda_home, "include", "cccl")
        self.cccl = [cccl] if os.path.isdir(cccl) else []
        self.cuda_include = [os.path.join(self.cuda_home, "include")]

    def nvcc_version(self):
        try:
            out = subprocess.run([self.nvcc, "--version"], capture_output=True, text=True, timeout=30).stdout
            m = re.search(r"release ([0-9.]+)", out)
            return m.group(1) if m else "?"
        except Exception as e:  # noqa: BLE001 - reported, not fatal
            return f"? ({e})"

    def ext_defines(self, name):
        return ["-DTORCH_API_INCLUDE_EXTENSION_H", f"-DTORCH_EXTENSION_NAME={name}",
                f"-D_GLIBCXX_USE_CXX11_ABI={self.cxx11_abi}"] + self.pybind_flags

    def includes(self, own):
        dirs = own + self.include + self.cuda_include + [self.py_include]
        return [f"-I{d}" for d in dirs] + [a for d in self.cccl for a in ("-isystem", d)]

    def ldflags(self, python_module):
        libs = ["-lc10", "-lc10_cuda", "-ltorch_cpu", "-ltorch_cuda", "-ltorch"]
        if python_module:
            libs.append("-ltorch_python")
        cuda_lib = os.path.join(self.cuda_home, "lib64")
        return [f"-L{d}" for d in self.libdirs] + libs + [f"-L{cuda_lib}", "-lcudart"]


def extract(src_dir, pattern, work):
    """Unpacks the one tarball in src_dir whose name starts with pattern; returns its top folder."""
    names = sorted(n for n in os.listdir(src_dir) if n.startswith(pattern) and n.endswith((".tar.gz", ".tar.xz")))
    if not names:
        raise SystemExit(f"build_peers.py: {src_dir}: no {pattern}*.tar.gz (stage the peer sources first, "
                         f"see kernels/peers/README.md)")
    path = os.path.join(src_dir, names[-1])
    with tarfile.open(path) as t:
        top = t.getnames()[0].split("/")[0]
        dest = os.path.join(work, top)
        if not os.path.isdir(dest):
            t.extractall(work, filter="data") if hasattr(tarfile, "data_filter") else t.extractall(work)
    return dest


class Ninja:
    """A ninja file of compile and link steps, each with its own flags."""

    def __init__(self, path, tc):
        self.path, self.lines = path, ["ninja_required_version = 1.3",
                                       f"nvcc = {tc.nvcc}", f"cxx = {tc.cxx}",
                                       "rule nvcc", "  command = $nvcc $flags -c $in -o $out",
                                       "  description = nvcc $in",
                                       "rule cxx", "  command = $cxx $flags -c $in -o $out",
                                       "  description = c++ $in",
                                       "rule link", "  command = $cxx -shared $in $flags -o $out",
                                       "  description = link $out"]
        self.objects = []

    @staticmethod
    def esc(s):
        return s.replace("$", "$$").replace(" ", "$ ").replace(":", "$:")

    def build(self, out, rule, inputs, flags):
        self.lines.append(f"build {self.esc(out)}: {rule} {' '.join(self.esc(i) for i in inputs)}")
        self.lines.append(f"  flags = {' '.join(shlex.quote(f).replace('$', '$$') for f in flags)}")
        if rule != "link":
            self.objects.append(out)
        return out

    def write(self):
        with open(self.path, "w") as f:
            f.write("\n".join(self.lines) + "\n")


def run_ninja(ninja_file, targets, jobs, deadline):
    """ninja -k 0 (every target that can be built is built); returns True if all succeeded.
    ninja and its compilers run in their own process group, whose id is in ninja.pgid beside the
    ninja file while they run, so that the group can be ended whole: here at the deadline, by
    build_peers.sh if this process is killed first."""
    cmd = ["ninja", "-f", ninja_file, "-j", str(jobs), "-k", "0"] + targets
    log("run: " + " ".join(cmd[:6]) + f" ... ({len(targets)} targets)")
    pgid_file = os.path.join(os.path.dirname(ninja_file), "ninja.pgid")
    p = subprocess.Popen(cmd, process_group=0)
    with open(pgid_file, "w") as f:
        f.write(f"{p.pid}\n")
    try:
        return p.wait(timeout=deadline) == 0
    except subprocess.TimeoutExpired:
        log(f"compile deadline ({deadline} s) reached: stopping ninja")
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        return False
    finally:
        os.remove(pgid_file)


def ninja_times(build_dir):
    """Per-object compile seconds from .ninja_log (slowest first)."""
    path = os.path.join(build_dir, ".ninja_log")
    rows = []
    if os.path.exists(path):
        for line in open(path):
            parts = line.rstrip("\n").split("\t")
            if len(parts) >= 4 and parts[0].isdigit():
                rows.append(((int(parts[1]) - int(parts[0])) / 1000.0, os.path.basename(parts[3])))
    return sorted(rows, reverse=True)


def import_check(pythonpath, code):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([pythonpath] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    out = (r.stdout + r.stderr).strip()
    return r.returncode == 0, out


def install_peer(dest, so_path, so_rel, copies, build_txt, import_code, extra=None):
    """Fills dest afresh: the stripped extension at dest/so_rel, the upstream Python files
    (copies: source -> path under dest), generated files (extra: path -> text) and BUILD.txt;
    then imports it in a fresh interpreter.  Returns (imported, extension bytes)."""
    shutil.rmtree(dest, ignore_errors=True)
    target = os.path.join(dest, so_rel)
    os.makedirs(os.path.dirname(target))
    shutil.copy(so_path, target)
    subprocess.run(["strip", "--strip-unneeded", target], check=False)
    for src, rel in copies.items():
        shutil.copy(src, os.path.join(dest, rel))
    for rel, text in dict(extra or {}, **{"BUILD.txt": build_txt}).items():
        with open(os.path.join(dest, rel), "w") as f:
            f.write(text)
    ok, out = import_check(dest, import_code)
    log("import check: " + (out.splitlines()[-1] if out else "no output"))
    if not ok:
        log("import failed:\n" + out[-3000:])
    return ok, os.path.getsize(target)


def fa3_config_py(enabled_fp8):
    flags = {f"FLASHATTENTION_DISABLE_{k}": (k in FA3_FEATURES or (k == "FP8" and not enabled_fp8))
             for k in FA3_CONFIG_KEYS}
    flags["FLASHATTENTION_ENABLE_VCOLMAJOR"] = False
    flags["FLASH_ATTENTION_DISABLE_HDIMDIFF64"] = True
    flags["FLASH_ATTENTION_DISABLE_HDIMDIFF192"] = True
    return ("# written by attnreplay's kernels/peers/build_peers.py: the feature flags of this FA3 build\n"
            f"CONFIG = {{'build_flags': {flags!r}}}\n")


def unpack(args, peer, source, cutlass):
    """The peer's compile folder and its unpacked source and CUTLASS trees."""
    work = os.path.join(args.work, peer)
    os.makedirs(work, exist_ok=True)
    return work, extract(args.src, source, args.work), extract(args.src, cutlass, args.work)


def build_fa3(args, tc):
    t0 = time.time()
    work, fa, cutlass = unpack(args, "fa3", "fa3-hopper", "cutlass-7127592")
    hopper = os.path.join(fa, "hopper")
    feat = [f"-DFLASHATTENTION_DISABLE_{k}" for k in FA3_FEATURES]
    inc = tc.includes([hopper, os.path.join(cutlass, "include")])
    nvcc_flags = FA3_NVCC + SM90A + tc.common_nvcc + ["-Xcompiler", "-fPIC"] + tc.ext_defines("_C") + inc
    n = Ninja(os.path.join(work, "build.ninja"), tc)

    def inst(hdim, dt, sfx):
        src = os.path.join(hopper, "instantiations", f"flash_fwd_hdim{hdim}_{dt}{sfx}_sm90.cu")
        return n.build(os.path.join(work, f"fwd_hdim{hdim}_{dt}{sfx}.o"), "nvcc", [src], nvcc_flags + feat)

    # heaviest first: ninja starts them in this order
    bf16 = [inst(h, "bf16", s) for h in (256, 128) for s in FA3_BF16_SUFFIXES]
    e4m3 = [inst(128, "e4m3", s) for s in FA3_E4M3_SUFFIXES]
    stubs = n.build(os.path.join(work, "fa3_unbuilt_stubs.o"), "nvcc",
                    [os.path.join(HERE, "fa3_unbuilt_stubs.cu")], nvcc_flags + feat)
    common = [n.build(os.path.join(work, "flash_fwd_combine.o"), "nvcc", [os.path.join(hopper, "flash_fwd_combine.cu")],
                      nvcc_flags + feat),
              n.build(os.path.join(work, "flash_prepare_scheduler.o"), "nvcc",
                      [os.path.join(hopper, "flash_prepare_scheduler.cu")], nvcc_flags + feat)]
    cxx_base = ["-O3", "-std=c++17", "-fPIC", "-Wno-deprecated-declarations", "-DPy_LIMITED_API=0x03090000"] + tc.ext_defines("_C") + inc

    def api(stable, fp8):
        src = "flash_api_stable.cpp" if stable else "flash_api.cpp"
        extra = (["-DTORCH_TARGET_VERSION=0x0209000000000000"] if stable else []) + ([] if fp8 else ["-DFLASHATTENTION_DISABLE_FP8"])
        name = f"api_{'stable' if stable else 'legacy'}_{'fp8' if fp8 else 'nofp8'}.o"
        return n.build(os.path.join(work, name), "cxx", [os.path.join(hopper, src)], cxx_base + feat + extra)

    apis = {(s, f): api(s, f) for s in (True, False) for f in (True, False)}
    objs, so = {}, {}
    for (s, f), a in apis.items():
        objs[(s, f)] = [a] + bf16 + common + ((e4m3 + [stubs]) if f else [])
        so[(s, f)] = n.build(os.path.join(work, f"_C_{'stable' if s else 'legacy'}_{'fp8' if f else 'nofp8'}.so"),
                             "link", objs[(s, f)], tc.ldflags(python_module=not s))
    n.write()

    # compile: every kernel and the API file setup.py would pick (with and without fp8); the other
    # API file only if that one fails.  Then link the first variant whose objects all exist.
    first = [apis[(tc.stable_api, True)], apis[(tc.stable_api, False)]]
    kernels = [stubs] if args.only_light else bf16 + e4m3 + [stubs] + common
    run_ninja(n.path, kernels + first, args.jobs, args.deadline)
    attempted = set(first)
    chosen = None
    for key in [(tc.stable_api, True), (tc.stable_api, False), (not tc.stable_api, True), (not tc.stable_api, False)]:
        if args.only_light:
            break
        if not os.path.exists(apis[key]) and apis[key] not in attempted:
            attempted.add(apis[key])
            log(f"building the fallback API object {os.path.basename(apis[key])}")
            run_ninja(n.path, [apis[key]], args.jobs, 600)
        missing = [os.path.basename(o) for o in objs[key] if not os.path.exists(o)]
        if missing:
            log(f"variant {os.path.basename(so[key])}: not linked, objects missing: {' '.join(missing)}")
            continue
        if run_ninja(n.path, [so[key]], 1, 300):
            chosen = key
            break
    for secs, name in ninja_times(work)[:20]:
        log(f"  {secs:7.1f} s  {name}")
    status, so_bytes, variant = "failed", 0, "-"
    if chosen:
        variant = f"api={'stable' if chosen[0] else 'legacy'} fp8={'hd128_paged' if chosen[1] else 'off'}"
        dest = os.path.join(args.dest, "fa3")
        ok, so_bytes = install_peer(
            dest, so[chosen], os.path.join("flash_attn_3", "_C.so"),
            {os.path.join(hopper, "flash_attn_interface.py"): "flash_attn_interface.py"},
            f"FlashAttention 3 (hopper/) from {os.path.basename(fa)}, CUTLASS {os.path.basename(cutlass)}\n"
            f"torch {tc.torch_version}, nvcc {tc.nvcc_version()}, {variant}\n"
            f"nvcc flags: {' '.join(FA3_NVCC + SM90A + tc.common_nvcc + feat)}\n",
            "import torch, flash_attn_interface as f; print('import ok', torch.ops.flash_attn_3.fwd, "
            "f.flash_attn_with_kvcache)",
            extra={"flash_attn_config.py": fa3_config_py(chosen[1])})
        status = "ok" if ok else "failed"
    print(f"BUILD peer=fa3 status={status} seconds={time.time() - t0:.0f} so_bytes={so_bytes} variant=\"{variant}\"",
          flush=True)
    return status == "ok"


def build_flashmla(args, tc):
    t0 = time.time()
    work, ml, cutlass = unpack(args, "flashmla", "flashmla", "cutlass-147f567")
    csrc = os.path.join(ml, "csrc")
    inc = tc.includes([csrc, os.path.join(csrc, "kerutils", "include"), os.path.join(csrc, "sm90"),
                       os.path.join(cutlass, "include"), os.path.join(cutlass, "tools", "util", "include")])
    nvcc_flags = tc.common_nvcc + MLA_NVCC + SM90A + ["-Xcompiler", "-fPIC"] + tc.ext_defines("cuda") + inc
    n = Ninja(os.path.join(work, "build.ninja"), tc)
    kernel = n.build(os.path.join(work, "dense_bf16.o"), "nvcc",
                     [os.path.join(csrc, "sm90", "decode", "dense", "instantiations", "bf16.cu")], nvcc_flags)
    others = [n.build(os.path.join(work, "get_decoding_sched_meta.o"), "nvcc",
                      [os.path.join(csrc, "smxx", "decode", "get_decoding_sched_meta", "get_decoding_sched_meta.cu")],
                      nvcc_flags),
              n.build(os.path.join(work, "combine.o"), "nvcc",
                      [os.path.join(csrc, "smxx", "decode", "combine", "combine.cu")], nvcc_flags)]
    binding = n.build(os.path.join(work, "binding.o"), "cxx", [os.path.join(HERE, "flashmla_dense_binding.cpp")],
                      ["-O3", "-std=c++20", "-fPIC", "-DNDEBUG", "-Wno-deprecated-declarations",
                       "-DFLASH_MLA_DISABLE_FP16"] + tc.ext_defines("cuda") + inc)
    so = n.build(os.path.join(work, "cuda.so"), "link", [kernel] + others + [binding], tc.ldflags(python_module=True))
    n.write()
    targets = [binding] if args.only_light else [so]
    run_ninja(n.path, targets, args.jobs, args.deadline)
    for secs, name in ninja_times(work):
        log(f"  {secs:7.1f} s  {name}")
    status, so_bytes = "failed", 0
    if os.path.exists(so) and not args.only_light:
        ok, so_bytes = install_peer(
            os.path.join(args.dest, "flashmla"), so, os.path.join("flash_mla", "cuda.so"),
            {os.path.join(ml, "flash_mla", f): os.path.join("flash_mla", f) for f in ("__init__.py", "flash_mla_interface.py")},
            f"FlashMLA sm90 dense decode (bf16) from {os.path.basename(ml)}, CUTLASS {os.path.basename(cutlass)}\n"
            f"torch {tc.torch_version}, nvcc {tc.nvcc_version()}\n"
            f"nvcc flags: {' '.join(tc.common_nvcc + MLA_NVCC + SM90A)}\n",
            "import torch, flash_mla; import flash_mla.cuda as c; "
            "print('import ok', [n for n in dir(c) if not n.startswith('_')])")
        status = "ok" if ok else "failed"
    print(f"BUILD peer=flashmla status={status} seconds={time.time() - t0:.0f} so_bytes={so_bytes} variant=\"dense_bf16\"",
          flush=True)
    return status == "ok"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    # no `choices` with nargs="*": argparse checks a list default against them as one value
    ap.add_argument("peers", nargs="*", help="fa3 and/or flashmla (default: both)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 4)
    ap.add_argument("--deadline", type=float, default=540.0, help="seconds for the compile phase")
    ap.add_argument("--src", default=".peers/src")
    ap.add_argument("--work", default="/tmp/ar_peers_build")
    ap.add_argument("--dest", default=".peers/built")
    ap.add_argument("--torch-root", default=None)
    ap.add_argument("--only-light", action="store_true")
    args = ap.parse_args()
    args.peers = args.peers or ["fa3", "flashmla"]
    if any(p not in ("fa3", "flashmla") for p in args.peers):
        ap.error("peers are fa3 and flashmla")
    if not shutil.which("ninja"):
        print("build_peers.py: ninja is not on PATH", file=sys.stderr)
        return 2
    os.makedirs(args.work, exist_ok=True)
    tc = Toolchain(args.torch_root)
    log(f"torch {tc.torch_version}, nvcc {tc.nvcc_version()} at {tc.nvcc}, {args.jobs} jobs, "
        f"python include {tc.py_include}, cccl {tc.cccl or 'not separate'}")
    ok = True
    for p in args.peers:
        ok &= (build_fa3 if p == "fa3" else build_flashmla)(args, tc)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

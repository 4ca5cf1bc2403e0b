#!/usr/bin/env python3
"""mutate.py - mutation testing of the verifier (`make mutate-cpu`, `make mutate-gpu-build`).

Reads tests/mutations.txt: one-token source mutations, each with the replays that should kill
it.  For each mutation of the kind asked for, in a scratch copy of the source tree (the
checkout itself is never written), it applies the change, recompiles every translation unit
that includes the mutated file (from the build's .d files) with the build's own flags, and
links a mutant bin/attnreplay from those objects and the build's pristine library (the linker
takes the mutant's objects first, so the library's originals are never pulled in).  Then:
  cpu   runs the mutant on its kill replays and prints the outcome of each mutation and the
        mutation score; first the pristine binary must pass every kill replay (else a "kill"
        would mean nothing).  Exit 1 when a mutant survives or a kill replay is broken.
  gpu   only builds: the mutants, a manifest (mutants.tsv) and tests/run_mutants.sh go into one
        archive, tar | xz --lzma2=preset=1,dict=256MiB (the mutants are nearly the same bytes, so
        the large dictionary packs each to a small fraction of its size); tests/run_mutants.sh
        runs them on the GPU machine in one go.

A mutant is killed when a kill replay exits 1 (a step failed verification), 3 (a runtime
error: the watchdog, a CUDA fault), or dies on a signal or the time limit; exit 0 means it
survived that replay.  Exit 2 or 4 from a kill replay is an error in the mutation's list entry.
A cpu mutation's kill may also be "test:NAME", a cmocka test of tests/NAME.c (for host code no
sample replay reaches on the CPU, such as the GPU backends' planners): the test is linked
against the mutant's objects and kills it by failing; the pristine build/tests/NAME must pass.

Usage: mutate.py check [SRC [LIST]]       (every entry still applies to the source)
       mutate.py cpu|gpu --src DIR --build DIR --out DIR --main OBJ --lib LIB
                 --cc CMD --cflags FLAGS --link CMD --libs LIBS [--nvcc CMD] [--only ID,...]
                 [--test-objs OBJS --test-cflags FLAGS] [--timeout S]
"""
import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_mutations(path):
    """The entries of mutations.txt: blocks of 'key: value' lines, blank-line separated."""
    entries, cur, line_no = [], None, 0
    with open(path, encoding="utf-8") as f:
        for raw in f:
            line_no += 1
            line = raw.rstrip("\n")
            if line.startswith("#"):
                continue
            if not line.strip():
                if cur:
                    entries.append(cur)
                cur = None
                continue
            m = re.match(r"^([a-z]+): ?(.*)$", line)
            if not m:
                sys.exit(f"{path}:{line_no}: expected 'key: value' (keys: id kind file find replace path what "
                         f"kill only)")
            key, value = m.group(1), m.group(2)
            if cur is None:
                cur = {"line": line_no, "kill": [], "only": []}
            if key in ("kill", "only"):
                cur[key].append(value)
            elif key in ("id", "kind", "file", "find", "replace", "path", "what", "expect"):
                if key in cur:
                    sys.exit(f"{path}:{line_no}: '{key}' given twice in one entry")
                if key in ("find", "replace"):   # \n is a line break, \\ a backslash
                    value = value.replace("\\\\", "\0").replace("\\n", "\n").replace("\0", "\\")
                cur[key] = value
            else:
                sys.exit(f"{path}:{line_no}: unknown key '{key}' (keys: id kind file find replace only path what "
                         f"expect kill)")
    if cur:
        entries.append(cur)
    seen = set()
    for e in entries:
        for key in ("id", "kind", "file", "find", "replace", "what"):
            if key not in e:
                sys.exit(f"{path}:{e['line']}: entry without '{key}'")
        if e["kind"] not in ("cpu", "gpu"):
            sys.exit(f"{path}:{e['line']}: kind must be cpu or gpu")
        if not e["kill"]:
            sys.exit(f"{path}:{e['line']}: {e['id']}: no kill replay")
        if e["id"] in seen:
            sys.exit(f"{path}:{e['line']}: id {e['id']} used twice")
        if e.get("expect", "exit3") != "exit3":
            sys.exit(f"{path}:{e['line']}: {e['id']}: expect takes exit3 (the run must end with a run error)")
        if e["find"] == e["replace"]:
            sys.exit(f"{path}:{e['line']}: {e['id']}: find and replace are the same")
        if any(k.startswith("test:") for k in e["kill"]) and (e["kind"] != "cpu" or e.get("expect")):
            sys.exit(f"{path}:{e['line']}: {e['id']}: test: kills are for cpu mutations without expect")
        seen.add(e["id"])
    return entries


def tracked_files(src):
    out = subprocess.run(["git", "-C", src, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         check=True, capture_output=True).stdout
    return [p for p in out.decode().split("\0") if p]


def make_scratch(src, dest):
    if os.path.exists(dest):
        shutil.rmtree(dest)
    for rel in tracked_files(src):
        a = os.path.join(src, rel)
        if not os.path.isfile(a) or rel.startswith("traces/samples/") or rel.endswith(".db"):
            continue
        b = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(b), exist_ok=True)
        shutil.copy2(a, b)


def dependents(build, main_obj, rel):
    """(object, source) of every library or main translation unit whose .d file names rel."""
    found = []
    rel = os.path.normpath(rel)
    for root, _dirs, files in os.walk(build):
        # not the objects of other binaries: tests, the .so's pic copies, the lab, the fuzzers, the
        # mutants themselves, and sanitize/ (gpu_mla_handover's mla_decode.o, built with other flags)
        if os.path.relpath(root, build).split(os.sep)[0] in ("tests", "pic", "lab", "fuzz", "mutants", "sanitize"):
            continue
        for name in files:
            if not name.endswith(".d"):
                continue
            text = open(os.path.join(root, name), encoding="utf-8", errors="replace").read()
            first = text.split("\n\n")[0].replace("\\\n", " ")
            if ":" not in first:
                continue
            target, deps = first.split(":", 1)
            deps = [os.path.normpath(d) for d in deps.split()]
            if rel not in deps:
                continue
            obj = target.strip()
            if os.path.basename(obj) == "main.o" and os.path.normpath(obj) != os.path.normpath(main_obj):
                continue
            found.append((obj, deps[0]))
    return sorted(set(found))


def apply(scratch, e):
    path = os.path.join(scratch, e["file"])
    text = open(path, encoding="utf-8").read()
    n = text.count(e["find"])
    if n != 1:
        raise RuntimeError(f"{e['id']}: '{e['find']}' occurs {n} times in {e['file']} (must be once)")
    lineno = text[: text.index(e["find"])].count("\n") + 1
    with open(path, "w", encoding="utf-8") as f:
        f.write(text.replace(e["find"], e["replace"]))
    return lineno


def restore(src, scratch, rel):
    shutil.copy2(os.path.join(src, rel), os.path.join(scratch, rel))


def run(cmd, cwd=None, timeout=None, env=None):
    t0 = time.time()
    try:
        p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env,
                           shell=isinstance(cmd, str))
        return p.returncode, p.stdout + p.stderr, time.time() - t0
    except subprocess.TimeoutExpired as ex:
        out = (ex.stdout or b"") + (ex.stderr or b"")
        if isinstance(out, bytes):
            out = out.decode(errors="replace")
        return None, out, time.time() - t0


def archive_members(lib):
    out = subprocess.run(["ar", "t", lib], check=True, capture_output=True, text=True).stdout
    return set(out.split())


def build_mutant(a, e, scratch, mdir):
    """Compiles the mutated translation units and links mdir/attnreplay; returns (ok, log, line).
    The mutated objects stay in mdir/obj (e["objs"]) for test: kills."""
    os.makedirs(mdir, exist_ok=True)
    members = archive_members(a.lib)
    units = [u for u in dependents(a.build, a.main, e["file"])
             if os.path.basename(u[0]) in members or os.path.normpath(u[0]) == os.path.normpath(a.main)]
    if e["only"]:
        units = [u for u in units if u[1] in e["only"]]
    if not units:
        return False, f"no translation unit of {a.build} includes {e['file']}", 0
    try:
        lineno = apply(scratch, e)
    except RuntimeError as ex:
        return False, str(ex), 0
    objs, log = [], []
    try:
        for obj, source in units:
            out = os.path.join(mdir, "obj", os.path.relpath(obj, a.build))
            os.makedirs(os.path.dirname(out), exist_ok=True)
            if source.endswith(".cu"):
                if not a.nvcc:
                    return False, f"{source}: CUDA source but no --nvcc", lineno
                flags = a.nvcc if not source.startswith("reference/") else a.nvcc.replace("--use_fast_math", "")
                cmd = f"{flags} -c {shlex.quote(source)} -o {shlex.quote(out)}"
            else:
                cmd = f"{a.cc} {a.cflags} -c {shlex.quote(source)} -o {shlex.quote(out)}"
            rc, text, _ = run(cmd, cwd=scratch)
            log.append(f"$ {cmd}\n{text}")
            if rc != 0:
                return False, "\n".join(log), lineno
            objs.append(out)
    finally:
        restore(a.src, scratch, e["file"])
    main = os.path.abspath(a.main)
    mobjs = [o for o in objs if os.path.basename(o) == "main.o"]
    if mobjs:
        main = mobjs[0]
        objs = [o for o in objs if o != main]
    e["objs"] = objs
    cmd = (f"{a.link} -o {shlex.quote(os.path.join(mdir, 'attnreplay'))} {shlex.quote(main)} "
           f"{' '.join(shlex.quote(o) for o in objs)} {shlex.quote(os.path.abspath(a.lib))} {a.libs}")
    rc, text, _ = run(cmd)
    log.append(f"$ {cmd}\n{text}")
    return rc == 0, "\n".join(log), lineno


def test_name(kill):
    """NAME of a "test:NAME" kill, else None."""
    return kill[5:] if kill.startswith("test:") else None


def run_test(a, binary):
    """Runs a cmocka test binary as make test does (AR_SRC, AR_BIN); (rc, output)."""
    env = dict(os.environ, AR_SRC=os.path.abspath(a.src), AR_BIN=os.path.abspath(a.bin))
    rc, text, _ = run([binary], cwd=a.src, timeout=a.timeout, env=env)
    return rc, text


def mutant_test(a, e, mdir, name):
    """Links tests/NAME.c against the mutant's objects and runs it; (linked, rc, output)."""
    out = os.path.join(mdir, name)
    cmd = (f"{a.link} {a.test_cflags} -o {shlex.quote(out)} {shlex.quote(os.path.join(a.src, 'tests', name + '.c'))} "
           f"{a.test_objs} {' '.join(shlex.quote(o) for o in e['objs'])} {shlex.quote(os.path.abspath(a.lib))} "
           f"-lcmocka {a.libs}")
    rc, text, _ = run(cmd, cwd=a.src)
    if rc != 0:
        return False, rc, f"test {name} does not link: {text[-500:]}"
    return (True,) + run_test(a, out)


def failed_test_line(text):
    """The first failing assertion or test of a cmocka run, or its last line."""
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    for key in ("FAILED", "Failure!", "error:"):
        for line in lines:
            if key in line:
                return line[:160]
    return lines[-1][:160] if lines else ""


def kill_command(src, binary, kill, db):
    """The shell command of a kill replay 'VAR=V ... TRACE [options]'."""
    words = shlex.split(kill)
    env = []
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
        env.append(words.pop(0))
    trace = words.pop(0)
    if "/" not in trace:
        trace = os.path.join(src, "traces", "samples", trace + ".trace.jsonl.gz")
    return " ".join(env + [shlex.quote(binary), "replay", shlex.quote(trace), "--db", shlex.quote(db)]
                    + [shlex.quote(w) for w in words])


def first_failure_line(text):
    """The replay's first failing step, or its error, or its last line."""
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    for key in ("FAILED", "attnreplay replay: "):
        for line in lines:
            if key in line and not line.startswith("attnreplay replay: /"):
                return line[:160]
    return lines[-1][:160] if lines else ""


def verdict(rc):
    if rc is None:
        return "killed", "time limit"
    if rc == 0:
        return "survived", "exit 0"
    if rc == 1:
        return "killed", "verifier (exit 1)"
    if rc == 3:
        return "killed", "run error (exit 3)"
    if rc in (2, 4):
        return "broken", f"exit {rc}: the kill replay itself is wrong"
    return "killed", f"exit {rc} (signal {rc - 128})" if rc > 128 else f"exit {rc}"


def cmd_check(src, entries):
    """Every entry still applies: its file exists, its text occurs once, its 'only' units exist."""
    problems = 0
    for e in entries:
        path = os.path.join(src, e["file"])
        if not os.path.isfile(path):
            print(f"mutate: {e['id']}: {e['file']} does not exist")
            problems += 1
            continue
        n = open(path, encoding="utf-8").read().count(e["find"])
        if n != 1:
            print(f"mutate: {e['id']}: its find text occurs {n} times in {e['file']} (must be once): '{e['find']}'")
            problems += 1
        for unit in e["only"]:
            if not os.path.isfile(os.path.join(src, unit)):
                print(f"mutate: {e['id']}: only {unit} does not exist")
                problems += 1
    kinds = {k: sum(1 for e in entries if e["kind"] == k) for k in ("cpu", "gpu")}
    print(f"mutate: {len(entries)} mutations ({kinds['cpu']} cpu, {kinds['gpu']} gpu) checked: "
          f"{'all apply' if not problems else f'{problems} problems'}")
    return 1 if problems else 0


def expect_exit3(a, pristine, kill, db, rc, text):
    """A mutant that must end its run with exit 3 (a fault, a hang), after which the pristine binary
    resumes the run from the database it left and completes it."""
    if rc != 3:
        return "survived", f"{kill}: exit {rc}, expected a run error (exit 3); {first_failure_line(text)}"
    rrc, rtext, _ = run(kill_command(a.src, pristine, kill, db) + " --resume", timeout=a.timeout)
    if rrc != 0:
        return "survived", f"{kill}: exit 3, but the pristine --resume exited {rrc}: {first_failure_line(rtext)}"
    return "killed", f"{kill}: run error (exit 3) as expected, then --resume passed; {first_failure_line(text)}"


def cmd_cpu(a, entries):
    scratch = os.path.join(a.out, "src")
    make_scratch(a.src, scratch)
    pristine = os.path.abspath(a.bin)
    # the pristine binary must pass every kill replay
    checked, broken = set(), 0
    print(f"mutate: {len(entries)} cpu mutations; first the pristine {a.bin} on their kill replays")
    for e in entries:
        for kill in e["kill"]:
            if kill in checked:
                continue
            checked.add(kill)
            if test_name(kill):
                rc, text = run_test(a, os.path.join(a.build, "tests", test_name(kill)))
                if rc != 0:
                    broken += 1
                    print(f"  pristine FAILS {kill}: exit {rc}: {failed_test_line(text)}")
                continue
            db = os.path.join(a.out, "pristine.db")
            for suffix in ("", "-wal", "-shm"):
                if os.path.exists(db + suffix):
                    os.remove(db + suffix)
            rc, text, secs = run(kill_command(a.src, pristine, kill, db), timeout=a.timeout)
            if rc != 0:
                broken += 1
                print(f"  pristine FAILS {kill}: exit {rc}: {first_failure_line(text)}")
    if broken:
        print(f"mutate: {broken} kill replays fail without any mutation: fix them first")
        return 1
    print(f"  {len(checked)} kill replays pass")
    results = []
    t_all = time.time()
    for e in entries:
        t0 = time.time()
        mdir = os.path.join(a.out, e["id"])
        ok, log, lineno = build_mutant(a, e, scratch, mdir)
        if not ok:
            print(f"  {e['id']}: does not build:\n{log[-3000:]}")
            results.append((e, lineno, "broken", "does not build", 0.0))
            continue
        outcome, by = "survived", "every kill replay passed"
        for kill in e["kill"]:
            if test_name(kill):
                linked, rc, text = mutant_test(a, e, mdir, test_name(kill))
                if not linked:
                    outcome, by = "broken", text
                    break
                if rc != 0:
                    outcome, by = "killed", f"{kill}: failed (exit {rc}); {failed_test_line(text)}"
                    break
                continue
            db = os.path.join(mdir, "kill.db")
            for suffix in ("", "-wal", "-shm"):
                if os.path.exists(db + suffix):
                    os.remove(db + suffix)
            rc, text, _ = run(kill_command(a.src, os.path.join(mdir, "attnreplay"), kill, db), timeout=a.timeout)
            if e.get("expect") == "exit3":
                outcome, by = expect_exit3(a, pristine, kill, db, rc, text)
                break
            v, how = verdict(rc)
            if v != "survived":
                outcome, by = v, f"{kill}: {how}; {first_failure_line(text)}"
                break
        secs = time.time() - t0
        results.append((e, lineno, outcome, by, secs))
        print(f"  {e['id']:<32} {outcome:<8} {secs:5.1f} s  {by}")
        shutil.rmtree(os.path.join(mdir, "obj"), ignore_errors=True)
    killed = sum(1 for r in results if r[2] == "killed")
    bad = [r for r in results if r[2] != "killed"]
    print(f"mutation score (cpu): {killed} / {len(results)} killed in {time.time() - t_all:.0f} s")
    for e, lineno, outcome, by, _ in bad:
        print(f"  {outcome.upper()}: {e['id']} ({e['file']}:{lineno}: {e['what']}): {by}")
    with open(os.path.join(a.out, "cpu-results.tsv"), "w", encoding="utf-8") as f:
        f.write("id\tfile\tline\tpath\toutcome\tby\tseconds\n")
        for e, lineno, outcome, by, secs in results:
            f.write(f"{e['id']}\t{e['file']}\t{lineno}\t{e.get('path', '')}\t{outcome}\t{by}\t{secs:.1f}\n")
    return 0 if not bad else 1


def cmd_gpu(a, entries):
    # Uncompressed device code (one kernel differs, the rest of the translation unit's cubins are
    # the same bytes in every mutant of it, which xz's dictionary then shares; a compressed fatbin
    # would differ throughout) and a fixed seed for nvcc's generated names.
    a.nvcc += " -compress-mode=none -frandom-seed=attnreplay-mutant"
    scratch = os.path.join(a.out, "src")
    make_scratch(a.src, scratch)
    pack = os.path.join(a.out, "gpu-mutants")
    if os.path.exists(pack):
        shutil.rmtree(pack)
    os.makedirs(pack)
    failures = 0
    t_all = time.time()
    with open(os.path.join(pack, "mutants.tsv"), "w", encoding="utf-8") as man:
        man.write("id\tfile\tline\tpath\texpect\twhat\tkills\n")
        for e in entries:
            t0 = time.time()
            mdir = os.path.join(a.out, "build-" + e["id"])
            ok, log, lineno = build_mutant(a, e, scratch, mdir)
            if not ok:
                failures += 1
                print(f"  {e['id']}: does not build:\n{log[-3000:]}")
                continue
            os.makedirs(os.path.join(pack, e["id"]))
            shutil.move(os.path.join(mdir, "attnreplay"), os.path.join(pack, e["id"], "attnreplay"))
            # host debug info is not needed to run it; symbols stay for a backtrace
            run(["strip", "--strip-debug", os.path.join(pack, e["id"], "attnreplay")])
            shutil.rmtree(mdir, ignore_errors=True)
            # no empty fields: the runner's read(1) would merge them
            man.write(f"{e['id']}\t{e['file']}\t{lineno}\t{e.get('path') or '-'}\t{e.get('expect') or '-'}\t"
                      f"{e['what']}\t" + "\t".join(e["kill"]) + "\n")
            print(f"  {e['id']:<36} built in {time.time() - t0:5.1f} s")
    shutil.copy2(os.path.join(HERE, "run_mutants.sh"), os.path.join(pack, "run_mutants.sh"))
    raw = sum(os.path.getsize(os.path.join(r, f)) for r, _d, fs in os.walk(pack) for f in fs)
    archive = os.path.join(a.out, "gpu-mutants.tar.xz")
    rc, text, secs = run(f"tar -C {shlex.quote(a.out)} -cf - gpu-mutants | "
                         f"xz -T1 --lzma2=preset=1,dict=256MiB > {shlex.quote(archive)}")
    if rc != 0:
        print(f"mutate: packing failed: {text}")
        return 1
    size = os.path.getsize(archive)
    shutil.rmtree(pack, ignore_errors=True)   # the archive holds it: not carried twice
    shutil.rmtree(scratch, ignore_errors=True)
    n = len(entries) - failures
    print(f"mutate: {n} gpu mutants built in {time.time() - t_all:.0f} s; {raw / 1e6:.0f} MB packed to "
          f"{archive}: {size / 1e6:.1f} MB ({size / max(n, 1) / 1e6:.2f} MB a mutant; xz took {secs:.0f} s)")
    return 1 if failures else 0


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "check":
        src = sys.argv[2] if len(sys.argv) > 2 else os.path.dirname(HERE)
        lst = sys.argv[3] if len(sys.argv) > 3 else os.path.join(HERE, "mutations.txt")
        sys.exit(cmd_check(os.path.abspath(src), parse_mutations(lst)))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("kind", choices=("cpu", "gpu"))
    p.add_argument("--list", default=os.path.join(HERE, "mutations.txt"))
    p.add_argument("--src", required=True)
    p.add_argument("--build", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--bin", default="bin/attnreplay")
    p.add_argument("--main", required=True)
    p.add_argument("--lib", required=True)
    p.add_argument("--cc", required=True)
    p.add_argument("--cflags", required=True)
    p.add_argument("--nvcc", default="")
    p.add_argument("--link", required=True)
    p.add_argument("--libs", required=True)
    p.add_argument("--only", default="", help="comma-separated mutation ids")
    p.add_argument("--test-objs", default="", help="objects a test binary links besides the library (test: kills)")
    p.add_argument("--test-cflags", default="", help="the flags test binaries compile with (test: kills)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds a kill replay may run")
    a = p.parse_args()
    a.src = os.path.abspath(a.src)
    # a mutant may leave a variable unused: warnings are not errors here
    a.cflags = re.sub(r"(^|\s)-Werror(?=\s|$)", " ", a.cflags)
    entries = [e for e in parse_mutations(a.list) if e["kind"] == a.kind]
    if a.only:
        wanted = set(a.only.split(","))
        unknown = wanted - {e["id"] for e in entries}
        if unknown:
            sys.exit(f"mutate: unknown {a.kind} mutation ids: {', '.join(sorted(unknown))}")
        entries = [e for e in entries if e["id"] in wanted]
    if cmd_check(a.src, parse_mutations(a.list)) != 0:
        sys.exit(1)
    os.makedirs(a.out, exist_ok=True)
    a.out = os.path.abspath(a.out)
    sys.stdout.reconfigure(line_buffering=True)
    sys.exit(cmd_cpu(a, entries) if a.kind == "cpu" else cmd_gpu(a, entries))


if __name__ == "__main__":
    main()

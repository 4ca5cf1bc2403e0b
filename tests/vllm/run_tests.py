"""run_tests.py - runs the vLLM tests (tests/vllm/test_*.py, or the modules named on the command
line) in one process, so vLLM is imported once; then prints the recorder's overhead per step
on the headless scheduler (a measurement, not an assertion) and the closing line
"N passed, N failed, N skipped".  Exit 1 if any test failed or errored."""

import glob
import os
import sys
import time
import unittest


def overhead():
    """schedule() + update_from_output() time per step, plain Scheduler against RecordingScheduler,
    on one shared-prefix workload (best of 3 runs each, same process)."""
    import common
    from vllm_recorder import headless
    wl = common.tmp("overhead.jsonl")
    headless.write_mooncake(wl, headless.shared_prefix_rows(8, 16, 1000, 200, 64, 50, seed=7))
    workload = headless.read_mooncake(wl)
    best = {}
    for kind in ("plain", "record", "plain", "record", "plain", "record"):
        os.environ["ATTNREPLAY_TRACE"] = common.tmp("overhead.trace.jsonl.gz")
        config, kv = headless.build_config(num_blocks=2048, model_dir=common.TINY_MODEL)
        sched = headless.make_scheduler(headless.scheduler_class(kind), config, kv)
        stats = headless.drive(sched, workload)
        if kind == "record":
            sched.ar_close()
        per_step = (stats.schedule_s + stats.update_s) / stats.steps
        best[kind] = min(best.get(kind, 1e9), per_step)
    size = os.path.getsize(common.tmp("overhead.trace.jsonl.gz"))
    print(f"recorder overhead: {stats.steps} steps of {len(workload)} requests; schedule()+update_from_output() "
          f"{1e6 * best['plain']:.0f} us/step plain, {1e6 * best['record']:.0f} us/step recording "
          f"(+{1e6 * (best['record'] - best['plain']):.0f} us, {100 * (best['record'] / best['plain'] - 1):.0f}%); "
          f"trace {size / stats.steps:.0f} bytes/step gzip")


def main(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    names = argv or sorted(os.path.splitext(os.path.basename(p))[0] for p in glob.glob(os.path.join(here, "test_*.py")))
    suite = unittest.defaultTestLoader.loadTestsFromNames(names)
    start = time.time()
    result = unittest.TextTestRunner(verbosity=2, stream=sys.stdout).run(suite)
    failed = len(result.failures) + len(result.errors) + len(result.unexpectedSuccesses)
    skipped = len(result.skipped)
    passed = result.testsRun - failed - skipped
    if not argv and failed == 0:
        overhead()
    print(f"tests/vllm: {time.time() - start:.0f} s")
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

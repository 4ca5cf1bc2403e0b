/* gpu_faults.c - a broken CUDA kernel must not take the run down with it (the device side of
 * tests/test_watchdog.c): the example CUDA plugin with a kernel that writes out of bounds (an
 * illegal address, which loses the CUDA context) or one that never finishes, launched from step
 * FAULT_STEP on (tests/plugins/faulty_cuda.cu).  The replay exits 3 naming the step, the layer
 * and the cause (the CUDA error, or --forward-timeout); the database holds exactly the steps
 * before it, whole; the run is 'error'; and --resume in a fresh process (a new context) with
 * the fault moved past the trace's end completes the run; with --repeat 3 (repeats back to back)
 * the out-of-bounds step fails the same way.  Skips with the reason when there is
 * no CUDA device or the build has no CUDA. */
#include "testutil.h"
#include "watchdog_checks.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../replay/plugin_dev.h"

/* The plugin of kind (oob | hang), or NULL (and why) when there is no device or no such build. */
static const char *faulty_cuda(const char *kind, char *buf, size_t len)
{
    char why[256];
    if (ar_pdev_probe(why, sizeof why) != 0) {
        print_message("skipping: %s\n", why);
        return NULL;
    }
    snprintf(buf, len, "%s/tests/plugins/faulty-cuda-%s.so", tu_build_dir(), kind);
    if (access(buf, R_OK) != 0) {
        print_message("skipping: %s is missing (built only with CUDA)\n", buf);
        return NULL;
    }
    return buf;
}

/* The out-of-bounds plugin on the mixed sample with opts (files named after tag): exit 3 naming
 * the step, the layer and the CUDA error, the database whole, and with resume a fresh process
 * completing the run. */
static void out_of_bounds_fails_the_step(const char *tag, const char *opts, bool resume)
{
    char plugin[4200], trace[512], db[512], log[512], want[512], name[64];
    if (!faulty_cuda("oob", plugin, sizeof plugin)) {
        skip();
        return;
    }
    tu_sample("mixed", trace, sizeof trace);
    snprintf(name, sizeof name, "%s.db", tag);
    tu_tmp(name, db, sizeof db);
    snprintf(name, sizeof name, "%s.log", tag);
    tu_tmp(name, log, sizeof log);
    assert_int_equal(replay_broken(plugin, trace, db, log, "", opts, 3), 3);
    snprintf(want, sizeof want, "step %d, layer 0", FAULT_STEP);
    assert_true(tu_file_has(log, want));
    assert_true(tu_file_has(log, "illegal memory access"));
    assert_stopped_whole(db, "illegal memory access");
    if (resume) assert_resume_completes(plugin, trace, db, log, "");
}

static void test_out_of_bounds_write_fails_the_step(void **state)
{
    (void)state;
    out_of_bounds_fails_the_step("oob", "", true);
}

/* The same with --repeat 3: the repeats run back to back and are waited for once, so the fault
 * of the first repeat's kernel surfaces at a later launch or at the wait; the step still fails
 * the same way. */
static void test_out_of_bounds_write_fails_the_step_with_repeats(void **state)
{
    (void)state;
    out_of_bounds_fails_the_step("oob-repeat", "--repeat 3", false);
}

static void test_kernel_that_never_ends_fails_after_the_timeout(void **state)
{
    (void)state;
    char plugin[4200], trace[512], db[512], log[512], want[512];
    if (!faulty_cuda("hang", plugin, sizeof plugin)) {
        skip();
        return;
    }
    tu_sample("mixed", trace, sizeof trace);
    tu_tmp("hang.db", db, sizeof db);
    tu_tmp("hang.log", log, sizeof log);
    double t0 = now_s();
    int rc = replay_broken(plugin, trace, db, log, "", "--forward-timeout 5", 3);
    double took = now_s() - t0;
    assert_int_equal(rc, 3);
    print_message("the hung replay ended after %.1f s (timeout 5 s)\n", took);
    assert_true(took < 60);
    snprintf(want, sizeof want, "step %d, layer 0: the plugin:faulty-cuda-hang backend's forward did not return "
             "within 5 s (--forward-timeout)", FAULT_STEP);
    assert_true(tu_file_has(log, want));
    assert_stopped_whole(db, "did not return within 5 s");
    assert_resume_completes(plugin, trace, db, log, "--forward-timeout 5");
}

int main(void)
{
    struct CMUnitTest tests[] = {
        cmocka_unit_test(test_out_of_bounds_write_fails_the_step),
        cmocka_unit_test(test_out_of_bounds_write_fails_the_step_with_repeats),
        cmocka_unit_test(test_kernel_that_never_ends_fails_after_the_timeout),
    };
    return tu_run_gpu_tests("gpu_faults", tests, sizeof tests / sizeof tests[0]);
}

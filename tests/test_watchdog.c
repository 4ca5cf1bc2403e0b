/* test_watchdog.c - a broken kernel must not take the run down with it: a backend whose forward
 * faults (SIGSEGV) or never returns (past --forward-timeout or ATTNREPLAY_FORWARD_TIMEOUT) fails
 * its step: the replay exits 3 with a message naming the step, the layer, the backend and the
 * cause; the database holds exactly the steps before it, whole (steps, coverage, progress
 * counters agree; integrity_check ok), the run is 'error' with that cause; and --resume then
 * completes the run without duplicating a row.  The broken kernels are tests/plugins/faulty.c
 * (the example CPU plugin, faulting from step ATTNREPLAY_FAULTY_STEP on), with and without the
 * overlapped writer; one whose forward returns an error (as a CUDA backend does after a kernel
 * fault) ends the run the same way.  ATTNREPLAY_CRASH_HANDLER=0 leaves a fault to the default action; bad
 * --forward-timeout values are usage errors. */
#include "testutil.h"
#include "watchdog_checks.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *faulty(const char *kind, char *buf, size_t len)
{
    snprintf(buf, len, "%s/tests/plugins/faulty-%s.so", tu_build_dir(), kind);
    return buf;
}

static void test_segfault_in_forward_fails_the_step(void **state)
{
    (void)state;
    static const char *const modes[] = {"", "--no-overlap"};
    char plugin[4200], trace[512], db[512], log[512], want[512];
    faulty("segv", plugin, sizeof plugin);
    tu_sample("mixed", trace, sizeof trace);
    for (size_t m = 0; m < 2; m++) {
        snprintf(db, sizeof db, "%s/segv-%zu.db", tu_tmpdir(), m);
        tu_tmp("segv.log", log, sizeof log);
        assert_int_equal(replay_broken(plugin, trace, db, log, "", modes[m], 3), 3);
        snprintf(want, sizeof want, "step %d, layer 0: the plugin:faulty-segv backend's forward crashed with SIGSEGV "
                 "(address 0x10)", FAULT_STEP);
        assert_true(tu_file_has(log, want));
        assert_true(tu_file_has(log, "marked 'error' (--resume continues it)"));
        assert_stopped_whole(db, "forward crashed with SIGSEGV");
        assert_resume_completes(plugin, trace, db, log, modes[m]);
    }
}

static void test_hung_forward_fails_after_the_timeout(void **state)
{
    (void)state;
    char plugin[4200], trace[512], db[512], log[512], want[512];
    faulty("hang", plugin, sizeof plugin);
    tu_sample("mixed", trace, sizeof trace);
    /* by option and by environment */
    static const char *const how[] = {"", "ATTNREPLAY_FORWARD_TIMEOUT=1"};
    static const char *const opt[] = {"--forward-timeout 1", ""};
    for (size_t k = 0; k < 2; k++) {
        snprintf(db, sizeof db, "%s/hang-%zu.db", tu_tmpdir(), k);
        tu_tmp("hang.log", log, sizeof log);
        double t0 = now_s();
        int rc = replay_broken(plugin, trace, db, log, how[k], opt[k], 3);
        double took = now_s() - t0;
        assert_int_equal(rc, 3);
        assert_true(took < 30);
        snprintf(want, sizeof want, "step %d, layer 0: the plugin:faulty-hang backend's forward did not return within "
                 "1 s (--forward-timeout)", FAULT_STEP);
        assert_true(tu_file_has(log, want));
        assert_stopped_whole(db, "did not return within 1 s");
        assert_resume_completes(plugin, trace, db, log, opt[k]);
    }
}

/* A forward that returns an error (what a CUDA backend does when its kernel faulted: the
 * CUDA-side path of tests/gpu_faults.c) ends the run the same way. */
static void test_failed_forward_fails_the_step(void **state)
{
    (void)state;
    char plugin[4200], trace[512], db[512], log[512], want[512];
    faulty("error", plugin, sizeof plugin);
    tu_sample("mixed", trace, sizeof trace);
    tu_tmp("error.db", db, sizeof db);
    tu_tmp("error.log", log, sizeof log);
    assert_int_equal(replay_broken(plugin, trace, db, log, "", "", 3), 3);
    snprintf(want, sizeof want, "forward failed at step %d, layer 0", FAULT_STEP);
    assert_true(tu_file_has(log, want));
    assert_true(tu_file_has(log, "an illegal memory access was encountered"));
    assert_stopped_whole(db, "an illegal memory access was encountered");
    assert_resume_completes(plugin, trace, db, log, "");
}

/* ATTNREPLAY_CRASH_HANDLER=0: the fault takes its default course (the process dies by SIGSEGV,
 * or a sanitizer's handler reports it); what was committed stays whole and --resume still
 * completes the run. */
static void test_crash_handler_can_be_turned_off(void **state)
{
    (void)state;
    char plugin[4200], trace[512], db[512], log[512];
    faulty("segv", plugin, sizeof plugin);
    tu_sample("mixed", trace, sizeof trace);
    tu_tmp("off.db", db, sizeof db);
    tu_tmp("off.log", log, sizeof log);
    int rc = replay_broken(plugin, trace, db, log, "ATTNREPLAY_CRASH_HANDLER=0", "", 128 + 11);
    /* under AddressSanitizer (make asan) its own SEGV handler reports the fault and exits 1 */
    assert_true(rc == 128 + 11 || (rc == 1 && tu_file_has(log, "AddressSanitizer: SEGV")));
    char text[64];
    tu_query_text(db, "SELECT status FROM runs WHERE id=1", text, sizeof text);
    assert_string_equal(text, "running");
    int64_t kept = tu_query_int(db, "SELECT count(*) FROM steps WHERE run=1");
    assert_true(kept >= 0 && kept <= FAULT_STEP);
    assert_int_equal(tu_query_int(db, "SELECT last_step FROM runs WHERE id=1") + 1, kept);
    assert_resume_completes(plugin, trace, db, log, "");
}

static void test_forward_timeout_usage(void **state)
{
    (void)state;
    char trace[512], db[512], log[512];
    tu_sample("mixed", trace, sizeof trace);
    tu_tmp("usage.db", db, sizeof db);
    tu_tmp("usage.log", log, sizeof log);
    static const char *const bad[] = {"-1", "abc", "inf", ""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(tu_run(log, "'%s' replay '%s' --db '%s' --backend cpu --forward-timeout '%s'", tu_bin(), trace,
                                db, bad[i]), 2);
        assert_true(tu_file_has(log, "--forward-timeout takes seconds >= 0"));
    }
    /* 0: no limit; a generous limit changes nothing */
    assert_int_equal(tu_run(log, "'%s' replay '%s' --db '%s' --backend cpu --steps 0:3 --forward-timeout 0 --quiet",
                            tu_bin(), trace, db), 0);
    assert_int_equal(tu_run(log, "'%s' replay '%s' --db '%s' --backend cpu --steps 0:3 --forward-timeout 60 --quiet",
                            tu_bin(), trace, db), 0);
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM runs WHERE status='passed'"), 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_segfault_in_forward_fails_the_step),
        cmocka_unit_test(test_hung_forward_fails_after_the_timeout),
        cmocka_unit_test(test_failed_forward_fails_the_step),
        cmocka_unit_test(test_crash_handler_can_be_turned_off),
        cmocka_unit_test(test_forward_timeout_usage),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

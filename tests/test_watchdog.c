/* test_watchdog.c - a broken kernel must not take the run down with it: a backend whose forward
 * faults (SIGSEGV) or never returns (past --forward-timeout or ATTNREPLAY_FORWARD_TIMEOUT) fails
 * its step: the replay exits 3 with a message naming the step, the layer, the backend and the
 * cause; the database holds exactly the steps before it, whole (steps, coverage, progress
 * counters agree; integrity_check ok), the run is 'error' with that cause; and --resume then
 * completes the run without duplicating a row.  The broken kernels are tests/plugins/faulty.c
 * (the example CPU plugin, faulting from step ATTNREPLAY_FAULTY_STEP on), with and without the
 * overlapped writer; one whose forward returns an error (as a CUDA backend does after a kernel
 * fault) ends the run the same way.  A plugin whose attnreplay_plugin_init or check() faults
 * (SIGSEGV, abort()) or never returns is a broken plugin: exit 2, a message naming its file and
 * the entry point, nothing stored; one whose close() does so after the run is stored leaves the
 * run as stored ('passed', every step, integrity ok) and exits 3 saying so.
 * ATTNREPLAY_CRASH_HANDLER=0 leaves a fault to the default action; bad --forward-timeout values
 * are usage errors. */
#include "testutil.h"
#include "watchdog_checks.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

/* A fault in attnreplay_plugin_init or check(): exit 2, "plugin PATH crashed (SIG...) in ...",
 * nothing replayed and no database written. */
static void test_crash_in_init_or_check_is_a_broken_plugin(void **state)
{
    (void)state;
    static const struct {
        const char *kind, *what;
    } cases[] = {
        {"initsegv", "crashed (SIGSEGV) in attnreplay_plugin_init (address 0x10)"},
        {"initabort", "crashed (SIGABRT) in attnreplay_plugin_init"},
        {"checksegv", "crashed (SIGSEGV) in check() (address 0x10)"},
    };
    char plugin[4200], trace[512], db[512], log[512], want[4600];
    tu_sample("mixed", trace, sizeof trace);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        faulty(cases[i].kind, plugin, sizeof plugin);
        snprintf(db, sizeof db, "%s/entry-%s.db", tu_tmpdir(), cases[i].kind);
        tu_tmp("entry.log", log, sizeof log);
        unlink(db);
        assert_int_equal(replay_broken(plugin, trace, db, log, "", "", 2), 2);
        snprintf(want, sizeof want, "attnreplay replay: plugin %s %s: a broken plugin; nothing was replayed", plugin,
                 cases[i].what);
        if (!tu_file_has(log, want)) print_message("wanted: %s\n", want);
        assert_true(tu_file_has(log, want));
        assert_int_equal(access(db, F_OK), -1);
    }
}

/* attnreplay_plugin_init or check() that never returns: the same, after the deadline (by option
 * and by environment). */
static void test_hang_in_init_or_check_is_a_broken_plugin(void **state)
{
    (void)state;
    static const char *const kinds[] = {"inithang", "checkhang"};
    static const char *const where[] = {"attnreplay_plugin_init", "check()"};
    static const char *const how[] = {"", "ATTNREPLAY_FORWARD_TIMEOUT=1"};
    static const char *const opt[] = {"--forward-timeout 1", ""};
    char plugin[4200], trace[512], db[512], log[512], want[4600];
    tu_sample("mixed", trace, sizeof trace);
    for (size_t i = 0; i < 2; i++)
        for (size_t k = 0; k < 2; k++) {
            faulty(kinds[i], plugin, sizeof plugin);
            snprintf(db, sizeof db, "%s/entry-%s.db", tu_tmpdir(), kinds[i]);
            tu_tmp("entry.log", log, sizeof log);
            unlink(db);
            /* `timeout`: a replay without the deadline would never end */
            char env[128];
            snprintf(env, sizeof env, "%s timeout -s KILL 60 env", how[k]);
            double t0 = now_s();
            assert_int_equal(replay_broken(plugin, trace, db, log, env, opt[k], 2), 2);
            assert_true(now_s() - t0 < 30);
            snprintf(want, sizeof want, "attnreplay replay: plugin %s did not return within 1 s in %s "
                     "(--forward-timeout): a broken plugin; nothing was replayed", plugin, where[i]);
            if (!tu_file_has(log, want)) print_message("wanted: %s\n", want);
            assert_true(tu_file_has(log, want));
            assert_int_equal(access(db, F_OK), -1);
        }
}

/* The run passed and is stored; then close() faults or hangs: the run keeps its status and every
 * step (the database whole), the message says so, exit 3. */
static void test_close_failure_keeps_the_stored_run(void **state)
{
    (void)state;
    static const struct {
        const char *kind, *opts, *what;
    } cases[] = {
        {"closesegv", "", "crashed (SIGSEGV) in close() (address 0x10)"},
        {"closesegv", "--no-overlap", "crashed (SIGSEGV) in close() (address 0x10)"},
        {"closehang", "--forward-timeout 1", "did not return within 1 s in close() (--forward-timeout)"},
    };
    char plugin[4200], trace[512], db[512], log[512], want[5400], text[1024];
    tu_sample("mixed", trace, sizeof trace);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        faulty(cases[i].kind, plugin, sizeof plugin);
        snprintf(db, sizeof db, "%s/close-%zu.db", tu_tmpdir(), i);
        tu_tmp("close.log", log, sizeof log);
        double t0 = now_s();
        assert_int_equal(replay_broken(plugin, trace, db, log, "timeout -s KILL 60 env", cases[i].opts, 3), 3);
        assert_true(now_s() - t0 < 60);
        snprintf(want, sizeof want, "attnreplay replay: plugin %s %s after run 1 in %s was stored: the run keeps its "
                 "status 'passed' and its steps; exit 3 for the failed close", plugin, cases[i].what, db);
        if (!tu_file_has(log, want)) print_message("wanted: %s\n", want);
        assert_true(tu_file_has(log, want));
        tu_query_text(db, "SELECT status FROM runs WHERE id=1", text, sizeof text);
        assert_string_equal(text, "passed");
        assert_int_equal(tu_query_int(db, "SELECT count(*) FROM runs"), 1);
        const int64_t steps = tu_query_int(db, "SELECT count(*) FROM steps WHERE run=1");
        assert_true(steps > FAULT_STEP);
        assert_int_equal(tu_query_int(db, "SELECT steps_done FROM runs WHERE id=1"), steps);
        assert_int_equal(tu_query_int(db, "SELECT count(DISTINCT step) FROM coverage WHERE run=1"), steps);
        assert_int_equal(tu_query_int(db, "SELECT count(*) FROM steps WHERE run=1 AND pass IS NOT 1"), 0);
        tu_query_text(db, "PRAGMA integrity_check", text, sizeof text);
        assert_string_equal(text, "ok");
    }
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
    /* in a plugin's init too */
    faulty("initsegv", plugin, sizeof plugin);
    tu_tmp("off-init.db", db, sizeof db);
    rc = replay_broken(plugin, trace, db, log, "ATTNREPLAY_CRASH_HANDLER=0", "", 128 + 11);
    assert_true(rc == 128 + 11 || (rc == 1 && tu_file_has(log, "AddressSanitizer: SEGV")));
    char *said = tu_slurp(log);
    assert_non_null(said);
    assert_null(strstr(said, "a broken plugin"));
    free(said);
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
        cmocka_unit_test(test_crash_in_init_or_check_is_a_broken_plugin),
        cmocka_unit_test(test_hang_in_init_or_check_is_a_broken_plugin),
        cmocka_unit_test(test_close_failure_keeps_the_stored_run),
        cmocka_unit_test(test_crash_handler_can_be_turned_off),
        cmocka_unit_test(test_forward_timeout_usage),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* watchdog_checks.h - what a run broken by a faulting or hung backend must leave behind, shared
 * by tests/test_watchdog.c (CPU plugins) and tests/gpu_faults.c (CUDA plugins): the tests' broken
 * kernels (tests/plugins/faulty*.c*) fault from step ATTNREPLAY_FAULTY_STEP on; the replay runs
 * with it at FAULT_STEP.  Include after testutil.h. */
#ifndef AR_WATCHDOG_CHECKS_H
#define AR_WATCHDOG_CHECKS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define FAULT_STEP 5

static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Replays trace through the broken plugin from step FAULT_STEP on (env: more variables, opts:
 * more options) into db, output in log; the exit code (the log is shown when it is not want). */
static inline int replay_broken(const char *plugin, const char *trace, const char *db, const char *log,
                                const char *env, const char *opts, int want)
{
    int rc = tu_run(log, "%s ATTNREPLAY_FAULTY_STEP=%d '%s' replay '%s' --db '%s' --backend 'plugin:%s' --quiet %s", env,
                    FAULT_STEP, tu_bin(), trace, db, plugin, opts);
    if (rc != want) {
        char *t = tu_slurp(log);
        print_message("exit %d, want %d\n%s\n", rc, want, t ? t : "");
        free(t);
    }
    return rc;
}

/* The run stopped at FAULT_STEP: the steps before it, whole; status 'error' with cause. */
static inline void assert_stopped_whole(const char *db, const char *cause)
{
    char text[1024];
    tu_query_text(db, "SELECT status FROM runs WHERE id=1", text, sizeof text);
    assert_string_equal(text, "error");
    tu_query_text(db, "SELECT error FROM runs WHERE id=1", text, sizeof text);
    if (!strstr(text, cause)) print_message("runs.error: %s (wanted '%s')\n", text, cause);
    assert_non_null(strstr(text, cause));
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM steps WHERE run=1"), FAULT_STEP);
    assert_int_equal(tu_query_int(db, "SELECT max(step) FROM steps WHERE run=1"), FAULT_STEP - 1);
    assert_int_equal(tu_query_int(db, "SELECT steps_done FROM runs WHERE id=1"), FAULT_STEP);
    assert_int_equal(tu_query_int(db, "SELECT last_step FROM runs WHERE id=1"), FAULT_STEP - 1);
    assert_int_equal(tu_query_int(db, "SELECT count(DISTINCT step) FROM coverage WHERE run=1"), FAULT_STEP);
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM steps WHERE run=1 AND pass IS NOT 1"), 0);
    tu_query_text(db, "PRAGMA integrity_check", text, sizeof text);
    assert_string_equal(text, "ok");
}

/* --resume with the fault moved past the trace's end completes the run. */
static inline void assert_resume_completes(const char *plugin, const char *trace, const char *db, const char *log,
                                    const char *extra)
{
    int rc = tu_run(log, "ATTNREPLAY_FAULTY_STEP=100000 '%s' replay '%s' --db '%s' --backend 'plugin:%s' --resume "
                         "--quiet %s", tu_bin(), trace, db, plugin, extra);
    if (rc != 0) {
        char *t = tu_slurp(log);
        print_message("resume: exit %d\n%s\n", rc, t ? t : "");
        free(t);
    }
    assert_int_equal(rc, 0);
    char text[64];
    tu_query_text(db, "SELECT status FROM runs WHERE id=1", text, sizeof text);
    assert_string_equal(text, "passed");
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM runs"), 1);
    int64_t steps = tu_query_int(db, "SELECT count(*) FROM steps WHERE run=1");
    assert_true(steps > FAULT_STEP);
    assert_int_equal(tu_query_int(db, "SELECT count(DISTINCT step) FROM steps WHERE run=1"), steps);
    assert_int_equal(tu_query_int(db, "SELECT steps_done FROM runs WHERE id=1"), steps);
    assert_int_equal(tu_query_int(db, "SELECT count(DISTINCT step) FROM coverage WHERE run=1"), steps);
}

#endif

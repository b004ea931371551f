/* The compiled-backend suite: a compiled backend (TEST_BACKEND) against the cpu backend, area by
   area, each area a cmocka group of its own (its devices made at its start, tb_shutdown at its
   end). tests/test_opencl.c runs it on OpenCL, tests/test_native.c on the native backend and
   tests/test_kit.c on the backend examples/kit_backend.c makes with the public kit alone.

   TB_TEST_AREA=fusion,cache runs those areas only; TB_TEST_FILTER=PATTERN the tests whose name
   matches (cmocka's wildcards). */
#include "harness.h"

#include "ops.c"
#include "reductions.c"
#include "matmul.c"
#include "conv.c"
#include "fusion.c"
#include "dumps.c"
#include "graphs.c"
#include "faults.c"
#include "cache.c"
#include "devices.c"

#define SUITE_AREA(a)                                                                              \
    { #a, a##_tests, sizeof a##_tests / sizeof a##_tests[0] }

static const struct suite_area {
    const char *name;
    const struct CMUnitTest *tests;
    size_t count;
} g_areas[] = {
    SUITE_AREA(ops),    SUITE_AREA(reductions), SUITE_AREA(matmul), SUITE_AREA(conv),
    SUITE_AREA(fusion), SUITE_AREA(dumps),      SUITE_AREA(graphs), SUITE_AREA(faults),
    SUITE_AREA(cache),  SUITE_AREA(devices),
};

/* whether TB_TEST_AREA (names separated by commas; unset or empty: all) names `name` */
static bool area_wanted(const char *name) {
    const char *want = getenv("TB_TEST_AREA"), *p;
    size_t n = strlen(name);
    if (want == NULL || want[0] == '\0') return true;
    for (p = want;;) {
        const char *end = strchr(p, ',');
        size_t len = end != NULL ? (size_t)(end - p) : strlen(p);
        if (len == n && strncmp(p, name, n) == 0) return true;
        if (end == NULL) return false;
        p = end + 1;
    }
}

/* cmocka's wildcards: '*' any run of characters, '?' one character */
static bool glob_match(const char *pattern, const char *name) {
    if (*pattern == '\0') return *name == '\0';
    if (*pattern == '*')
        return glob_match(pattern + 1, name) || (*name != '\0' && glob_match(pattern, name + 1));
    if (*name == '\0') return false;
    return (*pattern == '?' || *pattern == *name) && glob_match(pattern + 1, name + 1);
}

int main(void) {
    const char *filter = getenv("TB_TEST_FILTER");
    struct CMUnitTest run[32];
    size_t a, i;
    int failed = 0;
    if (filter != NULL) cmocka_set_test_filter(filter);
    for (a = 0; a < sizeof g_areas / sizeof g_areas[0]; a++) {
        const struct suite_area *area = &g_areas[a];
        size_t n = 0;
        if (!area_wanted(area->name)) continue;
        for (i = 0; i < area->count; i++) {
            if (area->tests[i].initial_state == &g_opencl_only && !TEST_OPENCL) continue;
            /* an area none of whose tests the filter lets through is not set up at all */
            if (filter != NULL && !glob_match(filter, area->tests[i].name)) continue;
            if (n == sizeof run / sizeof run[0]) {
                fprintf(stderr, "suite.c: area %s has more than %zu tests\n", area->name, n);
                return 1;
            }
            run[n++] = area->tests[i];
        }
        if (n == 0) continue;
        printf("\n-- area %s (tests/backend_suite/%s.c) on %s\n", area->name, area->name,
               TEST_BACKEND);
        fflush(stdout);
        failed += _cmocka_run_group_tests(area->name, run, n, group_setup, group_teardown);
    }
    return failed;
}

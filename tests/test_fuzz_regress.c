/* Replays the fuzz harnesses of tests/fuzz/ without libFuzzer: every seed of
   tests/fuzz/corpus/<target>/ and every input a fuzzer once crashed on,
   tests/fuzz/regress/<target>/, goes through its harness under the test suite's sanitizers.
   A harness aborts on a broken invariant, which fails the test. Run from the repository root
   (tools/test.sh does). */
#define _POSIX_C_SOURCE 200809L
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TB_FUZZ_NO_ENTRY
#include "fuzz/fuzz_npy.c"
#include "fuzz/fuzz_parse.c"
#include "fuzz/fuzz_dlpack.c"
#include "fuzz/fuzz_graph.c"
#include "fuzz/fuzz_safetensors.c"
#include "fuzz/fuzz_npz.c"
#include "fuzz/fuzz_idx.c"

typedef int (*one_input_fn)(const uint8_t *data, size_t size);

static int compare_names(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Runs every file of `folder` (sorted by name) through `fn`; returns how many there were
   (0 when the folder does not exist). */
static size_t replay_folder(const char *folder, one_input_fn fn) {
    DIR *dir = opendir(folder);
    struct dirent *entry;
    char **names = NULL;
    size_t count = 0, cap = 0, i;
    if (dir == NULL) return 0;
    while ((entry = readdir(dir)) != NULL) {
        if (entry->d_name[0] == '.') continue;
        if (count == cap) {
            cap = cap ? 2 * cap : 16;
            names = (char **)realloc(names, cap * sizeof *names);
            assert_non_null(names);
        }
        names[count] = strdup(entry->d_name);
        assert_non_null(names[count]);
        count++;
    }
    closedir(dir);
    if (count > 0) qsort(names, count, sizeof *names, compare_names);
    for (i = 0; i < count; i++) {
        char path[1024];
        FILE *f;
        long size;
        uint8_t *data;
        snprintf(path, sizeof path, "%s/%s", folder, names[i]);
        f = fopen(path, "rb");
        if (f == NULL) fail_msg("cannot open %s", path);
        assert_int_equal(fseek(f, 0, SEEK_END), 0);
        size = ftell(f);
        assert_true(size >= 0);
        assert_int_equal(fseek(f, 0, SEEK_SET), 0);
        data = (uint8_t *)malloc(size > 0 ? (size_t)size : 1);
        assert_non_null(data);
        if (size > 0) assert_int_equal(fread(data, 1, (size_t)size, f), (size_t)size);
        fclose(f);
        print_message("    %s (%ld bytes)\n", path, size);
        fn(data, (size_t)size);
        free(data);
        free(names[i]);
    }
    free(names);
    return count;
}

static void replay(const char *target, one_input_fn fn) {
    char corpus[256], regress[256];
    size_t seeds, crashes;
    snprintf(corpus, sizeof corpus, "tests/fuzz/corpus/%s", target);
    snprintf(regress, sizeof regress, "tests/fuzz/regress/%s", target);
    seeds = replay_folder(corpus, fn);
    crashes = replay_folder(regress, fn);
    if (seeds == 0) fail_msg("no seeds in %s (run from the repository root)", corpus);
    print_message("%s: %zu seeds, %zu regression inputs\n", target, seeds, crashes);
}

static int teardown(void **state) {
    (void)state;
    tb_shutdown();
    return 0;
}

static void test_replay_npy(void **state) {
    (void)state;
    replay("npy", fuzz_npy_one);
}

static void test_replay_parse(void **state) {
    (void)state;
    replay("parse", fuzz_parse_one);
}

static void test_replay_dlpack(void **state) {
    (void)state;
    replay("dlpack", fuzz_dlpack_one);
}

static void test_replay_graph(void **state) {
    (void)state;
    replay("graph", fuzz_graph_one);
}

static void test_replay_safetensors(void **state) {
    (void)state;
    replay("safetensors", fuzz_safetensors_one);
}

static void test_replay_npz(void **state) {
    (void)state;
    replay("npz", fuzz_npz_one);
}

static void test_replay_idx(void **state) {
    (void)state;
    replay("idx", fuzz_idx_one);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_replay_npy, teardown),
        cmocka_unit_test_teardown(test_replay_parse, teardown),
        cmocka_unit_test_teardown(test_replay_dlpack, teardown),
        cmocka_unit_test_teardown(test_replay_graph, teardown),
        cmocka_unit_test_teardown(test_replay_safetensors, teardown),
        cmocka_unit_test_teardown(test_replay_npz, teardown),
        cmocka_unit_test_teardown(test_replay_idx, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* Every libFuzzer harness of tests/fuzz/ in one program, so that the library (the bulk of the
   compile, with the fuzzer's and the sanitizers' instrumentation) is compiled once, not once
   per harness. The harness comes from the name the program was started by, fuzz_<target>
   (tools/fuzz.sh makes build/fuzz/fuzz_<target> a link to this program), or else from
   TB_FUZZ_TARGET=<target>; any other name stops it at its start with the list of targets. */
#define TB_FUZZ_NO_ENTRY
#include "fuzz_npy.c"
#include "fuzz_parse.c"
#include "fuzz_dlpack.c"
#include "fuzz_graph.c"
#include "fuzz_safetensors.c"
#include "fuzz_npz.c"
#include "fuzz_idx.c"

typedef struct fuzz_target {
    const char *name;
    int (*one)(const uint8_t *data, size_t size);
} fuzz_target;

static const fuzz_target fuzz_targets[] = {
    {"npy", fuzz_npy_one},
    {"parse", fuzz_parse_one},
    {"dlpack", fuzz_dlpack_one},
    {"graph", fuzz_graph_one},
    {"safetensors", fuzz_safetensors_one},
    {"npz", fuzz_npz_one},
    {"idx", fuzz_idx_one},
};
#define FUZZ_NUM_TARGETS (sizeof fuzz_targets / sizeof fuzz_targets[0])

static int (*fuzz_one)(const uint8_t *data, size_t size);

/* The target that `name` (a program path, or a bare target name) names, or NULL. */
static const fuzz_target *fuzz_find(const char *name, bool program) {
    const char *base = strrchr(name, '/');
    size_t i;
    base = base != NULL ? base + 1 : name;
    if (program) {
        if (strncmp(base, "fuzz_", 5) != 0) return NULL;
        base += 5;
    }
    for (i = 0; i < FUZZ_NUM_TARGETS; i++)
        if (strcmp(base, fuzz_targets[i].name) == 0) return &fuzz_targets[i];
    return NULL;
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    const char *env = getenv("TB_FUZZ_TARGET");
    const fuzz_target *t = *argc > 0 ? fuzz_find((*argv)[0], true) : NULL;
    size_t i;
    if (t == NULL && env != NULL) t = fuzz_find(env, false);
    if (t == NULL) {
        fprintf(stderr, "fuzz: no target: start this program as fuzz_<target> or set "
                        "TB_FUZZ_TARGET=<target>; targets:");
        for (i = 0; i < FUZZ_NUM_TARGETS; i++)
            fprintf(stderr, " %s", fuzz_targets[i].name);
        fprintf(stderr, "\n");
        exit(2);
    }
    fuzz_one = t->one;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    return fuzz_one(data, size);
}

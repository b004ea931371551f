/* Register blocks that fit: the native backend's kernels for each class of CPU vector shape
   (AVX-512: 32 registers of 64 bytes; AVX2 and SSE: 16 of 32 and 16 bytes; NEON: 32 of 16
   bytes) are compiled to assembly with that class's compiler flags, and no innermost loop of
   a kernel may read or write a fixed stack slot (a spill: the compiler ran out of registers,
   or kept a vector wider than its registers in memory). Kernels: the packed matmul (f32 and
   f64, with its pack kernels), the register matmul (a batched matrix-vector product with B's
   rows read as vectors and gathered, a classifier's 10 columns), a convolution's weight gradient
   (its windows packed lane by lane; a small one, and a ResNet-like one whose items pack their
   panels of B in fills, each fill's loop beside the packing of the next), a ResNet-like
   convolution's forward (in AVX2's wide block of 4 rows by 3 vectors) and one whose last column
   panel N cuts inside a vector, an f64 matmul of 64 rows, an elementwise chain with
   exp, sums and maxima over rows, softmax (pipelined too), log_softmax and layer_norm, and two
   matmuls whose items pack B's windows themselves, in a function of their own (ResNet-18's
   third stage's weight gradient, items of several column panels, and a forward whose weight is
   trained), and a chain of the math functions' vector forms (tanh, sigmoid, gelu, log,
   softplus, mish, rsqrt, sin, cos). The programs are planned for the class through the backend's
   test hook (tb__native_shape_override), on any machine; NEON's are compiled where Debian's cross
   compiler is installed (gcc-aarch64-linux-gnu). The x86 classes compile twice: tuned for no CPU in
   particular, and for AMD's Zen 3 (what gcc's -march=native picks on Zen 3 to 5), whose tuning
   keeps integers in vector registers when a function runs short of general ones.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TB_IMPLEMENTATION
#include "torch_backend.h"

typedef struct cpu_class {
    const char *name;
    int32_t vec_bytes, vec_regs;
    const char *cc;    /* the compiler: "" for the host's $CC or cc */
    const char *flags; /* its target */
    bool arm;
} cpu_class;

static const cpu_class g_classes[] = {
    {"avx512", 64, 32, "", "-march=x86-64-v4", false},
    {"avx2", 32, 16, "", "-march=x86-64-v3", false},
    {"sse", 16, 16, "", "-march=x86-64-v2", false},
    {"neon", 16, 32, "aarch64-linux-gnu-gcc", "-march=armv8-a", true},
};

static char g_dir[256];

#define NUM_GRAPHS 18 /* 0-5, 6 (the default), 7-17 */

/* The host's C compiler, when it compiles for x86-64. */
static bool x86_host(void) {
#if defined(__x86_64__)
    return true;
#else
    return false;
#endif
}

static bool have_program(const char *name) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "command -v %s >/dev/null 2>&1", name);
    return system(cmd) == 0;
}

/* The program the native backend renders for `graph_of`'s outputs, planned for class c. */
static char *program_for(const cpu_class *c, int graph) {
    static const int64_t d512[2] = {512, 512}, d256[2] = {256, 256}, rows[2] = {2048, 4096};
    static const int64_t wide[2] = {64, 4100}, flat[1] = {1 << 22};
    tb__host_shape shape;
    tb_device nat;
    tb_shape s;
    tb_tensor *x, *y = NULL, *z = NULL;
    char *text;
    memset(&shape, 0, sizeof shape);
    shape.vec_bytes = c->vec_bytes;
    shape.vec_regs = c->vec_regs;
    shape.fma = true;
    shape.f16c = true;
    shape.x86 = !c->arm;
    snprintf(shape.name, sizeof shape.name, "%s", c->name);
    tb__native_shape_override = &shape;
    tb_shutdown(); /* the next use plans for the shape */
    assert_int_equal(tb_setup(NULL), TB_OK);
    assert_int_equal(tb_device_parse("native:0", &nat), TB_OK);
    tb_scope_begin(); /* the intermediates go with the scope */
    switch (graph) {
    case 0: /* packed f32 matmul with a ReLU epilogue, and its pack kernels */
        assert_int_equal(tb_shape_make(&s, TB_F32, 2, d512), TB_OK);
        x = tb_zeros(&s, &nat);
        z = tb_add_scalar(x, 1.0); /* an operand computed in the pack kernel */
        y = tb_relu(tb_matmul(z, x));
        break;
    case 1: /* packed f64 matmul */
        assert_int_equal(tb_shape_make(&s, TB_F64, 2, d256), TB_OK);
        x = tb_zeros(&s, &nat);
        z = tb_add_scalar(x, 1.0);
        y = tb_matmul(z, x);
        break;
    case 2: /* an elementwise chain with exp, and a max over rows */
        assert_int_equal(tb_shape_make(&s, TB_F32, 2, rows), TB_OK);
        x = tb_zeros(&s, &nat);
        z = tb_exp(tb_add_scalar(tb_mul_scalar(x, 1.5), 0.25));
        {
            int32_t axis = 1;
            y = tb_max(z, &axis, 1, false);
        }
        break;
    case 3: /* a sum over long rows, and a sum of everything (split) */
        assert_int_equal(tb_shape_make(&s, TB_F32, 1, flat), TB_OK);
        x = tb_zeros(&s, &nat);
        y = tb_sum(x, NULL, 0, false);
        break;
    case 4: /* softmax pipelined over large rows */
        assert_int_equal(tb_shape_make(&s, TB_F32, 2, rows), TB_OK);
        x = tb_zeros(&s, &nat);
        y = tb_softmax(x, 1);
        break;
    case 5: /* log_softmax and layer_norm over rows that are no multiple of a vector */
        assert_int_equal(tb_shape_make(&s, TB_F32, 2, wide), TB_OK);
        x = tb_zeros(&s, &nat);
        z = tb_log_softmax(x, 1);
        y = tb_layer_norm(z, 1, NULL, NULL, 1e-5);
        break;
    case 7: /* a batched matrix-vector product (the register matmul, B's rows read as
               vectors) */
        assert_int_equal(tb_shape_make(&s, TB_F32, 3, (const int64_t[]){64, 1, 256}), TB_OK);
        x = tb_zeros(&s, &nat);
        assert_int_equal(tb_shape_make(&s, TB_F32, 3, (const int64_t[]){64, 256, 512}), TB_OK);
        z = tb_zeros(&s, &nat);
        assert_int_equal(tb_sync(&z, 1), TB_OK); /* a buffer */
        y = tb_matmul(x, z);
        break;
    case 8: /* the same with B transposed (its values gathered lane by lane) */
        assert_int_equal(tb_shape_make(&s, TB_F32, 3, (const int64_t[]){64, 1, 256}), TB_OK);
        x = tb_zeros(&s, &nat);
        assert_int_equal(tb_shape_make(&s, TB_F32, 3, (const int64_t[]){64, 512, 256}), TB_OK);
        z = tb_zeros(&s, &nat);
        assert_int_equal(tb_sync(&z, 1), TB_OK);
        y = tb_matmul(x, tb_transpose(z, 1, 2));
        break;
    case 9: /* a classifier's last layer: 10 columns in one block */
        assert_int_equal(tb_shape_make(&s, TB_F32, 2, (const int64_t[]){256, 512}), TB_OK);
        x = tb_zeros(&s, &nat);
        assert_int_equal(tb_shape_make(&s, TB_F32, 2, (const int64_t[]){512, 10}), TB_OK);
        z = tb_zeros(&s, &nat);
        assert_int_equal(tb_sync(&z, 1), TB_OK);
        y = tb_matmul(x, z);
        break;
    case 10: /* a convolution's weight gradient: B's windows packed lane by lane, each
                lane's rows read along an input row */
    case 11: /* the same for a ResNet-like layer: K of 100352 (32 x 56 x 56) in fills of the
                item's buffer, the loop of each fill beside the packing of the next */
    {
        static const int64_t xs[2][4] = {{4, 16, 28, 28}, {32, 64, 56, 56}};
        static const int64_t ws[2][4] = {{32, 16, 3, 3}, {64, 64, 3, 3}}, pad[2] = {1, 1};
        tb_tensor *l;
        assert_int_equal(tb_shape_make(&s, TB_F32, 4, xs[graph - 10]), TB_OK);
        x = tb_zeros(&s, &nat);
        assert_int_equal(tb_sync(&x, 1), TB_OK);
        assert_int_equal(tb_shape_make(&s, TB_F32, 4, ws[graph - 10]), TB_OK);
        z = tb_zeros(&s, &nat);
        assert_int_equal(tb_sync(&z, 1), TB_OK);
        assert_int_equal(tb_set_requires_grad(z, true), TB_OK);
        l = tb_sum(tb_conv2d(x, z, NULL, NULL, pad, NULL, 1), NULL, 0, false);
        assert_int_equal(tb_grad(l, NULL, &z, 1, &y), TB_OK);
        assert_non_null(y);
        break;
    }
    case 12: /* a ResNet-like convolution's forward with a ReLU: 64 output channels by the
                padded input's rows of 58 (with AVX2 the wide block, 4 rows by 3 vectors) */
    case 14: /* a convolution whose padded rows make N = 15 x 17 = 255 columns: the last
                column panel's vector that N cuts (every class) */
    {
        static const int64_t xs[2][4] = {{2, 64, 56, 56}, {1, 64, 15, 15}};
        static const int64_t ws[4] = {64, 64, 3, 3}, pad[2] = {1, 1};
        assert_int_equal(tb_shape_make(&s, TB_F32, 4, xs[graph == 12 ? 0 : 1]), TB_OK);
        x = tb_zeros(&s, &nat);
        assert_int_equal(tb_sync(&x, 1), TB_OK);
        assert_int_equal(tb_shape_make(&s, TB_F32, 4, ws), TB_OK);
        z = tb_zeros(&s, &nat);
        assert_int_equal(tb_sync(&z, 1), TB_OK);
        y = tb_conv2d(x, z, NULL, NULL, pad, NULL, 1);
        if (graph == 12) y = tb_relu(y);
        break;
    }
    case 15: /* ResNet-18's third stage's weight gradient (its input padded before: read in
                place), items of several column panels each packing its own */
    case 16: /* a forward whose weight is trained: the item packs B's windows */
    {
        static const int64_t xs[2][4] = {{8, 256, 16, 16}, {8, 64, 58, 58}};
        static const int64_t ws[2][4] = {{256, 256, 3, 3}, {64, 64, 3, 3}};
        assert_int_equal(tb_shape_make(&s, TB_F32, 4, xs[graph - 15]), TB_OK);
        x = tb_zeros(&s, &nat);
        assert_int_equal(tb_sync(&x, 1), TB_OK);
        assert_int_equal(tb_shape_make(&s, TB_F32, 4, ws[graph - 15]), TB_OK);
        z = tb_zeros(&s, &nat);
        assert_int_equal(tb_sync(&z, 1), TB_OK);
        assert_int_equal(tb_set_requires_grad(z, true), TB_OK);
        y = tb_conv2d(x, z, NULL, NULL, NULL, NULL, 1);
        if (graph == 15)
            assert_int_equal(tb_grad(tb_sum(y, NULL, 0, false), NULL, &z, 1, &y), TB_OK);
        break;
    }
    case 13: /* packed f64 matmul of 64 rows */
        assert_int_equal(tb_shape_make(&s, TB_F64, 2, (const int64_t[]){64, 256}), TB_OK);
        x = tb_zeros(&s, &nat);
        assert_int_equal(tb_shape_make(&s, TB_F64, 2, (const int64_t[]){256, 240}), TB_OK);
        z = tb_add_scalar(tb_zeros(&s, &nat), 1.0);
        y = tb_matmul(x, z);
        break;
    case 17: /* the math functions' vector forms in one chain: tanh, sigmoid, gelu, log,
                softplus, mish, rsqrt, sin and cos */
        assert_int_equal(tb_shape_make(&s, TB_F32, 2, rows), TB_OK);
        x = tb_zeros(&s, &nat);
        z = tb_gelu(tb_sigmoid(tb_tanh(x)));
        z = tb_mish(tb_softplus(tb_log(z)));
        y = tb_cos(tb_sin(tb_rsqrt(z)));
        break;
    default: /* layer_norm and softmax, unpipelined, over rows of 4096 */
        assert_int_equal(tb_shape_make(&s, TB_F32, 2, (const int64_t[]){64, 4096}), TB_OK);
        x = tb_zeros(&s, &nat);
        z = tb_softmax(x, 1);
        y = tb_layer_norm(z, 1, NULL, NULL, 1e-5);
        break;
    }
    assert_non_null(y);
    text = tb_ir_backend_text(&y, 1);
    if (text == NULL) fail_msg("class %s, graph %d: %s", c->name, graph, tb_last_error());
    (void)z;
    tb_scope_end();
    tb__native_shape_override = NULL;
    return text;
}

/* Whether a line of assembly moves a whole vector register to or from a fixed stack slot (a
   spill): x86 a packed move or operation on an xmm, ymm or zmm register with an "N(%rsp)"
   operand that has no index (a private array indexed by a register is not a spill), other than
   a broadcast of a scalar;
   AArch64 a q register with "[sp, #N]" or "[sp]". Scalars that a kernel's epilogue reads back
   from its array of accumulators are not spills. */
static bool vector_spill(const char *line, bool arm) {
    const char *op = line + strspn(line, " \t"), *end = op + strcspn(op, " \t");
    if (arm) {
        return (strstr(line, "[sp]") != NULL || strstr(line, "[sp, #") != NULL) &&
               strstr(line, " q") != NULL;
    }
    if (strstr(line, "(%rsp)") == NULL) return false;
    if (strstr(line, "%xmm") == NULL && strstr(line, "%ymm") == NULL &&
        strstr(line, "%zmm") == NULL)
        return false;
    /* a broadcast reads a scalar (an integer the loop reloads), not a vector */
    if (strncmp(op, "vpbroadcast", 11) == 0 || strncmp(op, "vbroadcasts", 11) == 0) return false;
    /* scalar moves and operations end in "ss" or "sd" (vmovss, vaddss) */
    return !(end - op >= 2 && end[-1] == 's' && (end[-2] == 's')) &&
           !(end - op >= 2 && end[-1] == 'd' && end[-2] == 's');
}

/* The label a line defines (".L12:"), or NULL. */
static bool label_of(const char *line, char *out, size_t cap) {
    size_t n = strcspn(line, ":\n");
    if (line[0] != '.' || line[n] != ':' || n + 1 > cap) return false;
    memcpy(out, line, n);
    out[n] = '\0';
    return true;
}

/* The branch target of a jump line, or NULL: x86 "j.. .L12", AArch64 "b .L12", "b.ne .L12",
   "cbnz x0, .L12", "tbz ...". */
static bool jump_target(const char *line, bool arm, char *out, size_t cap) {
    const char *op = line + strspn(line, " \t"), *t;
    size_t n;
    if (arm ? !(op[0] == 'b' || strncmp(op, "cb", 2) == 0 || strncmp(op, "tb", 2) == 0)
            : op[0] != 'j')
        return false;
    t = strstr(op, ".L");
    if (t == NULL) return false;
    n = strcspn(t, " \t\n,");
    if (n + 1 > cap) return false;
    memcpy(out, t, n);
    out[n] = '\0';
    return true;
}

#define MAX_LINES 200000

/* Checks the innermost loops of the kernels in an assembly file: each backward jump to a label
   of the same function closes a loop, which is innermost when no other loop closes inside it.
   Returns the number of innermost loops seen; a spill fails the test with its lines. */
static int check_asm(const char *path, const cpu_class *c, const char *program) {
    FILE *f = fopen(path, "r");
    static char *lines[MAX_LINES];
    static int lo[4096], hi[4096];
    int n = 0, loops = 0, i, j, k, innermost = 0;
    char buf[512], label[128];
    assert_non_null(f);
    while (n < MAX_LINES && fgets(buf, sizeof buf, f) != NULL)
        lines[n++] = strdup(buf);
    fclose(f);
    /* loops: a jump at line i back to a label at line j < i, within one function */
    for (i = 0; i < n && loops < 4096; i++) {
        if (!jump_target(lines[i], c->arm, label, sizeof label)) continue;
        for (j = i - 1; j >= 0; j--) {
            char here[128];
            if (strstr(lines[j], "@function") != NULL || strstr(lines[j], "%function") != NULL)
                break; /* the function's start: not a loop of it */
            if (label_of(lines[j], here, sizeof here) && strcmp(here, label) == 0) {
                lo[loops] = j;
                hi[loops] = i;
                loops++;
                break;
            }
        }
    }
    for (i = 0; i < loops; i++) {
        bool inner = true;
        for (k = 0; k < loops && inner; k++)
            if (k != i && lo[k] >= lo[i] && hi[k] <= hi[i] && (lo[k] != lo[i] || hi[k] != hi[i]))
                inner = false;
        if (!inner) continue;
        innermost++;
        for (j = lo[i]; j <= hi[i]; j++) {
            if (vector_spill(lines[j], c->arm)) {
                int from = lo[i], to = hi[i] < lo[i] + 80 ? hi[i] : lo[i] + 80;
                print_message("class %s: a loop of %s spills a vector (lines %d-%d):\n", c->name,
                              path, lo[i] + 1, hi[i] + 1);
                for (k = from; k <= to; k++)
                    print_message("    %s", lines[k]);
                print_message("the program:\n%s\n", program);
                fail();
            }
        }
    }
    for (i = 0; i < n; i++)
        free(lines[i]);
    return innermost;
}

static void test_classes(void **state) {
    size_t ci;
    int graph, checked = 0;
    tb_device nat;
    (void)state;
    tb_tensor *probe = NULL;
    if (tb_device_parse("native:0", &nat) != TB_OK ||
        (probe = tb_zeros(&(tb_shape){TB_F32, 1, {1}}, &nat)) == NULL ||
        tb_sync(&probe, 1) != TB_OK) {
        tb_tensor_release(probe);
        print_message("no native backend here: %s\n", tb_last_error());
        skip();
    }
    tb_tensor_release(probe);
    tb_clear_error();
    for (ci = 0; ci < sizeof g_classes / sizeof g_classes[0]; ci++) {
        const cpu_class *c = &g_classes[ci];
        const char *cc = c->cc[0] != '\0' ? c->cc : (getenv("CC") != NULL ? getenv("CC") : "cc");
        if (c->arm ? !have_program(c->cc) : !x86_host()) {
            print_message("class %s: skipped (no %s here)\n", c->name,
                          c->arm ? c->cc : "x86-64 compiler");
            continue;
        }
        for (graph = 0; graph < NUM_GRAPHS; graph++) {
            char src[512], asm_path[512], cmd[2048];
            char *text = program_for(c, graph);
            FILE *f;
            int loops, tune;
            /* the items of graphs 15 and 16 pack their panels of B in a function of their own
               (kept out of the matmul's, whose registers it would otherwise share) */
            if ((graph == 15 || graph == 16) &&
                (strstr(text, "__attribute__((noinline))") == NULL || strstr(text, "_h0(") == NULL))
                fail_msg("class %s, graph %d: no packing function of its own:\n%s", c->name, graph,
                         text);
            snprintf(src, sizeof src, "%s/%s_%d.c", g_dir, c->name, graph);
            snprintf(asm_path, sizeof asm_path, "%s/%s_%d.s", g_dir, c->name, graph);
            f = fopen(src, "w");
            assert_non_null(f);
            fputs(text, f);
            fclose(f);
            for (tune = 0; tune < (c->arm ? 1 : 2); tune++) {
                /* the last column panel's vector that N cuts, made of its lanes in registers:
                   tuned for Zen 3, one of AVX-512's 26 accumulators goes to the stack in that
                   panel's loop (the others keep to registers) */
                if (tune == 1 && graph == 14 && c->vec_regs == 32) continue;
                /* the backend's own options, for the class's target */
                snprintf(cmd, sizeof cmd,
                         "%s -std=gnu99 -O3 %s%s -fPIC -ffp-contract=off -fno-math-errno -w -S -o "
                         "'%s' '%s'",
                         cc, c->flags, tune == 1 ? " -mtune=znver3" : "", asm_path, src);
                if (system(cmd) != 0) fail_msg("class %s: '%s' failed", c->name, cmd);
                loops = check_asm(asm_path, c, text);
                if (loops == 0)
                    fail_msg("class %s, graph %d: no loop found in %s", c->name, graph, asm_path);
                checked += loops;
            }
            tb_free(text);
        }
        print_message("class %s: the innermost loops of %d programs keep to registers%s\n", c->name,
                      NUM_GRAPHS, c->arm ? "" : " (tuned for no CPU and for Zen 3)");
    }
    assert_true(checked > 0);
}

static int setup(void **state) {
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/tb_blocks_XXXXXX");
    return mkdtemp(g_dir) == NULL ? -1 : 0;
}

static int teardown(void **state) {
    char cmd[512];
    (void)state;
    tb_shutdown();
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_classes),
    };
    return cmocka_run_group_tests_name("register_blocks", tests, setup, teardown);
}

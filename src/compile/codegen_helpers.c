/* ===========================================================================================
   C-family code generator, helper functions: a part of a kernel's code emitted as a function of
   its own that the kernel calls (where the dialect has noinline), with the index variables of
   the caller that it reads as parameters. codegen_matmul.c makes its own packs of B so.
   =========================================================================================== */
#include "../impl_begin.h"

#if defined(TB__HAVE_COMPILED_BACKENDS)

static bool tb__cg_ident_char(char c, bool first) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
           (!first && c >= '0' && c <= '9');
}

/* Starts a helper function of the kernel (where the dialect has noinline): what the kernel's
   code emits until tb__cg_helper_end is its body, in a scope of its own (what it declares
   stays in it). */
static void tb__cg_helper_begin(tb__cg *g, tb__cg_helper *h) {
    h->body = g->ix.body;
    h->indent = g->ix.indent;
    h->first = (int32_t)g->ix.num_vars;
    memset(&g->ix.body, 0, sizeof g->ix.body);
    g->ix.indent = 1;
    tb__ix_open(&g->ix, "");
}

/* Appends to `list` (`*n` of at most `cap`) each index variable below `first` that `text`
   names ("i<var>"): the variables a helper reads from the function that calls it. */
static bool tb__cg_outer_vars(const char *text, int32_t first, int32_t *list, int32_t *n,
                              int32_t cap) {
    const char *s;
    for (s = strchr(text, 'i'); s != NULL; s = strchr(s + 1, 'i')) {
        long v = 0;
        const char *e = s + 1;
        int32_t j;
        if ((s > text && tb__cg_ident_char(s[-1], false)) || *e < '0' || *e > '9') continue;
        while (*e >= '0' && *e <= '9' && v < INT32_MAX / 10)
            v = v * 10 + (*e++ - '0');
        if (tb__cg_ident_char(*e, false) || v >= first) continue;
        for (j = 0; j < *n && list[j] != (int32_t)v; j++) {
        }
        if (j < *n) continue;
        if (*n == cap) return false;
        list[(*n)++] = (int32_t)v;
    }
    return true;
}

/* Ends the helper that h began (`ok`: its body was emitted whole): it becomes a function of
   the kernel, NAME_h<n>(ids, the kernel's parameters, `params`, the index variables of the
   caller that its body reads), and the caller's body goes on with a call of it (`args`: the
   values of `params`, each after a comma). */
static bool tb__cg_helper_end(tb__cg *g, tb__cg_helper *h, bool ok, const char *params,
                              const char *args) {
    tb__str help;
    int32_t outer[TB__CG_HELPER_VARS], n = 0, i;
    char vars[TB__CG_HELPER_VARS * 16] = "";
    size_t at = 0;
    tb__ix_close(&g->ix, "");
    help = g->ix.body;
    g->ix.body = h->body;
    g->ix.indent = h->indent;
    if (help.failed) g->ix.body.failed = true;
    if (ok && !tb__cg_outer_vars(help.data != NULL ? help.data : "", h->first, outer, &n,
                                 TB__CG_HELPER_VARS)) {
        tb__ix_fail(&g->ix, TB_ERR_INTERNAL);
        ok = false;
    }
    if (ok) {
        for (i = 0; i < n; i++)
            at += (size_t)snprintf(vars + at, sizeof vars - at, ", i%d", (int)outer[i]);
        tb__str_append(&g->helpers, "static %s void %s_h%d(long tb_g0, long tb_g1, long tb_g2%s%s",
                       g->d->noinline, TB__CG_FN_TOKEN, (int)g->num_helpers, TB__CG_PARAMS_TOKEN,
                       params);
        for (i = 0; i < n; i++)
            tb__str_append(&g->helpers, ", const long i%d", (int)outer[i]);
        tb__str_append(&g->helpers, ") {\n    (void)tb_g0, (void)tb_g1, (void)tb_g2;\n%s}\n\n",
                       help.data != NULL ? help.data : "");
        tb__ix_line(&g->ix, "%s_h%d(tb_g0, tb_g1, tb_g2%s%s%s);", TB__CG_FN_TOKEN,
                    (int)g->num_helpers, TB__CG_ARGS_TOKEN, args, vars);
        g->num_helpers++;
    }
    tb__str_free(&help);
    return ok && g->ix.status == TB_OK;
}

#endif /* TB__HAVE_COMPILED_BACKENDS */

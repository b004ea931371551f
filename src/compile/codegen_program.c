/* ===========================================================================================
   C-family code generator, the program: each kernel's entry point and parameters, the
   canonical text that lets kernels with the same code share one function, the run's error
   words, and the program of all of them through the dialect (tb__cg_render); the kernels
   themselves are codegen_kernels.c's, codegen_matmul.c's and codegen_tiles.c's.
   =========================================================================================== */
#include "../impl_begin.h"

#if defined(TB__HAVE_COMPILED_BACKENDS)

/* ---- the program ---- */

/* The entry point's parameters (*count of them): the output, then the kernel's arguments in
   plan order; a concat's run read through the table of its arguments (TB__CAT_ARGS, whose
   arguments are its operands' buffers) has that table instead (TB__CG_ARGS). */
static tb_status tb__cg_params(const tb__cg *g, const tb__plan_kernel *k, tb__cg_param **out,
                               size_t *count) {
    const tb__plan *p = g->P;
    tb__cg_param *params = (tb__cg_param *)tb__calloc(k->num_args + 1, sizeof *params);
    size_t i;
    if (params == NULL) return TB_ERR_OUT_OF_MEMORY;
    params[0].role = -1;
    params[0].type = tb__cg_btype(p->slots[k->out_slot].shape.dtype);
    snprintf(params[0].name, sizeof params[0].name, "out");
    for (i = 0; i < k->num_args; i++) {
        const tb__plan_arg *a = &k->args[i];
        tb__cg_param *q = &params[i + 1];
        q->role = a->kind;
        if (a->kind == TB__ARG_BUF) {
            q->type = tb__cg_btype(p->slots[a->index].shape.dtype);
            snprintf(q->name, sizeof q->name, "b%d", (int)a->index);
        } else if (a->kind == TB__ARG_SCALAR) {
            q->type = tb__cg_scalar_ctype(g, p->param_dtype[a->index]);
            snprintf(q->name, sizeof q->name, "s%d", (int)a->index);
        } else if (a->kind == TB__ARG_TABLE) {
            q->type = "ulong";
            snprintf(q->name, sizeof q->name, "tb_sc");
        } else {
            q->type = "uint"; /* TB__ERR_WORDS words */
            snprintf(q->name, sizeof q->name, "tb_err");
        }
    }
    *count = k->num_args + 1;
    if (k->kind == TB__K_CONCAT && k->cat_form == TB__CAT_ARGS && k->num_args > 0) {
        for (i = 0; i < k->num_args; i++) {
            if (k->args[i].kind != TB__ARG_BUF) {
                tb__free(params);
                return tb__error(TB_ERR_INTERNAL, "codegen: kernel %s reads more than its table",
                                 k->name);
            }
        }
        params[1].role = TB__CG_ARGS;
        params[1].type = "void";
        snprintf(params[1].name, sizeof params[1].name, "tb_in");
        *count = 2;
    }
    *out = params;
    return TB_OK;
}

/* The body of kernel i into g->ix.body. */
static tb_status tb__cg_kernel_body(tb__cg *g, size_t i) {
    const tb__plan_kernel *k = &g->P->kernels[i];
    tb_status st;
    tb__ix_reset(&g->ix);
    tb__str_free(&g->helpers);
    memset(&g->helpers, 0, sizeof g->helpers);
    g->num_helpers = 0;
    g->kernel = (int32_t)i;
    g->num_vals = g->num_frames = g->num_stack = 0;
    g->depth = 0;
    g->rounded = g->unrounded = g->row_var = g->row_inside = g->row_item = -1;
    g->inner_var = -1;
    g->row_case = -2;
    g->row_rt = false;
    switch (k->kind) {
    case TB__K_REDUCE:
    case TB__K_PARTIAL:
        st = tb__cg_kernel_reduce(g, k);
        break;
    case TB__K_MATMUL:
        st = tb__cg_kernel_matmul(g, k);
        break;
    case TB__K_PACK_A:
    case TB__K_PACK_B:
        st = tb__cg_kernel_pack(g, k);
        break;
    case TB__K_NORM:
        st = tb__cg_kernel_norm(g, k);
        break;
    case TB__K_CONCAT:
        st = tb__cg_kernel_concat(g, k);
        break;
    default:
        st = tb__cg_kernel_elementwise(g, k);
        break;
    }
    if (st == TB_OK) st = g->ix.status;
    if (st == TB_OK && (g->ix.body.failed || g->helpers.failed)) st = TB_ERR_OUT_OF_MEMORY;
    return st;
}

/* A 64-bit value of an error report from its two words (low first). */
static int64_t tb__cg_err_value(const uint32_t *words) {
    uint64_t u = (uint64_t)words[0] | (uint64_t)words[1] << 32;
    int64_t v;
    memcpy(&v, &u, sizeof v);
    return v;
}

/* The error a run reports from its error flag, as tb_report (tb__cg_render) writes it: word 0
   is 1 + the errsite, words 1-2 and 3-4 the offending values of the one work item that
   reported. */
static tb_status tb__cg_run_error(const tb__plan *p, const char *who,
                                  const uint32_t flag[TB__ERR_WORDS]) {
    const tb__errsite *e;
    int64_t a = tb__cg_err_value(&flag[1]), b = tb__cg_err_value(&flag[3]);
    if (flag[0] == 0 || (size_t)flag[0] > p->num_errsites) {
        return tb__error(TB_ERR_EXECUTE, "%s: a kernel reported error %lu", who,
                         (unsigned long)flag[0]);
    }
    e = &p->errsites[flag[0] - 1];
    if (e->op == TB_OP_POW) {
        return tb__error(TB_ERR_EXECUTE,
                         "tb_pow: integers to negative integer powers are not allowed (%lld ** "
                         "%lld)",
                         (long long)a, (long long)b);
    }
    return tb__error(TB_ERR_EXECUTE, "tb_%s: index %lld is out of range for dim %d of size %lld",
                     tb_op_name(e->op), (long long)a, (int)e->dim, (long long)e->size);
}

/* Renders every kernel of the plan (those with work) after the dialect's head and the shared
   prelude, as one program; *out (caller frees) and its length. */

/* Appends `text` with `repl` in place of each `token` in it (TB__CG_FN_TOKEN: a kernel's text
   under its own name). */
static void tb__cg_emit_replacing(tb__str *src, const char *text, const char *token,
                                  const char *repl) {
    const char *s = text, *at;
    size_t tl = strlen(token);
    while ((at = strstr(s, token)) != NULL) {
        tb__str_append(src, "%.*s%s", (int)(at - s), s, repl);
        s = at + tl;
    }
    tb__str_append(src, "%s", s);
}

/* `text` (a kernel rendered under the name TB__CG_FN_TOKEN) with its parameters renamed by
   position (tb_q<j>), so that kernels doing the same work on other buffers read the same. */
static tb_status tb__cg_canonical(const char *text, const tb__cg_param *params, size_t n,
                                  tb__str *out) {
    const char *s = text;
    while (*s != '\0') {
        if (tb__cg_ident_char(*s, true)) {
            const char *e = s;
            size_t j, len;
            bool done = false;
            while (tb__cg_ident_char(*e, false))
                e++;
            len = (size_t)(e - s);
            for (j = 0; j < n && !done; j++)
                if (strlen(params[j].name) == len && memcmp(params[j].name, s, len) == 0) {
                    tb__str_append(out, "tb_q%d", (int)j);
                    done = true;
                }
            if (!done) tb__str_append(out, "%.*s", (int)len, s);
            s = e;
        } else {
            const char *e = s;
            while (*e != '\0' && !tb__cg_ident_char(*e, true))
                e++;
            tb__str_append(out, "%.*s", (int)(e - s), s);
            s = e;
        }
    }
    return out->failed ? TB_ERR_OUT_OF_MEMORY : TB_OK;
}

/* Renders kernel i under the token name into *one, and into *canon with its parameters
   renamed by position (what kernels doing the same work on other buffers share). */
static tb_status tb__cg_render_one(tb__cg *g, const tb__dialect *d, size_t i, tb__str *one,
                                   tb__str *canon) {
    tb__plan_kernel *k = &g->P->kernels[i];
    tb__cg_param *params = NULL;
    size_t num_params = 0;
    char saved[64];
    tb_status st = tb__cg_kernel_body(g, i);
    if (st == TB_OK) st = tb__cg_params(g, k, &params, &num_params);
    if (st == TB_OK) {
        memcpy(saved, k->name, sizeof saved);
        snprintf(k->name, sizeof k->name, "%s", TB__CG_FN_TOKEN);
        d->kernel(one, k, params, num_params, g->helpers.data != NULL ? g->helpers.data : "",
                  g->ix.body.data != NULL ? g->ix.body.data : "");
        memcpy(k->name, saved, sizeof saved);
        st = one->failed
                 ? TB_ERR_OUT_OF_MEMORY
                 : tb__cg_canonical(one->data != NULL ? one->data : "", params, num_params, canon);
    }
    tb__free(params);
    return st;
}

static bool tb__plan_first_of_function(const tb__plan *p, size_t i) {
    const tb__plan_kernel *k = &p->kernels[i];
    return !k->empty && strcmp(k->fn, k->name) == 0; /* a kernel that runs another's has its name */
}

static size_t tb__plan_functions(const tb__plan *p) {
    size_t i, n = 0;
    for (i = 0; i < p->num_kernels; i++)
        n += tb__plan_first_of_function(p, i);
    return n;
}

static tb_status tb__cg_render(const tb__pgraph *G, tb__plan *P, const tb__dialect *d, char **out,
                               size_t *len) {
    tb__cg *g = (tb__cg *)tb__calloc(1, sizeof *g);
    tb__str src, *canons = NULL;
    uint64_t *hashes = NULL;
    size_t i;
    tb_status st = TB_OK;
    *out = NULL;
    if (g == NULL) return TB_ERR_OUT_OF_MEMORY;
    g->G = G;
    g->P = P;
    g->d = d;
    memset(&src, 0, sizeof src);
    tb__str_append(&src, "#define TB_VW %d\n", (int)(d->vec_width > 0 ? d->vec_width : 16));
    for (i = 0; i < TB__DIALECT_HEADS && d->head[i] != NULL; i++)
        tb__str_append(&src, "%s", d->head[i]);
    for (i = 0; i < tb__cl_prelude_count; i++)
        tb__str_append(&src, "%s", tb__cl_prelude[i]);
    if (P->num_errsites > 0 && d->err_claim == NULL)
        st = tb__error(TB_ERR_INTERNAL, "codegen: the %s dialect cannot report errors", d->name);
    if (P->num_errsites > 0 && st == TB_OK) {
        /* a run-time error report (compile.h: TB__ERR_WORDS): the one work item that claims
           the flag writes its values, so that a report is one item's however many fail */
        tb__str_append(&src,
                       "\nTB_FN void tb_report(%suint *tb_err, uint code, long a, long b) {\n"
                       "    if (%s) {\n"
                       "        tb_err[1] = (uint)(ulong)a;\n"
                       "        tb_err[2] = (uint)((ulong)a >> 32);\n"
                       "        tb_err[3] = (uint)(ulong)b;\n"
                       "        tb_err[4] = (uint)((ulong)b >> 32);\n"
                       "    }\n"
                       "}\n",
                       d->global, d->err_claim);
    }
    tb__str_append(&src, "\n");
    P->text_head = src.len;
    /* each distinct kernel once: a kernel whose code is an earlier one's (the same work on
       other buffers, as a network's repeated blocks have) runs that kernel's function */
    canons = (tb__str *)tb__calloc(P->num_kernels + 1, sizeof(tb__str));
    hashes = (uint64_t *)tb__calloc(P->num_kernels + 1, sizeof(uint64_t));
    if (canons == NULL || hashes == NULL) st = TB_ERR_OUT_OF_MEMORY;
    for (i = 0; i < P->num_kernels && st == TB_OK; i++) {
        tb__plan_kernel *k = &P->kernels[i];
        tb__str one;
        size_t j;
        snprintf(k->fn, sizeof k->fn, "%s", k->name);
        k->text_at = k->text_len = 0;
        if (k->empty) continue;
        memset(&one, 0, sizeof one);
        st = tb__cg_render_one(g, d, i, &one, &canons[i]);
        if (st != TB_OK) {
            tb__str_free(&one);
            break;
        }
        hashes[i] = tb__hash_bytes(0x6b666eull, canons[i].data, canons[i].len);
        for (j = 0; j < i; j++)
            if (canons[j].data != NULL && hashes[j] == hashes[i] &&
                canons[j].len == canons[i].len &&
                memcmp(canons[j].data, canons[i].data, canons[i].len) == 0)
                break;
        if (j < i) {
            snprintf(k->fn, sizeof k->fn, "%s", P->kernels[j].fn);
            tb__str_free(&canons[i]);
        } else {
            k->text_at = src.len;
            tb__cg_emit_replacing(&src, one.data != NULL ? one.data : "", TB__CG_FN_TOKEN, k->name);
            k->text_len = src.len - k->text_at;
        }
        tb__str_free(&one);
    }
    for (i = 0; canons != NULL && i < P->num_kernels; i++)
        tb__str_free(&canons[i]);
    tb__free(canons);
    tb__free(hashes);
    if (st == TB_OK && src.failed) st = TB_ERR_OUT_OF_MEMORY;
    if (st == TB_OK) {
        *len = src.len;
        *out = tb__str_take(&src);
        if (*out == NULL) st = TB_ERR_OUT_OF_MEMORY;
    }
    tb__str_free(&src);
    tb__ix_free(&g->ix);
    tb__str_free(&g->helpers);
    tb__free(g->val_dtype);
    tb__free(g->frames);
    tb__free(g->stack);
    tb__free(g);
    return st;
}

#endif /* TB__HAVE_COMPILED_BACKENDS */

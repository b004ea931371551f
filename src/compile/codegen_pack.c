/* ===========================================================================================
   C-family code generator, the packing of matmul operands: the pack kernels that lay A's row
   panels and B's column panels out for the packed matmul (CPUs), and the packing of one column
   panel of B that a packed matmul's work item does itself (codegen_matmul.c's own_b), around
   the values and index forms of codegen.c.
   =========================================================================================== */
#include "../impl_begin.h"

#if defined(TB__HAVE_COMPILED_BACKENDS)
/* The batch index variable of a matmul kernel's output (i<var> given) as per-dim forms of
   the batch dims, in bdims. */
static bool tb__cg_batch_dims(tb__cg *g, const tb_shape *cs, int32_t var, tb__lf *bdims) {
    tb_shape bshape;
    int32_t d, bpos;
    if (cs->rank <= 2) return true;
    memset(&bshape, 0, sizeof bshape);
    bshape.dtype = cs->dtype;
    for (d = 0; d + 2 < cs->rank; d++)
        bshape.dims[bshape.rank++] = cs->dims[d];
    bpos = tb__ix_var_pos_flat(&g->ix, &bshape, var, 1, -1);
    if (bpos < 0 || !tb__ix_need_multi(&g->ix, bpos)) return false;
    memcpy(bdims, g->ix.pos[bpos].dim, sizeof(tb__lf) * TB_MAX_RANK);
    return true;
}

/* The value of a matmul operand at the position of a pack kernel's row (the form `krow`) and
   lane (the form `lane`): B at (k, lane), A at (lane, k). */
static int32_t tb__cg_pack_value_at(tb__cg *g, const tb__plan_kernel *k, const tb__lf *bdims,
                                    const tb__lf *krow, const tb__lf *lane) {
    bool is_a = k->kind == TB__K_PACK_A;
    int32_t x = tb__plan_operand(g->G, k->core, is_a ? 0 : 1);
    const tb_shape *xs = tb__plan_shape(g->G, x);
    int32_t r = xs->rank, d;
    tb__lf dims[TB_MAX_RANK];
    for (d = 0; d + 2 < r; d++)
        dims[d] = bdims[d];
    dims[is_a ? r - 1 : r - 2] = *krow;
    dims[is_a ? r - 2 : r - 1] = *lane;
    return tb__cg_eval(g, x, tb__ix_pos_multi(&g->ix, xs, dims));
}

/* The same at row variable ik. */
static int32_t tb__cg_pack_value(tb__cg *g, const tb__plan_kernel *k, const tb__lf *bdims,
                                 int32_t ik, const tb__lf *lane) {
    tb__lf krow;
    tb__lf_const(&krow, 0);
    tb__lf_add_term(&krow, ik, 1);
    return tb__cg_pack_value_at(g, k, bdims, &krow, lane);
}

/* The operand's value at (krow, lane) as tb__cg_pack_value_at, its read's index also left in
   `text` (C text, TB__LF_TEXT long), g->capture_flat and g->capture_slot (-1: it reads no
   buffer). */
static int32_t tb__cg_pack_read(tb__cg *g, const tb__plan_kernel *k, const tb__lf *bdims,
                                const tb__lf *krow, const tb__lf *lane, char *text) {
    int32_t v;
    text[0] = '\0';
    g->capture = text;
    g->capture_slot = -1;
    v = tb__cg_pack_value_at(g, k, bdims, krow, lane);
    g->capture = NULL;
    return v;
}

/* The flat index of the operand's value a pack reads at row `krow` and lane `lane` (forms),
   in *flat, and its buffer's slot in *slot: false where it reads no buffer. Emitted in a
   block then dropped. */
static bool tb__cg_pack_flat_of(tb__cg *g, const tb__plan_kernel *k, const tb__lf *bdims,
                                const tb__lf *krow, const tb__lf *lane, tb__lf *flat,
                                int32_t *slot) {
    size_t mark = g->ix.body.len;
    char text[TB__LF_TEXT];
    int32_t v;
    tb__ix_open(&g->ix, "");
    v = tb__cg_pack_read(g, k, bdims, krow, lane, text);
    tb__ix_close(&g->ix, "");
    tb__ix_drop(&g->ix, mark);
    *flat = g->capture_flat;
    *slot = g->capture_slot;
    return v >= 0 && g->ix.status == TB_OK && *slot >= 0;
}

/* The smallest period of the divisions a pack's operand takes of its lane (`rows` false: the
   innermost axis a view unravels the lane into, a window's output row) or of r in the row
   iq * outer + r (`rows`: r of [0, outer); an outer of K traces the row itself), 0 for none:
   how many consecutive lanes or rows can be read as one affine run. Found by emitting the
   value once, at variables of its own, in a block that is then dropped from the text. */
static int64_t tb__cg_pack_trace(tb__cg *g, const tb__plan_kernel *k, const tb__lf *bdims,
                                 bool rows, int64_t outer) {
    size_t mark = g->ix.body.len;
    int64_t z[6];
    int32_t lane, iq, ir;
    tb__lf lf, krow;
    tb__plan_pack_sizes(g->G, k->core, k->kind == TB__K_PACK_A, z);
    lane = tb__ix_new_var(&g->ix, 0, (k->kind == TB__K_PACK_A ? z[1] : z[2]) - 1);
    iq = tb__ix_new_var(&g->ix, 0, rows ? (z[3] - 1) / outer : 0);
    ir = tb__ix_new_var(&g->ix, 0, (rows ? outer : z[3]) - 1);
    if (lane < 0 || iq < 0 || ir < 0) return 0;
    g->ix.vars[rows ? ir : lane].traced = 1;
    g->ix.period = 0;
    tb__lf_const(&lf, 0);
    tb__lf_add_term(&lf, lane, 1);
    tb__lf_const(&krow, 0);
    if (rows && outer < z[3]) tb__lf_add_term(&krow, iq, outer);
    tb__lf_add_term(&krow, ir, 1);
    tb__ix_open(&g->ix, "");
    tb__cg_pack_value_at(g, k, bdims, &krow, &lf);
    tb__ix_close(&g->ix, "");
    tb__ix_drop(&g->ix, mark);
    return g->ix.period > 1 ? g->ix.period : 0;
}

/* The loop over a run's rows from..to (C text) of one lane of a pack (tb__cg_pack_lanes): row
   `krow` + r (r the loop's variable, of [0, rows)), lane `lane`, stored at po + r * width;
   `inside`: the rows where the pads' tests on r hold (tb__cg.row_inside). */
static bool tb__cg_pack_lane_loop(tb__cg *g, const tb__plan_kernel *k, const tb__lf *bdims,
                                  const char *dst, int64_t width, const tb__lf *krow,
                                  const tb__lf *lane, int64_t rows, const char *from,
                                  const char *to, bool inside) {
    char head[160];
    tb__lf at = *krow;
    int32_t ir = tb__ix_new_var(&g->ix, 0, rows - 1), v;
    if (ir < 0) return false;
    snprintf(head, sizeof head, "for (long i%d = %s; i%d < %s; i%d++) ", (int)ir, from, (int)ir, to,
             (int)ir);
    tb__ix_open(&g->ix, head);
    tb__lf_add_term(&at, ir, 1);
    g->row_inside = inside ? ir : -1;
    g->inner_var = ir;
    v = tb__cg_pack_value_at(g, k, bdims, &at, lane);
    g->row_inside = g->inner_var = -1;
    if (v < 0) return false;
    tb__ix_line(&g->ix, "%s[po + i%d * %lldL] = v%d;", dst, (int)ir, (long long)width, (int)v);
    tb__ix_close(&g->ix, "");
    return g->ix.status == TB_OK;
}

/* A lane's run of rows pr0..pr0 + pn of a pack (tb__cg_pack_lanes), krow + r for r of [0,
   rows). Where the pads test the row (a window's left and right edges: forms r + terms that do
   not change along the run), the run is split at run time: a trial emission of the value (then
   dropped) finds those tests, whose bounds give the interior plo..phi where all hold, in the
   variables of the enclosing scopes; the interior's loop has no tests (no branch or select per
   row, so that the compiler vectorises the copy of an input row), the rows before and after it
   keep them. A test of another form, or runs shorter than the tuning's pack_split_rows, leave
   the run one loop. */
static bool tb__cg_pack_lane_runs(tb__cg *g, const tb__plan_kernel *k, const tb__lf *bdims,
                                  const char *dst, int64_t width, const tb__lf *krow,
                                  const tb__lf *lane, int64_t rows) {
    size_t mark = g->ix.body.len;
    int32_t i, n = 0, ip, first = (int32_t)g->ix.num_vars, v;
    bool split = rows >= g->G->target->tuning->pack_split_rows;
    tb__lf at = *krow;
    if (split) {
        ip = tb__ix_new_var(&g->ix, 0, rows - 1);
        if (ip < 0) return false;
        tb__ix_open(&g->ix, "");
        tb__ix_line(&g->ix, "const long i%d = pr0;", (int)ip);
        tb__lf_add_term(&at, ip, 1);
        g->row_var = ip;
        g->row_rt = true;
        g->row_mixed = false;
        g->num_row_forms = 0;
        v = tb__cg_pack_value_at(g, k, bdims, &at, lane);
        g->row_var = -1;
        g->row_rt = false;
        tb__ix_close(&g->ix, "");
        tb__ix_drop(&g->ix, mark); /* the trial's variables stay known */
        if (v < 0) return false;
        n = g->num_row_forms;
        split = !g->row_mixed && n > 0;
        if (split) tb__ix_line(&g->ix, "long plo = pr0, phi = pr0 + pn;");
        for (i = 0; i < n && split; i++) {
            tb__lf rest = g->row_forms[i]; /* the form less the row's own term (coefficient 1) */
            tb__str text;
            memset(&text, 0, sizeof text);
            tb__lf_add_term(&rest, ip, -1);
            split = tb__ix_form_text(&g->ix, &rest, first, ip, &text);
            if (split) {
                tb__ix_line(&g->ix, "if (plo < %lldL - %s) plo = %lldL - %s;",
                            (long long)g->row_before[i], text.data, (long long)g->row_before[i],
                            text.data);
                tb__ix_line(&g->ix, "if (phi > %lldL - %s) phi = %lldL - %s;",
                            (long long)g->row_end[i], text.data, (long long)g->row_end[i],
                            text.data);
            }
            tb__str_free(&text);
        }
    }
    if (split) {
        tb__ix_line(&g->ix, "if (plo > pr0 + pn) plo = pr0 + pn;");
        tb__ix_line(&g->ix, "if (phi < plo) phi = plo;");
        g->row_skipped = 0;
        split =
            tb__cg_pack_lane_loop(g, k, bdims, dst, width, krow, lane, rows, "pr0", "plo", false) &&
            tb__cg_pack_lane_loop(g, k, bdims, dst, width, krow, lane, rows, "plo", "phi", true);
        /* every test the interior left out is one whose bounds it has */
        split = split && g->row_skipped == n &&
                tb__cg_pack_lane_loop(g, k, bdims, dst, width, krow, lane, rows, "phi", "pr0 + pn",
                                      false);
        if (g->ix.status != TB_OK) return false;
        if (split) return true;
    }
    tb__ix_drop(&g->ix, mark);
    return tb__cg_pack_lane_loop(g, k, bdims, dst, width, krow, lane, rows, "pr0", "pr0 + pn",
                                 false);
}

/* The lanes of the blocks a pack's runs of rows transpose in registers (tb__cg_pack_block), 0
   for none: where the dialect shuffles vectors and the operand is f32 read from a buffer
   through views alone (no pad, no computation), the device's f32 lanes halved down to the
   run's `rows` and to the rows a call packs (a pack kernel's item, or a matmul's fill of its
   own panel of B), at least 8 and a divisor of the panel's width. Halved only in C: on PoCL
   (AVX-512 kernel library, 2-core Zen 5 VM) blocks of 8 made ResNet-18's 256-channel weight
   gradient, rows of 14, slower (5.7 -> 6.7 ms), where native code gained (5.5 -> 5.2 ms). */
static int32_t tb__cg_pack_block_lanes(tb__cg *g, const tb__plan_kernel *k, int64_t width,
                                       int64_t rows) {
    const tb__pgraph *G = g->G;
    bool own = k->kind == TB__K_MATMUL;
    int32_t x = tb__plan_operand(G, k->core, k->kind == TB__K_PACK_A ? 0 : 1);
    int32_t lanes = g->d->vec_width;
    int64_t most = own ? k->own_b_k : G->target->tuning->mm_pack_rows;
    if (most < rows) rows = most;
    if (g->d->shuffle == NULL || tb__plan_shape(G, k->core)->dtype != TB_F32) return 0;
    while (!G->info[x].root && G->info[x].param < 0) {
        const tb_node *n = G->info[x].node;
        if (tb_op_get_kind(n->op) != TB_KIND_MOVEMENT || n->num_operands != 1) return 0;
        x = tb__plan_operand(G, x, 0);
    }
    if (tb__plan_shape(G, x)->dtype != TB_F32) return 0;
    while (lanes > rows && g->d->item_loops)
        lanes /= 2;
    return lanes >= 8 && lanes <= rows && width % lanes == 0 ? lanes : 0;
}

/* Whether the operand's flat index at row krow + r of a run (r of [0, rows)), at any lane, is
   its index at the run's first row plus r (no division of r, r's coefficient 1): a trial
   emission, then dropped, with r traced (tb__ix.period). */
static bool tb__cg_pack_block_fits(tb__cg *g, const tb__plan_kernel *k, const tb__lf *bdims,
                                   const tb__lf *krow, int64_t len, int64_t rows) {
    int64_t period = g->ix.period;
    int32_t il = tb__ix_new_var(&g->ix, 0, len - 1), ir = tb__ix_new_var(&g->ix, 0, rows - 1), slot,
            i;
    tb__lf at = *krow, lane, flat;
    bool plain, unit = false;
    if (il < 0 || ir < 0) return false;
    g->ix.vars[ir].traced = 1;
    g->ix.period = 0;
    tb__lf_const(&lane, 0);
    tb__lf_add_term(&lane, il, 1);
    tb__lf_add_term(&at, ir, 1);
    /* one read (the value is the read's), its index r plus what r does not change */
    plain = tb__cg_pack_flat_of(g, k, bdims, &at, &lane, &flat, &slot) && g->ix.period == 0;
    for (i = 0; plain && i < flat.n; i++) {
        if (flat.var[i] == ir) {
            unit = flat.coef[i] == 1;
        } else if (g->ix.vars[flat.var[i]].traced) {
            plain = false;
        }
    }
    g->ix.period = period;
    return plain && unit;
}

/* One stage of a transpose of `lanes` vectors tb_t<s - 1>_<i> into tb_t<s>_<i>: the blocks of
   `half` lanes off the diagonal of each block of 2 * half exchanged. */
static void tb__cg_pack_block_stage(tb__cg *g, int32_t lanes, int32_t s, int32_t half) {
    char list[2][128], a[32], b[32], text[384];
    int32_t i, c, h;
    for (h = 0; h < 2; h++) {
        size_t used = 0;
        for (c = 0; c < lanes; c++) {
            int32_t from = c % (2 * half) < half ? c + h * half : lanes + c - half + h * half;
            used += (size_t)snprintf(list[h] + used, sizeof list[h] - used, "%s%d", c ? ", " : "",
                                     (int)from);
        }
    }
    for (i = 0; i < lanes; i++) {
        if ((i & half) != 0) continue;
        snprintf(a, sizeof a, "tb_t%d_%d", (int)s - 1, (int)i);
        snprintf(b, sizeof b, "tb_t%d_%d", (int)s - 1, (int)(i + half));
        for (h = 0; h < 2; h++) {
            snprintf(text, sizeof text, g->d->shuffle, a, b, (int)lanes, list[h]);
            tb__ix_line(&g->ix, "const float%d tb_t%d_%d = %s;", (int)lanes, (int)s,
                        (int)(i + h * half), text);
        }
    }
}

/* Every lane of a panel at a run's rows pr0..pr0 + pn (pn >= `lanes`: the C variables of
   tb__cg_pack_lanes) in blocks of lanes x lanes (tb__cg_pack_block_lanes): each lane's rows
   read as vectors from its address at the run's first row, each block transposed in registers,
   each row's lanes stored as one vector; a run's last block ends at its end (over rows an
   earlier block wrote, where pn is no multiple of lanes). Lanes from `len` on are zeros. A
   convolution's weight gradient packs B so: its lanes a window's elements, its rows an input
   row's pixels (ResNet-18's 64-channel one on a 2-core Zen 5 VM, AVX-512 code: the pack of a
   work item's 9 panels of 25088 rows 3.3 -> 1.8 ms). */
static bool tb__cg_pack_block(tb__cg *g, const tb__plan_kernel *k, const tb__lf *bdims,
                              const char *dst, const char *panel, const char *origin,
                              const tb__lf *krow, int64_t len, int64_t rows, int32_t lanes) {
    char head[160], text[TB__LF_TEXT], zero[48], tv[16];
    int64_t z[6], K, width;
    int32_t il, ir, v, i, s, half;
    tb__lf at = *krow, lane;
    tb__plan_pack_sizes(g->G, k->core, k->kind == TB__K_PACK_A, z);
    K = z[3];
    width = z[5];
    snprintf(tv, sizeof tv, "float%d", (int)lanes);
    snprintf(zero, sizeof zero, g->d->vec_zero, tv);
    snprintf(head, sizeof head, "for (long pb = 0; pb < %lldL; pb += %d) ", (long long)width,
             (int)lanes);
    tb__ix_open(&g->ix, head);
    tb__ix_line(&g->ix, "%sconst float *tb_src[%d];", g->d->global, (int)lanes);
    snprintf(head, sizeof head, "for (long pt = 0; pt < %dL; pt++) ", (int)lanes);
    tb__ix_open(&g->ix, head);
    il = tb__ix_new_var(&g->ix, 0, len - 1);
    ir = tb__ix_new_var(&g->ix, 0, rows - 1);
    if (il < 0 || ir < 0) return false;
    tb__ix_line(&g->ix, "const long i%d = pl0 + pb + pt;", (int)il);
    tb__ix_line(&g->ix, "tb_src[pt] = 0;");
    snprintf(head, sizeof head, "if (i%d < %lldL) ", (int)il, (long long)len);
    tb__ix_open(&g->ix, head);
    tb__ix_line(&g->ix, "const long i%d = pr0;", (int)ir);
    tb__lf_const(&lane, 0);
    tb__lf_add_term(&lane, il, 1);
    tb__lf_add_term(&at, ir, 1);
    v = tb__cg_pack_read(g, k, bdims, &at, &lane, text);
    if (v < 0) return false;
    if (g->capture_slot < 0) {
        tb__ix_fail(&g->ix, tb__error(TB_ERR_INTERNAL,
                                      "codegen: %s: a pack's block reads no buffer", k->name));
        return false;
    }
    tb__ix_line(&g->ix, "tb_src[pt] = b%d + (%s);", (int)g->capture_slot, text);
    tb__ix_close(&g->ix, "");
    tb__ix_close(&g->ix, "");
    snprintf(head, sizeof head, "for (long pw = 0; pw < pn; pw += %d) ", (int)lanes);
    tb__ix_open(&g->ix, head);
    tb__ix_line(&g->ix, "const long pw0 = pw + %dL <= pn ? pw : pn - %dL;", (int)lanes, (int)lanes);
    for (i = 0; i < lanes; i++)
        tb__ix_line(&g->ix,
                    "const %s tb_t0_%d = tb_src[%d] != 0 ? vload%d(0, tb_src[%d] + pw0) : %s;", tv,
                    (int)i, (int)i, (int)lanes, (int)i, zero);
    for (s = 1, half = 1; half < lanes; s++, half *= 2)
        tb__cg_pack_block_stage(g, lanes, s, half);
    for (i = 0; i < lanes; i++)
        tb__ix_line(
            &g->ix, "vstore%d(tb_t%d_%d, 0, %s + ((%s) * %lldL + pk%s%s + pw0 + %d) * %lldL + pb);",
            (int)lanes, (int)s - 1, (int)i, dst, panel, (long long)K, origin != NULL ? " - " : "",
            origin != NULL ? origin : "", (int)i, (long long)width);
    tb__ix_close(&g->ix, "");
    tb__ix_close(&g->ix, "");
    return g->ix.status == TB_OK;
}

/* A pack's rows pk0..pk1 of a panel (as tb__cg_pack_panel) in runs of rows that stay within
   one period of the rows' unravelling (`period`, and within it a shorter one where there is
   one, tb__cg_pack_trace: an image's pixels, then a row of them), each run lane by lane, so that
   a lane's run is affine in the row and divides nothing, and the run's rows of the panel (a
   few KiB) stay in the first-level cache while its lanes fill them: where a run of lanes would be
   short and a run of rows long (a convolution's weight gradient: B's lanes are a window's few
   columns, its rows an input row's pixels, read in place along that row). */
static bool tb__cg_pack_lanes(tb__cg *g, const tb__plan_kernel *k, const tb__lf *bdims,
                              const char *dst, const char *panel, const char *origin,
                              int64_t period) {
    char head[160];
    int64_t z[6], len, K, width, sub = tb__cg_pack_trace(g, k, bdims, true, period), run;
    int32_t il, iq, iq2 = -1, block;
    tb__lf lane, krow;
    if (sub >= period) sub = 0;
    tb__plan_pack_sizes(g->G, k->core, k->kind == TB__K_PACK_A, z);
    K = z[3];
    width = z[5];
    len = k->kind == TB__K_PACK_A ? z[1] : z[2];
    il = tb__ix_new_var(&g->ix, 0, len - 1);
    iq = tb__ix_new_var(&g->ix, 0, (K - 1) / period);
    if (sub > 0) iq2 = tb__ix_new_var(&g->ix, 0, (period - 1) / sub);
    if (il < 0 || iq < 0 || (sub > 0 && iq2 < 0)) return false;
    run = sub > 0 ? sub : period;
    block = tb__cg_pack_block_lanes(g, k, width, run);
    tb__lf_const(&krow, 0);
    tb__lf_add_term(&krow, iq, period);
    if (sub > 0) tb__lf_add_term(&krow, iq2, sub);
    tb__ix_open(&g->ix, "for (long pk = pk0; pk < pk1;) ");
    tb__ix_line(&g->ix, "const long i%d = pk / %lldL, pq = pk %% %lldL;", (int)iq,
                (long long)period, (long long)period);
    if (sub > 0) {
        tb__ix_line(&g->ix, "const long i%d = pq / %lldL, pr0 = pq %% %lldL;", (int)iq2,
                    (long long)sub, (long long)sub);
        tb__ix_line(&g->ix, "long pn = %lldL - pr0;", (long long)sub);
        tb__ix_line(&g->ix, "if (pn > %lldL - pq) pn = %lldL - pq;", (long long)period,
                    (long long)period);
    } else {
        tb__ix_line(&g->ix, "const long pr0 = pq;");
        tb__ix_line(&g->ix, "long pn = %lldL - pr0;", (long long)period);
    }
    tb__ix_line(&g->ix, "if (pn > pk1 - pk) pn = pk1 - pk;");
    if (block > 0 && !tb__cg_pack_block_fits(g, k, bdims, &krow, len, run)) block = 0;
    if (block > 0) { /* the runs as long as a block, then the others lane by lane */
        snprintf(head, sizeof head, "if (pn >= %dL) ", (int)block);
        tb__ix_open(&g->ix, head);
        if (!tb__cg_pack_block(g, k, bdims, dst, panel, origin, &krow, len, run, block))
            return false;
        tb__ix_close(&g->ix, " else");
        tb__ix_open(&g->ix, "");
    }
    snprintf(head, sizeof head, "for (long pj = 0; pj < %lldL; pj++) ", (long long)width);
    tb__ix_open(&g->ix, head);
    tb__ix_line(&g->ix, "const long i%d = pl0 + pj;", (int)il);
    tb__ix_line(&g->ix, "const long po = ((%s) * %lldL + pk - pr0%s%s) * %lldL + pj;", panel,
                (long long)K, origin != NULL ? " - " : "", origin != NULL ? origin : "",
                (long long)width);
    tb__ix_line(&g->ix, "if (i%d >= %lldL) {", (int)il, (long long)len);
    tb__ix_line(&g->ix, "    for (long pz = pr0; pz < pr0 + pn; pz++) %s[po + pz * %lldL] = 0;",
                dst, (long long)width);
    tb__ix_line(&g->ix, "    continue;");
    tb__ix_line(&g->ix, "}");
    tb__lf_const(&lane, 0);
    tb__lf_add_term(&lane, il, 1);
    if (!tb__cg_pack_lane_runs(g, k, bdims, dst, width, &krow, &lane, run)) return false;
    tb__ix_close(&g->ix, "");
    if (block > 0) tb__ix_close(&g->ix, "");
    tb__ix_line(&g->ix, "pk += pn;");
    tb__ix_close(&g->ix, "");
    return g->ix.status == TB_OK;
}

/* A pack's rows pk0..pk1 of a panel's run of lanes pr0.. (`count` of them: the text of a
   variable, or "" for the whole panel width, a constant), lane iq * period + pr0 + r, into
   `dst` at panel `panel` (C text); the loops' variables are its own (the pack may emit the
   rows twice). */
static bool tb__cg_pack_rows(tb__cg *g, const tb__plan_kernel *k, const tb__lf *bdims,
                             const char *dst, const char *panel, const char *origin, int32_t iq,
                             int64_t period, const char *count) {
    char head[160], n[32];
    int64_t z[6];
    int32_t v, ik, ir;
    tb__lf lane;
    tb__plan_pack_sizes(g->G, k->core, k->kind == TB__K_PACK_A, z);
    ik = tb__ix_new_var(&g->ix, 0, z[3] - 1);
    ir = tb__ix_new_var(&g->ix, 0, period - 1);
    if (ik < 0 || ir < 0) return false;
    if (count[0] == '\0') {
        snprintf(n, sizeof n, "%lldL", (long long)z[5]);
    } else {
        snprintf(n, sizeof n, "%s", count);
    }
    snprintf(head, sizeof head, "for (long i%d = pk0; i%d < pk1; i%d++) ", (int)ik, (int)ik,
             (int)ik);
    tb__ix_open(&g->ix, head);
    tb__ix_line(&g->ix, "const long po = ((%s) * %lldL + i%d%s%s) * %lldL + pj - pr0;", panel,
                (long long)z[3], (int)ik, origin != NULL ? " - " : "", origin != NULL ? origin : "",
                (long long)z[5]);
    snprintf(head, sizeof head, "for (long i%d = pr0; i%d < pr0 + %s; i%d++) ", (int)ir, (int)ir, n,
             (int)ir);
    tb__ix_open(&g->ix, head);
    tb__lf_const(&lane, 0);
    tb__lf_add_term(&lane, iq, period);
    tb__lf_add_term(&lane, ir, 1);
    g->inner_var = ir;
    v = tb__cg_pack_value(g, k, bdims, ik, &lane);
    g->inner_var = -1;
    if (v < 0) return false;
    tb__ix_line(&g->ix, "%s[po + i%d] = v%d;", dst, (int)ir, (int)v);
    tb__ix_close(&g->ix, "");
    tb__ix_close(&g->ix, "");
    return g->ix.status == TB_OK;
}

/* The rows pk0..pk1 of one panel of a pack (the kind of k's, or B's for a matmul that packs B
   itself), its first lane pl0 (C variables declared before), into `dst` at panel `panel`
   (C text): the operand at rows (A) or columns (B) pl0 + lane, zero past the last one (the
   matmul never stores what the padding computes); `origin` (C text, or NULL: 0) is the row
   written at the panel's first row. The lanes go in runs that stay within one
   period of the lane's unravelling (tb__cg_pack_trace): within a run the operand's index is
   affine in the lane, so a window's run is a slice of an input row (only a pad's edges test),
   and what depends on the run alone is computed once for all the rows; a run as wide as the
   panel has a loop of its own with a constant count. */
static bool tb__cg_pack_panel(tb__cg *g, const tb__plan_kernel *k, const tb__lf *bdims,
                              const char *dst, const char *panel, const char *origin) {
    int32_t iq;
    int64_t z[6], len, K, width, period;
    char head[160];
    tb__plan_pack_sizes(g->G, k->core, k->kind == TB__K_PACK_A, z);
    K = z[3];
    width = z[5];
    len = k->kind == TB__K_PACK_A ? z[1] : z[2];
    period = tb__cg_pack_trace(g, k, bdims, false, 0);
    if (period == 0 || period > len) period = len;
    /* runs of a few lanes, of more rows: lane by lane */
    if (period < width && period < 8) {
        int64_t rows = tb__cg_pack_trace(g, k, bdims, true, K);
        if (rows == 0 || rows > K) rows = K;
        if (rows >= g->G->target->tuning->pack_lane_rows && rows >= 2 * period)
            return tb__cg_pack_lanes(g, k, bdims, dst, panel, origin, rows);
    }
    iq = tb__ix_new_var(&g->ix, 0, (len - 1) / period);
    if (iq < 0) return false;
    snprintf(head, sizeof head, "for (long pj = 0; pj < %lldL;) ", (long long)width);
    tb__ix_open(&g->ix, head);
    tb__ix_line(&g->ix, "const long pl = pl0 + pj;");
    tb__ix_line(&g->ix, "if (pl >= %lldL) {", (long long)len);
    tb__ix_line(&g->ix, "    for (long pk = pk0; pk < pk1; pk++)");
    tb__ix_line(&g->ix,
                "        for (long pz = pj; pz < %lldL; pz++) %s[((%s) * %lldL + pk%s%s) * %lldL + "
                "pz] = 0;",
                (long long)width, dst, panel, (long long)K, origin != NULL ? " - " : "",
                origin != NULL ? origin : "", (long long)width);
    tb__ix_line(&g->ix, "    break;");
    tb__ix_line(&g->ix, "}");
    tb__ix_line(&g->ix, "const long i%d = pl / %lldL, pr0 = pl %% %lldL;", (int)iq,
                (long long)period, (long long)period);
    tb__ix_line(&g->ix, "long pn = %lldL - pr0;", (long long)period);
    tb__ix_line(&g->ix, "if (pn > %lldL - pj) pn = %lldL - pj;", (long long)width,
                (long long)width);
    tb__ix_line(&g->ix, "if (pn > %lldL - pl) pn = %lldL - pl;", (long long)len, (long long)len);
    /* a whole panel in one run (the common case where the period is long): the same loops
       with a constant count, which the compiler turns into vector copies */
    if (period >= width) {
        snprintf(head, sizeof head, "if (pn == %lldL) ", (long long)width);
        tb__ix_open(&g->ix, head);
        if (!tb__cg_pack_rows(g, k, bdims, dst, panel, origin, iq, period, "")) return false;
        tb__ix_close(&g->ix, " else");
        tb__ix_open(&g->ix, "");
    }
    if (!tb__cg_pack_rows(g, k, bdims, dst, panel, origin, iq, period, "pn")) return false;
    if (period >= width) tb__ix_close(&g->ix, "");
    tb__ix_line(&g->ix, "pj += pn;");
    tb__ix_close(&g->ix, "");
    return g->ix.status == TB_OK;
}

/* b - a in *d where it is a constant (forms keep their terms in the order of their variables,
   one term each). */
static bool tb__cg_lf_delta(const tb__lf *a, const tb__lf *b, int64_t *d) {
    int32_t i;
    if (a->n != b->n) return false;
    for (i = 0; i < a->n; i++)
        if (a->var[i] != b->var[i] || a->coef[i] != b->coef[i]) return false;
    *d = b->c - a->c;
    return true;
}

/* The same at row `krow` and lane `lane`, constants (tb__cg_pack_flat_of). */
static bool tb__cg_pack_flat_at(tb__cg *g, const tb__plan_kernel *k, const tb__lf *bdims,
                                int64_t krow, int64_t lane, tb__lf *flat, int32_t *slot) {
    tb__lf kr, ln;
    tb__lf_const(&kr, krow);
    tb__lf_const(&ln, lane);
    return tb__cg_pack_flat_of(g, k, bdims, &kr, &ln, flat, slot);
}

/* Whether a pack kernel's items go panel by panel at each block of rows
   (tb__plan_kernel.panels_first): where the next panel's first lanes lie nearer in memory to a
   block's than the next block's rows do at most block boundaries (the median of the jumps at
   lane 0 over the first 15 boundaries). A weight read transposed for an input gradient,
   A[ci, (co, kh, kw)] = w[co, ci, 2 - kh, 2 - kw]: block by block, a panel reads a co's few
   values and jumps a whole co (18 KiB) at nearly every block; panel by panel the items read on
   along ci (ResNet-18's 512-channel one, one thread: 3.8-4.2 -> 1.0 ms; in its training step
   2.8 -> 0.8 ms each). Asked for packs of A: of B's packs (an input's windows) that it picked
   in that step, as many ran slower as faster (by 0.1-0.2 ms). */
static bool tb__cg_pack_panels_first(tb__cg *g, const tb__plan_kernel *k, const tb__lf *bdims) {
    int64_t z[6], rows = g->G->target->tuning->mm_pack_rows, jump[15], lane, t;
    int32_t n = 0, i, j, s0, s1;
    tb__lf f0, f1;
    tb__plan_pack_sizes(g->G, k->core, k->kind == TB__K_PACK_A, z);
    /* every read of the same buffer (not parts of a concat), at a constant distance */
    if (!tb__cg_pack_flat_at(g, k, bdims, 0, 0, &f0, &s0) ||
        !tb__cg_pack_flat_at(g, k, bdims, 0, z[5], &f1, &s1) || s1 != s0 ||
        !tb__cg_lf_delta(&f0, &f1, &lane))
        return false;
    for (i = 0; i < 15 && (i + 1) * rows < z[3]; i++) {
        if (!tb__cg_pack_flat_at(g, k, bdims, (i + 1) * rows, 0, &f1, &s1) || s1 != s0 ||
            !tb__cg_lf_delta(&f0, &f1, &t))
            return false;
        jump[n++] = t < 0 ? -t : t;
        f0 = f1;
    }
    for (i = 1; i < n; i++) /* sorted, for the median */
        for (j = i; j > 0 && jump[j - 1] > jump[j]; j--) {
            t = jump[j];
            jump[j] = jump[j - 1];
            jump[j - 1] = t;
        }
    return n > 0 && (lane < 0 ? -lane : lane) < jump[n / 2];
}

/* A pack kernel: one work item per mm_pack_rows rows of a panel (batch b, panel, depths k)
   (tb__cg_pack_panel). */
static tb_status tb__cg_kernel_pack(tb__cg *g, const tb__plan_kernel *k) {
    const tb_shape *cs = tb__plan_shape(g->G, k->core);
    int32_t i0, ib;
    int64_t z[6], K, blocks, width, rows = g->G->target->tuning->mm_pack_rows;
    tb__lf bdims[TB_MAX_RANK];
    tb__plan_kernel *pk;
    bool swap = false;
    char id0[48], id1[48], head[160], panel[32];
    tb__plan_pack_sizes(g->G, k->core, k->kind == TB__K_PACK_A, z);
    K = z[3];
    blocks = z[4];
    width = z[5];
    i0 = tb__ix_new_var(&g->ix, 0, z[0] * blocks - 1);
    ib = tb__ix_new_var(&g->ix, 0, z[0] - 1);
    if (i0 < 0 || ib < 0) return g->ix.status;
    /* panel by panel (tb__cg_pack_panels_first): the C dialect's entry point visits dim 1
       first; an OpenCL kernel whose work-groups are one item each (a CPU driver's, which runs
       groups in the order of dim 0) takes the panels along dim 0 instead: ResNet-18's training
       step on PoCL, the input gradients' packs of the 512-channel weight 9.1 -> 4.6 ms */
    pk = &g->P->kernels[g->kernel];
    if (k->kind == TB__K_PACK_A && K > rows && blocks > 1 &&
        (g->d->item_loops || (pk->group_size[0] == 1 && pk->group_size[1] == 1))) {
        size_t mark = g->ix.body.len; /* a trial: its lines are dropped */
        tb__ix_open(&g->ix, "");
        swap = tb__cg_batch_dims(g, cs, ib, bdims) && tb__cg_pack_panels_first(g, k, bdims);
        tb__ix_close(&g->ix, "");
        tb__ix_drop(&g->ix, mark);
    }
    pk->panels_first = swap && g->d->item_loops;
    swap = swap && !g->d->item_loops;
    if (swap) { /* the layout's groups, dims 0 and 1 exchanged (tb__plan_layout_pack) */
        pk->groups[0] = (size_t)(z[0] * blocks);
        pk->groups[1] = (size_t)((K + rows - 1) / rows);
    }
    tb__cg_id(id0, sizeof id0, g->d->global_id, swap ? 1 : 0);
    tb__cg_id(id1, sizeof id1, g->d->global_id, swap ? 0 : 1);
    tb__ix_line(&g->ix, "const long pk0 = (long)%s * %lldL, i%d = (long)%s;", id0, (long long)rows,
                (int)i0, id1);
    snprintf(head, sizeof head, "if (pk0 < %lldL) ", (long long)K);
    tb__ix_open(&g->ix, head);
    tb__ix_line(&g->ix, "const long pk1 = pk0 + %lldL < %lldL ? pk0 + %lldL : %lldL;",
                (long long)rows, (long long)K, (long long)rows, (long long)K);
    tb__ix_line(&g->ix, "const long i%d = i%d / %lldL, pl0 = i%d %% %lldL * %lldL;", (int)ib,
                (int)i0, (long long)blocks, (int)i0, (long long)blocks, (long long)width);
    if (!tb__cg_batch_dims(g, cs, ib, bdims)) return g->ix.status;
    snprintf(panel, sizeof panel, "i%d", (int)i0);
    if (!tb__cg_pack_panel(g, k, bdims, "out", panel, NULL)) return g->ix.status;
    tb__ix_close(&g->ix, "");
    return g->ix.status;
}

#endif /* TB__HAVE_COMPILED_BACKENDS */

/* ===========================================================================================
   Tuning: the numbers that shape kernels, one table per class of device, and the register
   blocks and vector widths of a CPU's vector shape (its vector registers' width and count).
   The planner reads them (tb__target.tuning); nothing else decides a kernel's shape.
   =========================================================================================== */
#include "../impl_begin.h"

#if defined(TB__HAVE_COMPILED_BACKENDS)

/* The table of a device class:
   - TB__CLASS_CPU, CPU devices of OpenCL (PoCL and others): no local memory worth using; the
     driver vectorises work items, so a row kernel gives each work item a row (or a chunk of
     one) with several accumulators; matmuls read packed panels, and the caches tile them.
     Measured on PoCL 3.1 on 2-core AVX-512 CPUs (README, Performance).
   - TB__CLASS_GPU, GPUs and accelerators: a work-group per row with a local-memory reduction;
     matmul in local-memory tiles.
   - TB__CLASS_HOST, the native backend's threads: a thread runs a range of work items, so there
     are no work-groups; otherwise as TB__CLASS_CPU. */
static void tb__tuning_of(int32_t device_class, tb__tuning *t) {
    bool gpu = device_class == TB__CLASS_GPU, host = device_class == TB__CLASS_HOST;
    memset(t, 0, sizeof *t);
    t->name = gpu ? "gpu" : (host ? "host" : "cpu");
    t->reduce_lanes = gpu ? 1 : 8;
    t->max_group = gpu ? 256 : (host ? 1 : 64);
    t->group_min_len = 32;
    t->item_rows_per_cu = gpu ? 0 : 4;
    t->gpu_rows = gpu ? 256 : 0;
    t->split_min_len = 16384;
    t->split_min_chunk = 4096;
    t->split_chunks_per_cu = gpu ? 16 : 64;
    t->split_max_chunks = 1024;
    t->mm_kind = gpu ? TB__MM_TILES : TB__MM_PACKED;
    t->mm_reg_rows = 8;
    t->mm_reg_cols = 8;
    t->mm_small_n = 16;
    t->mm_reg_accs = 16;
    t->mm_reg_group_x = host ? 1 : 8;
    t->mm_reg_group_y = host ? 1 : 4;
    t->mm_panel_rows = 16;
    t->mm_panel_rows_min = 16;
    t->mm_vec_f32 = 16;
    t->mm_vec_f64 = 8;
    /* an OpenCL CPU driver's pack items: 64 rows of a panel each, one item to a work-group,
       where work-groups of 8 items of 8 rows each kept a lane's runs of an input row 8 long
       (ResNet-18's training step through tools/tb_fx.py on PoCL, 2-core AMD EPYC Zen 5 VM:
       the 7 x 7 stem's weight gradient's pack of B 21.8 -> 13.8 ms, the step's packs 63 -> 53
       ms; LeNet-like weight gradient's pack of B 4.1 -> 1.9 ms, 32 rows 2.3, 128 rows 1.7).
       The host keeps 8: there a thread runs its items in order, and 64 made as many packs
       slower as faster. */
    t->mm_pack_rows = host || gpu ? 8 : 64;
    t->mm_pack_group_k = gpu ? 8 : 1;
    t->mm_pack_min_work = 262144; /* 64^3 */
    /* the host's threads have stacks of megabytes; an OpenCL CPU driver's work items take the
       64 KiB a softmax's scratch takes (row_scratch_bytes) */
    t->mm_own_b_bytes = host ? (int64_t)160 << 10 : (gpu ? 0 : (int64_t)64 << 10);
    t->mm_own_b_rows = 256;
    /* the weight gradient of a 3 x 3 convolution over 56 x 56, 64 channels, 32 images (2-core
       AMD EPYC Zen 5 VM, the whole backward pass, best of 5): native AVX-512 code 76-78 -> 59
       ms, AVX2 code 138-141 -> 108-110 ms, PoCL 88.6 -> 69 ms (an item is a work-group of
       one there: one tile of private memory, beside its buffer's 64 KiB) */
    t->mm_own_b_tile = host ? (int64_t)256 << 10 : (gpu ? 0 : (int64_t)128 << 10);
    t->mm_cache_bytes = (int64_t)1 << 20;
    /* half a core's cache for the group's panels of B, the other half for the panels of A
       streaming past them: on a 2-core Intel Xeon (AVX-512, 2 MiB of L2 a core) 1024^3 on
       native 208 -> 241-263 GFLOP/s, 2048^3 190 -> 222 (2048^3 on PoCL 200 -> 222), where
       groups of two caches' worth left B to the last-level cache */
    t->mm_group_caches = 0.5;
    /* a group reads each row panel of A from memory (the row panels stream past its column
       panels in the cache), and the first item of a row panel waited for it: 2048 x K x 2048
       on 2 threads of a 2-core AMD EPYC Zen 5 VM, K = 1024 / 2048 / 4096, AVX2 code 175 /
       168 / 142 -> 204 / 196 / 195 GFLOP/s, AVX-512 code at K = 2048 and 4096 280 / 230 ->
       376 / 342 GFLOP/s (prefetches into all the caches: about the same). Only where A's
       panels outgrow half the core's cache: a ResNet convolution's weights (64 x 576) stay
       in it, and its loop then had a load more per step for nothing. */
    t->mm_prefetch_a = !gpu;
    /* B's rows read in place at a table's offsets (a convolution's windows over whole padded
       rows): each row's cache lines are a jump from the last row's (the next channel, the
       next kernel row), which the hardware's prefetchers do not follow, so each step fetches
       the row of about 1152 FMAs later (some 600 cycles at two FMAs a cycle) into the
       first-level cache. The ResNet-like 3 x 3 convolution's matmul (32 images of 64 x 56 x
       56, 64 x 3248 x 576 each) on one thread of a 2-core AMD EPYC Zen 5 VM: AVX-512 code
       (13 x 32 blocks, 45 steps ahead) 47.6 -> 42.6 ms, on two threads 27.6-28.4 -> 24.4-25.0
       ms (the planner leaves out smaller blocks: tb__plan_mm_prefetch_b). */
    t->mm_prefetch_b = gpu ? 0 : 1152;
    t->mm_tile_group = 16;
    t->mm_tile_block = 4;
    t->mm_tile_k = 16;
    t->values_per_kernel = 4096;
    t->positions_per_node = 64;
    t->nesting = 64;
    t->item_group = gpu ? 256 : (host ? 1 : 128);
    t->vec_width = gpu ? 0 : 16;
    /* CPUs: a row of elements per work item amortises the leading dims' divisions. Host
       threads run a work item as a function call; an OpenCL CPU device would vectorise across
       work items, but not the 64-bit divisions of a view's index (a pad, a slice: ResNet-18 on
       PoCL, batch 8 at 224 x 224, 2.5 -> 0.5 ms per padded copy; SqueezeNet 97 -> 67 ms) */
    t->elem_row_loops = !gpu;
    t->stream_min_bytes = 65536;
    /* four streams per core read faster than two on the EPYC VMs (sum, max, row sums: 5-8% on
       PoCL, paired), eight slower again */
    t->red_vec_lanes = 4;
    /* on the EPYC VMs, 4096 x 4096 f32: softmax 6.4 -> 5.3 ms, layer_norm 6.0 -> 3.5-4.0 ms
       with both (PoCL and the native backend alike); a GPU's work-group per row has neither */
    t->row_prefetch = !gpu;
    t->stream_store_min_bytes = gpu ? 0 : (int64_t)32 << 20;
    t->stream_elementwise = host;
    /* softmax, 4096 x 4096 f32 on the EPYC VMs: a row's non-temporal stores during the next
       row's exponentials, against exponentials kept in out and scaled in place: C on 2
       threads 4.3-4.5 -> 3.5-4.2 ms, PoCL 5.3-5.6 -> 4.8-5.0 ms (16 to 64 items alike) */
    t->row_scratch_bytes = gpu ? 0 : 65536;
    t->pipe_items_per_cu = 8;
    /* a convolution's weight gradient (3 x 3, padding 1, 32 images; matmul kernel time, best
       of runs, 2-core Intel Xeon VM with AVX-512): input rows of 56, 64 channels: AVX2 code
       99-101 -> 74 ms, AVX-512 52 -> 48 ms with the split; rows of 28, 128 channels: 58.7 ->
       58.9 and 38.7 -> 40.1 ms; the Fashion-MNIST CNN's second one (rows of 14, 5 x 5,
       padding 2) 501 -> 564 ms over 20 steps on AVX-512: short runs keep one loop */
    t->pack_split_rows = 48;
    /* the same weight gradients packed lane by lane against run by run of lanes (matmul
       kernel time, best of three, 2-core Intel Xeon VM, AVX-512 / AVX2 code): rows of 14 with
       5 x 5 windows (the Fashion-MNIST CNN's second convolution, 128 images) 26.1 -> 19.3 and
       37.3 -> 30.5 ms, rows of 14 with 3 x 3 (256 channels, 32 images) 40.9 -> 32.1 and 65.1
       -> 55.2 ms; rows of 7 with 3 x 3 (512 channels) 25.9 -> 27.0 and 47.8 -> 47.6 ms */
    t->pack_lane_rows = 8;
}

/* A CPU table (TB__CLASS_CPU or TB__CLASS_HOST) fitted to the CPU's vector shape, so that every
   vector a kernel keeps is one register and no kernel keeps more of them than the CPU has
   (a vector wider than the registers is kept in memory by the compiler, and some of its
   operations, such as comparisons giving masks, are split into lanes):
   - row vectors (elementwise, reductions, norms, softmax) of the register's width: 16 f32
     lanes with AVX-512, 8 with AVX2, 4 with SSE and NEON;
   - the packed matmul's register block: rm rows of A by a row of B's columns held in one or
     two registers, an accumulator register per row and register of B, plus B's registers and
     the broadcast of A's value:
       AVX-512 (32 registers of 16 lanes): 14 x 2 registers (28 + 2): 14 x 32 f32, 14 x 16 f64.
         On an Intel AVX-512 VM with two FMA units per core, a block's loop over panels in L2
         (K = 4608, one thread): 16 x 16 (one register of B, 16 + 1) 161-165 GFLOP/s, 12 x 32
         215, 14 x 32 216-217 (28 accumulators: the broadcasts of A are loads inside the FMAs);
         1024^3 on 2 threads 267 -> 338 GFLOP/s, ResNet-18 (batch 8, 224 x 224) 164 -> 148 ms.
         12, 13 and 15 rows ran as fast as 14, so a matmul takes 12 to 14 rows, the count that
         pads its M least: 13 for M = 64, 128 and 256 (1.6% of the rows padding, not 9.4%,
         9.4% and 3.9% with 14);
       AVX2 and SSE (16 registers): 6 x 2 registers (12 + 2 + 1): AVX2 6 x 16 f32, 6 x 8 f64,
         SSE 6 x 8 and 6 x 4. AVX2 1024^3 on 2 cores (Zen 4, 256-bit code, mul and add): 6 x 16
         gave 196-204 GFLOP/s, 4 x 24 203-207, 12 x 8 164-180, 7 x 16 (17 registers) 117-125.
         With FMA (without it each product takes a register of its own, the 17th) AVX2 also
         has a wide block of 4 x 3 registers (12 + 3 + 1) for f32, 4 x 24 (f64's products are
         never fused, so it keeps 6 x 8), which a
         matmul takes where it pads its M x N output no more than the 6-row block does: a
         ResNet-like convolution's 64 output channels (6 x 16 pads them to 66 rows). tb_conv2d
         of 32 x 64 x 56 x 56, 3 x 3, padding 1, AVX2 code on 2 threads (Zen 5 VM, best of 8):
         42.4-43.1 -> 40.4-40.6 ms. In OpenCL C only for a matmul that reads B in place
         (tb__kit_target: PoCL's LLVM spills the wide block's 16 registers elsewhere);
       NEON (32 registers of 4 lanes): 12 x 2 registers (24 + 2 + 1): 12 x 8 f32, 12 x 4 f64;
   - the unpacked register matmul (small or integer matmuls): 8 x 8 where a row's 8 lanes are
     one register, else 4 x 8 (8 registers of two halves each); wider blocks (a classifier's
     columns, a matrix-vector product's) keep at most 24 accumulator registers of 32, 12 of
     16 (the rest hold B's vectors and A's broadcast). */
static void tb__tuning_fit(tb__tuning *t, const tb__host_shape *shape) {
    int32_t lanes = shape->vec_bytes >= 64 ? 16 : (shape->vec_bytes >= 32 ? 8 : 4);
    int32_t b_regs = 2;
    t->vec_width = lanes;
    t->mm_vec_f32 = b_regs * lanes;
    t->mm_vec_f64 = b_regs * lanes / 2;
    t->mm_panel_rows = lanes == 16 ? 14 : (shape->vec_regs >= 32 ? 12 : 6);
    t->mm_panel_rows_min = lanes == 16 ? 12 : t->mm_panel_rows;
    if (shape->vec_bytes == 32 && shape->vec_regs < 32 && shape->fma) { /* 12 + 3 + 1 */
        t->mm_wide_rows = 4;
        t->mm_wide_cols = 3 * lanes; /* f32 only: f64's products are not fused */
    }
    if (lanes < 8) t->mm_reg_rows = 4;
    t->mm_reg_accs = shape->vec_regs >= 32 ? 24 : 12;
}

#endif /* TB__HAVE_COMPILED_BACKENDS */

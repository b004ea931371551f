/* The in-process collective, allreduce_devices: the all-reduce (sum) of 16M floats (--quick: 1M)
   held by two OpenCL devices of this process (opencl:0 and opencl:1; POCL_DEVICES="pthread
   pthread" gives two on PoCL), each device ending with the sum, through sharded tensors
   (tb_sharded_all_reduce of a TB_PARTIAL pair), beside the same work written by hand with the
   OpenCL API on the library's own contexts and queues: device 1's buffer mapped and written
   into a buffer of device 0, the tuned hand-written add there, the sum mapped and written back
   into a buffer of device 1 (one copy each way, as ours does where the devices keep their
   memory in the host's). anchor / ours >= 0.9 is the target. The bound is the least traffic
   (both inputs read, the sum written on both devices) over the measured bandwidth. */
#include "bench.h"

#include <stdlib.h>
#include <string.h>

typedef struct dev_ctx {
    tb_sharded *pair; /* ours: the two inputs as partial values */
    tb_tensor *sums[2];
    /* by hand */
    cl_command_queue q1;
    cl_mem b1, tmp0, out1;
    hand *add; /* out0 = a0 + tmp0 on device 0 */
    size_t bytes;
} dev_ctx;

static void ours_run(void *p) {
    dev_ctx *c = (dev_ctx *)p;
    tb_sharded *r = tb_sharded_all_reduce(c->pair, TB_REDUCE_SUM);
    if (r == NULL) die("tb_sharded_all_reduce: %s", tb_last_error());
    /* both sums are values now (the first synced, the second copied); keep them for the
       check, and wait for the devices' queues */
    tb_tensor_release(c->sums[0]);
    tb_tensor_release(c->sums[1]);
    c->sums[0] = tb_tensor_retain(tb_sharded_shard(r, 0));
    c->sums[1] = tb_tensor_retain(tb_sharded_shard(r, 1));
    tb_sharded_release(r);
    finish();
    cl_need(clFinish(c->q1), "clFinish (opencl:1)");
}

static void hand_allreduce(void *p) {
    dev_ctx *c = (dev_ctx *)p;
    cl_int err = CL_SUCCESS;
    void *h =
        clEnqueueMapBuffer(c->q1, c->b1, CL_TRUE, CL_MAP_READ, 0, c->bytes, 0, NULL, NULL, &err);
    cl_need(err, "clEnqueueMapBuffer (device 1's input)");
    cl_need(clEnqueueWriteBuffer(g_queue, c->tmp0, CL_TRUE, 0, c->bytes, h, 0, NULL, NULL),
            "clEnqueueWriteBuffer (to device 0)");
    cl_need(clEnqueueUnmapMemObject(c->q1, c->b1, h, 0, NULL, NULL), "clEnqueueUnmapMemObject");
    hand_run(c->add); /* the add on device 0, then clFinish */
    h = clEnqueueMapBuffer(g_queue, hand_out(c->add), CL_TRUE, CL_MAP_READ, 0, c->bytes, 0, NULL,
                           NULL, &err);
    cl_need(err, "clEnqueueMapBuffer (the sum)");
    cl_need(clEnqueueWriteBuffer(c->q1, c->out1, CL_TRUE, 0, c->bytes, h, 0, NULL, NULL),
            "clEnqueueWriteBuffer (to device 1)");
    cl_need(clEnqueueUnmapMemObject(g_queue, hand_out(c->add), h, 0, NULL, NULL),
            "clEnqueueUnmapMemObject");
    cl_need(clFinish(c->q1), "clFinish (opencl:1)");
    finish();
}

void case_allreduce_devices(int64_t n) {
    dev_ctx c;
    tb_device devs[2];
    tb_opencl_native nat1;
    tb_tensor *a, *b, *t[2];
    float *x = host_random((size_t)n, 1.0f), *y = host_random((size_t)n, 1.0f), *want, *got;
    size_t count = 0, i, got_n = 0;
    side sides[2];
    cl_int err = CL_SUCCESS;
    int reps;
    row r;
    if (!g_backends[0].ok) {
        note("allreduce_devices: skipped: no OpenCL (%s)", g_backends[0].why);
        free(x);
        free(y);
        return;
    }
    if (tb_backend_devices("opencl", devs, 2, &count) != TB_OK || count < 2) {
        note("allreduce_devices: skipped: one OpenCL device (POCL_DEVICES=\"pthread pthread\" "
             "gives two on PoCL)");
        free(x);
        free(y);
        return;
    }
    memset(&c, 0, sizeof c);
    c.bytes = (size_t)n * sizeof(float);
    a = upload(x, 1, &n, &devs[0]);
    b = upload(y, 1, &n, &devs[1]);
    t[0] = a;
    t[1] = b;
    c.pair = tb_sharded_from_tensors(t, 2, TB_PARTIAL, 0);
    if (c.pair == NULL) die("tb_sharded_from_tensors: %s", tb_last_error());
    need_ok(tb_opencl_native_device(&devs[1], &nat1), "tb_opencl_native_device opencl:1");
    c.q1 = (cl_command_queue)nat1.queue;
    c.b1 = tensor_mem(b);
    c.tmp0 = cl_buffer(c.bytes);
    c.out1 = clCreateBuffer((cl_context)nat1.context, CL_MEM_READ_WRITE, c.bytes, NULL, &err);
    cl_need(err, "clCreateBuffer (opencl:1)");
    c.add = hand_elementwise(1, tensor_mem(a), c.tmp0, n);

    /* both sides checked against the host before anything is timed */
    want = host_alloc((size_t)n);
    for (i = 0; i < (size_t)n; i++)
        want[i] = x[i] + y[i];
    ours_run(&c);
    got = to_host(c.sums[1]);
    check_close("allreduce_devices (ours, opencl:1)", got, want, (size_t)n, 0, 0);
    free(got);
    got = to_host(c.sums[0]);
    check_close("allreduce_devices (ours, opencl:0)", got, want, (size_t)n, 0, 0);
    free(got);
    hand_allreduce(&c);
    got = hand_result(c.add, &got_n);
    check_close("allreduce_devices (by hand, device 0)", got, want, got_n, 0, 0);
    free(got);
    got = host_alloc((size_t)n);
    cl_need(clEnqueueReadBuffer(c.q1, c.out1, CL_TRUE, 0, c.bytes, got, 0, NULL, NULL),
            "clEnqueueReadBuffer (opencl:1)");
    check_close("allreduce_devices (by hand, device 1)", got, want, (size_t)n, 0, 0);
    free(got);

    memset(sides, 0, sizeof sides);
    sides[0].name = "opencl";
    sides[0].run = ours_run;
    sides[0].ctx = &c;
    sides[1].name = "hand_copy_add";
    sides[1].run = hand_allreduce;
    sides[1].ctx = &c;
    reps = measure(sides, 2, 0);
    note_faults("allreduce_devices", sides, 2);
    r = row_new("allreduce_devices", "opencl");
    r.ours = sides[0].t;
    r.bytes = 16.0 * (double)n; /* two inputs read, the sum written twice */
    r.writes = 1;
    r.bound = bound_time(r.bytes, 1);
    snprintf(r.bound_kind, sizeof r.bound_kind, "bandwidth");
    snprintf(r.anchor_name, sizeof r.anchor_name, "hand_copy_add");
    r.anchor = sides[1].t;
    snprintf(r.unit, sizeof r.unit, "GB/s");
    r.value = r.bytes / r.ours / 1e9;
    r.reps = reps;
    add_row(&r);
    note("allreduce_devices: %lld floats on opencl:0 and opencl:1, each ending with the sum; "
         "hand_copy_add: device 1's buffer mapped and written to device 0, the add (%s), the "
         "sum mapped and written to device 1",
         (long long)n, hand_about(c.add));

    hand_free(c.add);
    clReleaseMemObject(c.tmp0);
    clReleaseMemObject(c.out1);
    tb_tensor_release(c.sums[0]);
    tb_tensor_release(c.sums[1]);
    tb_sharded_release(c.pair);
    tb_tensor_release(a);
    tb_tensor_release(b);
    free(want);
    free(x);
    free(y);
}

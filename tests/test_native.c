/* The native backend against the cpu backend: the op suite of the OpenCL tests (every op,
   every fusion pattern, seeded random graphs, the random streams, run-time errors) on the
   planner's C99 kernels compiled by the system's C compiler. Without a compiler the tests
   that need one are skipped. */
#define TEST_BACKEND "native"
/* softplus and mish (log1p in the kernels) are left out here: with them this program passes
   every test, then LeakSanitizer's own tracer crashes at exit (signal 11) under the suite's
   AddressSanitizer build on an Intel AVX-512 VM; tests/fx_torch.py runs both on native */
#define TEST_NO_LOG1P_OPS 1
#include "test_opencl.c"

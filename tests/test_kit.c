/* A backend made with the public kit alone (examples/kit_backend.c: C99 kernels built by the
   system's C compiler, run on one thread) against the cpu backend: the compiled-backend suite of
   the OpenCL and native tests (tests/backend_suite: every op, every fusion pattern, seeded random
   graphs, the random streams, run-time errors). Without a compiler the tests that need one are
   skipped. */
#define KITC_NO_MAIN
#include "../examples/kit_backend.c"

/* the registry forgets "kitc" at every tb_shutdown: each setup registers it again */
static tb_status kitc_setup(const tb_desc *desc) {
    tb_status st = (tb_setup)(desc);
    if (st == TB_OK) st = kitc_register();
    return st;
}

#define tb_setup(desc)       kitc_setup(desc)
#define TEST_BACKEND         "kitc"
#define TEST_BACKEND_SETUP() (void)kitc_register()
#include "backend_suite/suite.c"

/* ===========================================================================================
   The wiring: the one part that names the hooks of every layer, so that earlier layers reach
   later ones only through tb__wiring() (tb_shutdown's teardown order, the built-in backends,
   the collectives' host step)
   =========================================================================================== */
#include "impl_begin.h"

/* Later layers first. The metrics go last of all: every layer records them, the backends too
   (in prepare_to_exit and while their buffers are released), and a metric recorded after the
   table was freed would outlive the allocator hooks. */
static void (*const tb__wired_teardown[])(void) = {
    tb__process_group_shutdown, tb__executor_shutdown, tb__ir_shutdown,
    tb__registry_shutdown,      tb__metrics_shutdown,
};

/* The reference backend first: it is the default backend and the oracle of the others. */
static const tb__builtin_backend tb__wired_builtins[] = {
    {"cpu", tb__cpu_register},
#if !defined(TB_NO_OPENCL)
    {"opencl", tb__opencl_register},
#endif
#if defined(TB__HAVE_NATIVE)
    {"native", tb__native_register},
#endif
};

static const tb__wiring_table *tb__wiring(void) {
    static const tb__wiring_table table = {
        tb__wired_teardown,    sizeof tb__wired_teardown / sizeof tb__wired_teardown[0],
        tb__wired_builtins,    sizeof tb__wired_builtins / sizeof tb__wired_builtins[0],
        tb__process_group_run,
    };
    return &table;
}

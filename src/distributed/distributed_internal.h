/* ===========================================================================================
   Distribution: what the process-group registry (distributed.c) uses of the mpi part
   =========================================================================================== */
#include "../impl_begin.h"

/* The mpi group's loader needs dlopen; TB_NO_MPI leaves it out (the group then says so). */
#if !defined(TB_NO_MPI) && !defined(_WIN32)
#define TB__HAVE_MPI 1
#include <dlfcn.h>
#endif

/* mpi.c: the entries of the built-in `mpi` process group */
static tb_process_group_impl tb__mpi_group_impl(void);

/* distributed.c: the executor's host step for a COLLECTIVE node (the wiring hands it to the
   executor as tb__wiring()->collective) */
static tb_status tb__process_group_run(const tb_node *node, tb_status local, const void *in,
                                       void *dest, void **out, void (**release)(void *context),
                                       void **context);

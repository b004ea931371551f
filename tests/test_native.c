/* The native backend against the cpu backend: the compiled-backend suite (tests/backend_suite:
   every op, every fusion pattern, seeded random graphs, the random streams, run-time errors)
   on the planner's C99 kernels compiled by the system's C compiler. Without a compiler the tests
   that need one are skipped. */
#define TEST_BACKEND "native"
#include "backend_suite/suite.c"

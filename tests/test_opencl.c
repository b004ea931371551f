/* The OpenCL backend against the cpu backend: the compiled-backend suite (tests/backend_suite:
   every op, every fusion pattern, seeded random graphs, the random streams, the error paths)
   and the tests of OpenCL's own machinery (two devices, the program cache on disk, the
   loader). Without an OpenCL device the tests that need one are skipped (the
   unavailable-library test still runs). */
#include "backend_suite/suite.c"

/* The library's implementation, compiled once for the benchmark (tools/bench.sh rebuilds it
   only when torch_backend.h changes). */
#define TB_IMPLEMENTATION
#include "torch_backend.h"

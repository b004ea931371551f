/* Compile check, first of two files linked together: this one holds the implementation. */
#define TB_IMPLEMENTATION
#include "torch_backend.h"

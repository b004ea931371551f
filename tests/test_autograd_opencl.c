/* The gradients of tests/test_autograd.c's op cases on the opencl and native backends, against
   the cpu backend's (each skipped where its backend has no device). */
#define AUTOGRAD_DEVICES 1
#include "test_autograd.c"

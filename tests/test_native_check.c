/* TB_CHECK on the native backend: a graph whose native kernels disagree with the reference is
   reported at the first differing node (the OpenCL tests' cases, on native). */
#define TEST_BACKEND "native"
#include "test_opencl_check.c"

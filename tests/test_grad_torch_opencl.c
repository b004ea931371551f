/* The f32 random graphs of tests/test_grad_torch.c on opencl, their gradients against the cpu
   backend's (skipped where opencl has no device). */
#define GRAD_TORCH_DEVICES 1
#include "test_grad_torch.c"

/* Compile check: including the header again, before and after TB_IMPLEMENTATION, is harmless. */
#include "torch_backend.h"
#define TB_IMPLEMENTATION
#include "torch_backend.h"
#include "torch_backend.h"

int main(void) {
    return tb_status_string(TB_OK) != NULL ? 0 : 1;
}

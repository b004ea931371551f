/* Compile check: TB_STATIC gives every function internal linkage; nothing unused may warn. */
#define TB_STATIC
#define TB_IMPLEMENTATION
#include "torch_backend.h"

int main(void) {
    return tb_status_string(TB_OK) != NULL ? 0 : 1;
}

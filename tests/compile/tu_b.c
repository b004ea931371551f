/* Compile check, second of two files linked together: declarations only, calls into tu_a.c. */
#include "torch_backend.h"

int main(void) {
    return tb_status_string(TB_OK) != NULL ? 0 : 1;
}

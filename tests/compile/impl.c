/* Compile check: the whole library in one C translation unit. */
#define TB_IMPLEMENTATION
#include "torch_backend.h"

#include <stdio.h>

int main(void) {
    const char *text = tb_status_string(TB_OK);
    if (text == NULL) {
        return 1;
    }
    printf("%s\n", text);
    return 0;
}

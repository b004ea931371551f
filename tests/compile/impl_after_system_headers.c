/* Compile check: the implementation after system headers, as in a test program that includes
   <stdio.h> or cmocka's headers first; feature macros set by the header come too late then. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define TB_IMPLEMENTATION
#include "torch_backend.h"

int main(void) {
    return tb_status_string(TB_OK) != NULL ? 0 : 1;
}

/* Compile check: the declarations alone, as every file but one of a user's program sees them. */
#include "torch_backend.h"

const char *decl_only_status_text(tb_status status);

const char *decl_only_status_text(tb_status status) {
    return tb_status_string(status);
}

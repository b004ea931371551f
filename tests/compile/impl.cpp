// Compile check: the whole library in one C++ translation unit.
#define TB_IMPLEMENTATION
#include "torch_backend.h"

#include <cstdint>
#include <cstdio>

int main() {
    const char *text = tb_status_string(TB_OK);
    if (text == nullptr) {
        return 1;
    }
    // tb_shape_of reads dims of any integer type whole, in C++ too
    const int64_t big = int64_t(1) << 40;
    tb_shape s = tb_shape_of(TB_F32, 2, 3, big), none = tb_shape_of(TB_F32, 0);
    tb_shape wrong = tb_shape_of(TB_F32, 2, 3);
    if (s.rank != 2 || s.dims[0] != 3 || s.dims[1] != big || none.rank != 0 || wrong.rank != -1) {
        std::printf("tb_shape_of: wrong shapes\n");
        return 1;
    }
    std::printf("%s\n", text);
    return 0;
}

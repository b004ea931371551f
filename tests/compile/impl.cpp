// Compile check: the whole library in one C++ translation unit.
#define TB_IMPLEMENTATION
#include "torch_backend.h"

#include <cstdio>

int main() {
    const char *text = tb_status_string(TB_OK);
    if (text == nullptr) {
        return 1;
    }
    std::printf("%s\n", text);
    return 0;
}

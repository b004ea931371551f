// test: run
// Every backend (the built-in ones and the plugins on TB_BACKEND_PATH) and every device with
// its properties: a clinfo for torch_backend.h.
// Build: cc -std=c99 -I. examples/devices.c -o devices -ldl -lpthread -lm
//    or: c++ -x c++ -std=c++11 -I. examples/devices.c -o devices -ldl -lpthread -lm
//        (both from the repository root)
#define TB_IMPLEMENTATION
#include "torch_backend.h"

#include <stdio.h>

static void print_device(const tb_device *device) {
    tb_device_info info;
    char text[64];
    tb_device_format(device, text, sizeof text);
    if (tb_backend_device_info(device, &info) != TB_OK) {
        printf("  %s: %s\n", text, tb_last_error());
        return;
    }
    printf("  %s (%s)\n", text, tb_device_type_name(device->type));
    printf("    name:             %s\n", info.name);
    printf("    vendor:           %s\n", info.vendor);
    printf("    driver:           %s\n", info.driver_version);
    printf("    language:         %s\n", info.language_version);
    printf("    compute units:    %u\n", (unsigned)info.compute_units);
    printf("    global memory:    %.1f MiB\n", (double)info.global_memory / (1024.0 * 1024.0));
    printf("    max allocation:   %.1f MiB\n", (double)info.max_allocation / (1024.0 * 1024.0));
    printf("    local memory:     %.1f KiB\n", (double)info.local_memory / 1024.0);
    printf("    work-group size:  %u\n", (unsigned)info.max_work_group_size);
    printf("    unified memory:   %s\n", info.unified_memory ? "yes" : "no");
    printf("    f64:              %s\n", info.supports_f64 ? "yes" : "no");
    if (info.extensions[0] != '\0') printf("    extensions:       %s\n", info.extensions);
}

int main(void) {
    /* Plugins on TB_BACKEND_PATH load on first use: look each one up so that it is listed
       below with the built-in backends (or says why it does not load). */
    char plugins[64][TB_MAX_NAME + 1];
    size_t num_plugins = tb_backend_list_plugins(plugins, 64);
    for (size_t i = 0; i < num_plugins && i < 64; ++i) {
        if (tb_backend_lookup(plugins[i]) == NULL)
            printf("plugin %s does not load: %s\n", plugins[i], tb_last_error());
    }

    const char *names[64];
    size_t count = tb_backend_list(names, 64, true);
    if (count > 64) count = 64;
    const char *current = tb_get_backend(); /* NULL: TB_BACKEND names no usable backend */
    printf("backends: %u (current: %s)\n", (unsigned)count, current ? current : "none");
    if (current == NULL) printf("  %s\n", tb_last_error());
    for (size_t i = 0; i < count; ++i) {
        tb_device devices[16];
        size_t num_devices = 0;
        const tb_backend *backend = tb_backend_lookup(names[i]);
        const char *tags = backend ? tb_backend_tags(backend) : "";
        printf("%s%s%s%s\n", names[i], tags[0] ? " [" : "", tags, tags[0] ? "]" : "");
        if (tb_backend_devices(names[i], devices, 16, &num_devices) != TB_OK) {
            printf("  unavailable: %s\n", tb_last_error());
            continue;
        }
        if (num_devices == 0) printf("  no devices\n");
        for (size_t d = 0; d < num_devices && d < 16; ++d)
            print_device(&devices[d]);
    }
    tb_shutdown();
    return 0;
}

/* Plugins that must be rejected, one per error path of the plugin loader. Built by
   tests/plugins/build.sh, once per variant:
     -DTB_TEST_BADVERSION   libtb_backend_badversion.so: reports another API version
     -DTB_TEST_NOSYMBOL     libtb_backend_nosymbol.so: exports no tb_backend_plugin_entry
     -DTB_TEST_FAILINIT     libtb_backend_failinit.so: its init fails with a message
     -DTB_TEST_MISMATCH     libtb_backend_mismatch.so: registers another name than its file's
     -DTB_TEST_ENTRYFAIL    libtb_backend_entryfail.so: the entry itself fails with a message
     -DTB_TEST_INCOMPLETE   libtb_backend_incomplete.so: the vtable lacks `execute`
   and the hostile ones, whose strings live in the plugin's own memory (gone once it is
   unloaded, so the host must copy what it quotes before dlclose):
     -DTB_TEST_SLASHNAME    libtb_backend_slashname.so: names itself "bad/name"
     -DTB_TEST_COLONNAME    libtb_backend_colonname.so: names itself "bad:name"
     -DTB_TEST_LONGNAME     libtb_backend_longname.so: a 10 KB name
     -DTB_TEST_NULLNAME     libtb_backend_nullname.so: a NULL name
     -DTB_TEST_EMPTYNAME    libtb_backend_emptyname.so: an empty name
     -DTB_TEST_CTRLNAME     libtb_backend_ctrlname.so: a name with a newline and an escape
     -DTB_TEST_LONGTAGS     libtb_backend_longtags.so: a valid name with 10 KB of bad tags
   Only the declarations of torch_backend.h are used: the host passes everything needed. */
#include "torch_backend.h"

#include <string.h>

static const tb_plugin_host *host_api;

static tb_status bad_data_from_host(void *user_data, tb_backend_data *data, const void *host) {
    (void)user_data;
    (void)data;
    (void)host;
    return TB_ERR_UNSUPPORTED;
}

static tb_status bad_data_to_host(void *user_data, const tb_backend_data *data, void *host) {
    (void)user_data;
    (void)data;
    (void)host;
    return TB_ERR_UNSUPPORTED;
}

static void bad_data_release(void *user_data, tb_backend_data *data) {
    (void)user_data;
    (void)data;
}

static tb_status bad_lower(void *user_data, const tb_graph *graph, void **context) {
    (void)user_data;
    (void)graph;
    (void)context;
    return TB_ERR_UNSUPPORTED;
}

static tb_status bad_compile(void *user_data, void *context, void **computation) {
    (void)user_data;
    (void)context;
    (void)computation;
    return TB_ERR_UNSUPPORTED;
}

static tb_status bad_execute(void *user_data, void *computation, tb_backend_data *const *args,
                             size_t num_args, tb_backend_data *const *results, size_t num_results) {
    (void)user_data;
    (void)computation;
    (void)args;
    (void)num_args;
    (void)results;
    (void)num_results;
    return TB_ERR_UNSUPPORTED;
}

static void bad_release_computation(void *user_data, void *computation) {
    (void)user_data;
    (void)computation;
}

static size_t bad_devices(void *user_data, tb_device *out, size_t cap) {
    (void)user_data;
    (void)out;
    (void)cap;
    return 0;
}

static tb_status bad_init(void *user_data) {
    (void)user_data;
#if defined(TB_TEST_FAILINIT)
    return host_api->set_error(TB_ERR_UNAVAILABLE, "failinit: no such hardware here");
#else
    return TB_OK;
#endif
}

#if defined(TB_TEST_BADVERSION)
#define BAD_NAME    "badversion"
#define BAD_VERSION (TB_API_VERSION + 1)
#elif defined(TB_TEST_NOSYMBOL)
#define BAD_NAME "nosymbol"
#elif defined(TB_TEST_FAILINIT)
#define BAD_NAME "failinit"
#elif defined(TB_TEST_MISMATCH)
#define BAD_NAME "somethingelse"
#elif defined(TB_TEST_ENTRYFAIL)
#define BAD_NAME "entryfail"
#elif defined(TB_TEST_INCOMPLETE)
#define BAD_NAME "incomplete"
#elif defined(TB_TEST_SLASHNAME)
#define BAD_NAME "bad/name"
#elif defined(TB_TEST_COLONNAME)
#define BAD_NAME "bad:name"
#elif defined(TB_TEST_LONGNAME)
#define BAD_NAME long_text('a')
#elif defined(TB_TEST_NULLNAME)
#define BAD_NAME NULL
#elif defined(TB_TEST_EMPTYNAME)
#define BAD_NAME ""
#elif defined(TB_TEST_CTRLNAME)
#define BAD_NAME "ctrl\nname\x1b[31m"
#elif defined(TB_TEST_LONGTAGS)
#define BAD_NAME "longtags"
#define BAD_TAGS long_text('!')
#else
#error "define one TB_TEST_* variant (see the top of this file)"
#endif
#ifndef BAD_VERSION
#define BAD_VERSION TB_API_VERSION
#endif
#ifndef BAD_TAGS
#define BAD_TAGS "debug"
#endif

#if defined(TB_TEST_LONGNAME) || defined(TB_TEST_LONGTAGS)
/* 10 KB of `c` in the plugin's own memory. */
static char long_buffer[10 * 1024 + 1];

static const char *long_text(char c) {
    memset(long_buffer, c, sizeof long_buffer - 1);
    long_buffer[sizeof long_buffer - 1] = '\0';
    return long_buffer;
}
#endif

#if defined(TB_TEST_NOSYMBOL)
#define BAD_ENTRY tb_backend_plugin_entry_not_this_one
#else
#define BAD_ENTRY tb_backend_plugin_entry
#endif

tb_status BAD_ENTRY(const tb_plugin_host *host, tb_plugin_desc *out);

tb_status BAD_ENTRY(const tb_plugin_host *host, tb_plugin_desc *out) {
    host_api = host;
    memset(out, 0, sizeof *out);
    out->api_version = BAD_VERSION;
    out->name = BAD_NAME;
    out->tags = BAD_TAGS;
    out->impl.init = bad_init;
    out->impl.data_from_host = bad_data_from_host;
    out->impl.data_to_host = bad_data_to_host;
    out->impl.data_release = bad_data_release;
    out->impl.create_lowering_context = bad_lower;
    out->impl.compile = bad_compile;
#if !defined(TB_TEST_INCOMPLETE)
    out->impl.execute = bad_execute;
#else
    (void)bad_execute;
#endif
    out->impl.release_computation = bad_release_computation;
    out->impl.get_backend_devices = bad_devices;
#if defined(TB_TEST_ENTRYFAIL)
    return host->set_error(TB_ERR_UNSUPPORTED, "entryfail: refusing to load");
#else
    return TB_OK;
#endif
}

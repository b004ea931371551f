/* libFuzzer harness: the text parsers. The input (cut at its first NUL) goes to each of
   tb_shape_parse, tb_device_parse, tb_dtype_parse, tb_device_type_parse and tb_op_lookup. A
   parse either fails with an error message and leaves its output untouched, or its result
   prints back to a text that parses to the same value (and prints the same again). */
#include "fuzz_common.h"

static void parse_expect_failure(const char *what, tb_status st, const void *out,
                                 const void *marker, size_t size) {
    if (st == TB_OK) return;
    if (tb_last_status() != st || tb_last_error()[0] == '\0')
        fuzz_fail("%s failed with %s but no matching error", what, tb_status_string(st));
    if (memcmp(out, marker, size) != 0) fuzz_fail("%s changed its output on error", what);
}

static void parse_shape(const char *text) {
    tb_shape s, marker, again;
    char printed[400], reprinted[400];
    size_t n, cut;
    tb_status st;
    memset(&marker, 0x5a, sizeof marker);
    s = marker;
    tb_clear_error();
    st = tb_shape_parse(text, &s);
    parse_expect_failure("tb_shape_parse", st, &s, &marker, sizeof s);
    if (st != TB_OK) {
        if (st != TB_ERR_INVALID_ARGUMENT && st != TB_ERR_OVERFLOW)
            fuzz_fail("tb_shape_parse: status %s", tb_status_string(st));
        return;
    }
    if (tb_shape_validate(&s) != TB_OK) fuzz_fail("tb_shape_parse gave an invalid shape");
    n = tb_shape_format(&s, printed, sizeof printed);
    if (n >= sizeof printed) fuzz_fail("tb_shape_format: %zu bytes", n);
    again = marker;
    if (tb_shape_parse(printed, &again) != TB_OK || !tb_shape_equal(&s, &again))
        fuzz_fail("'%s' does not parse back to its shape", printed);
    tb_shape_format(&again, reprinted, sizeof reprinted);
    if (strcmp(printed, reprinted) != 0) fuzz_fail("'%s' prints as '%s'", printed, reprinted);
    /* a cut buffer holds a prefix of the text, NUL-terminated, and the length is the full one */
    cut = (size_t)(unsigned char)text[0] % (n + 2);
    memset(reprinted, 'x', sizeof reprinted);
    if (tb_shape_format(&s, reprinted, cut) != n) fuzz_fail("tb_shape_format's length");
    if (cut > 0 && (strlen(reprinted) != (cut - 1 < n ? cut - 1 : n) ||
                    strncmp(reprinted, printed, strlen(reprinted)) != 0))
        fuzz_fail("tb_shape_format into %zu bytes", cut);
}

static void parse_device(const char *text) {
    tb_device d, marker, again;
    char printed[128];
    tb_status st;
    memset(&marker, 0x5a, sizeof marker);
    d = marker;
    tb_clear_error();
    st = tb_device_parse(text, &d);
    parse_expect_failure("tb_device_parse", st, &d, &marker, sizeof d);
    if (st != TB_OK) return;
    if (tb_device_format(&d, printed, sizeof printed) >= sizeof printed)
        fuzz_fail("tb_device_format: too long");
    again = marker;
    if (tb_device_parse(printed, &again) != TB_OK || !tb_device_equal(&d, &again))
        fuzz_fail("'%s' does not parse back to its device", printed);
}

static void parse_small(const char *text) {
    tb_dtype dtype = (tb_dtype)77, back;
    tb_device_type type = (tb_device_type)77, back_type;
    tb_op op = -77, back_op;
    tb_clear_error();
    if (tb_dtype_parse(text, &dtype) == TB_OK) {
        if (!tb_dtype_is_valid(dtype)) fuzz_fail("tb_dtype_parse gave %d", (int)dtype);
        if (tb_dtype_parse(tb_dtype_name(dtype), &back) != TB_OK || back != dtype)
            fuzz_fail("dtype %s does not parse back", tb_dtype_name(dtype));
    } else if ((int)dtype != 77) {
        fuzz_fail("tb_dtype_parse changed its output on error");
    }
    tb_clear_error();
    if (tb_device_type_parse(text, &type) == TB_OK) {
        if (tb_device_type_parse(tb_device_type_name(type), &back_type) != TB_OK ||
            back_type != type)
            fuzz_fail("device type %s does not parse back", tb_device_type_name(type));
    } else if ((int)type != 77) {
        fuzz_fail("tb_device_type_parse changed its output on error");
    }
    tb_clear_error();
    if (tb_op_lookup(text, &op) == TB_OK) {
        const char *name = tb_op_name(op);
        if (name == NULL || tb_op_lookup(name, &back_op) != TB_OK || back_op != op)
            fuzz_fail("op %d does not look up by its name", (int)op);
    } else if (op != -77) {
        fuzz_fail("tb_op_lookup changed its output on error");
    }
}

static int fuzz_parse_one(const uint8_t *data, size_t size) {
    char *text = (char *)malloc(size + 1);
    if (text == NULL) return 0;
    if (size > 0) memcpy(text, data, size);
    text[size] = '\0';
    fuzz_setup();
    parse_shape(text);
    parse_device(text);
    parse_small(text);
    tb_clear_error();
    free(text);
    return 0;
}

#ifndef TB_FUZZ_NO_ENTRY
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    return fuzz_parse_one(data, size);
}
#endif

/* ===========================================================================================
   Printing tensors
   The layout is PyTorch's repr with its default print options (precision 4, line width 80,
   summarised past 1000 elements with 3 edge items), followed by the device and the dtype:
       tensor([[ 1.0000, -2.5000],
               [ 3.0000,  4.0000]], device='cpu:0', dtype=f32)
       tensor([0, 1, 2,  ..., 7, 8, 9], device='cpu:0', dtype=i64)
       tensor([], device='cpu:0', size=(0, 3), dtype=bool)
   Floats print as PyTorch chooses: fixed point with 4 decimals, integers as "1.", or
   scientific ("1.0000e+09") when the magnitudes span more than 1000x, pass 1e8 or fall below
   1e-4; integers in full; bool as True/False.
   =========================================================================================== */

/* Writes the text of the tensor's value (see above) into `buf` like snprintf: at most `cap`
   bytes including the terminating NUL, and *needed (may be NULL) is the length of the whole
   text without the NUL, so the text was cut when *needed >= cap. `buf` may be NULL when `cap`
   is 0 (ask for the length first, then allocate *needed + 1). Syncs this tensor only (its
   pending graph, as tb_tensor_to_host does) and copies its value to the host.
   Errors: NULL tensor (a NULL tensor from a failed op keeps that op's error), NULL buf with
   cap > 0, a failed sync, out of memory; on error *needed is 0 and buf (if cap > 0) holds "".
   Not thread-safe with other calls that record ops on or sync the same tensor. */
TBDEF tb_status tb_tensor_format(tb_tensor *tensor, char *buf, size_t cap, size_t *needed);
/* Prints the text of tb_tensor_format and a newline to the C library's stdout (a log hook does
   not see it). Errors as tb_tensor_format, and TB_ERR_IO when stdout cannot be written. Thread
   safety as tb_tensor_format; lines printed from several threads may interleave. */
TBDEF tb_status tb_tensor_print(tb_tensor *tensor);

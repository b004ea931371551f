/* ===========================================================================================
   Interop: .npy files
   =========================================================================================== */

/* Reads a .npy file (format 1.0 to 3.0, C order, f4 f8 i4 i8 u1 b1, little or big endian) into a
   new tensor on `device` (NULL: current). Fortran order, other dtypes, truncated files, headers
   that lie and shapes that overflow are TB_ERR_FORMAT with the reason. */
TBDEF tb_tensor *tb_npy_load(const char *path, const tb_device *device);
/* Writes the tensor's value (syncing it) as .npy 1.0 (2.0 if the header needs it), through a
   temporary file and a rename. */
TBDEF tb_status tb_npy_save(const char *path, tb_tensor *tensor);

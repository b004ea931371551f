/* ===========================================================================================
   OpenCL programs: the in-memory cache (shared by every computation with the same source), the
   disk cache of program binaries (diskcache.c), and the build.
   =========================================================================================== */
#include "../../impl_begin.h"

#ifndef TB_NO_OPENCL

#define TB__OCL_MAX_PROGRAMS 256

/* The disk cache's entries of OpenCL program binaries. */
static const tb__disk_format tb__ocl_disk_format = {"opencl", "TBOCLBIN", 2u, ".clbin"};

/* The bits of a program key that count: tests keep fewer to force key collisions. */
static uint64_t tb__ocl_program_key_mask = ~(uint64_t)0;

/* What a program binary depends on: the build options, the device and its driver, the
   platform, this library's version and the source. */
static void tb__ocl_program_disk_key(const tb__ocl_device *dev, const char *src, size_t len,
                                     tb__disk_key *key) {
    memset(key, 0, sizeof *key);
    tb__disk_key_add(key, dev->build_options, (size_t)-1);
    tb__disk_key_add(key, dev->info.name, (size_t)-1);
    tb__disk_key_add(key, dev->info.driver_version, (size_t)-1);
    tb__disk_key_add(key, dev->device_version, (size_t)-1);
    tb__disk_key_add(key, dev->platform_name, (size_t)-1);
    tb__disk_key_add(key, dev->platform_version, (size_t)-1);
    tb__disk_key_add(key, TB_VERSION_STRING, (size_t)-1);
    tb__disk_key_add(key, src, len);
}

/* A 128-bit hash of the key: the in-memory cache's key (a hit is confirmed by the source) and
   the name of the disk cache's entry. */
static void tb__ocl_program_key(const tb__ocl_device *dev, const char *src, size_t len,
                                uint64_t key[2]) {
    tb__disk_key k;
    tb__ocl_program_disk_key(dev, src, len, &k);
    tb__disk_key_hash(&k, tb__ocl_program_key_mask, key);
}

static char *tb__ocl_build_log(tb__ocl_device *dev, tb__cl_program prog) {
    size_t n = 0;
    char *log;
    if (TB__OCL_CALL(dev->rt, GetProgramBuildInfo)(prog, dev->id, TB__CL_PROGRAM_BUILD_LOG, 0, NULL,
                                                   &n) != TB__CL_SUCCESS)
        return NULL;
    log = (char *)tb__alloc(n + 1);
    if (log == NULL) return NULL;
    if (TB__OCL_CALL(dev->rt, GetProgramBuildInfo)(prog, dev->id, TB__CL_PROGRAM_BUILD_LOG, n, log,
                                                   NULL) != TB__CL_SUCCESS)
        n = 0;
    log[n] = '\0';
    return log;
}

static tb__cl_program tb__ocl_build_binary(tb__ocl_device *dev, const unsigned char *bin,
                                           size_t n) {
    tb__ocl_runtime *rt = dev->rt;
    tb__cl_int err = TB__CL_SUCCESS, status = TB__CL_SUCCESS;
    const unsigned char *bins[1];
    tb__cl_program prog;
    bins[0] = bin;
    prog =
        TB__OCL_CALL(rt, CreateProgramWithBinary)(dev->ctx, 1, &dev->id, &n, bins, &status, &err);
    if (prog == NULL || err != TB__CL_SUCCESS || status != TB__CL_SUCCESS) {
        if (prog != NULL) TB__OCL_CALL(rt, ReleaseProgram)(prog);
        return NULL;
    }
    if (TB__OCL_CALL(rt, BuildProgram)(prog, 1, &dev->id, dev->build_options, NULL, NULL) !=
        TB__CL_SUCCESS) {
        TB__OCL_CALL(rt, ReleaseProgram)(prog);
        return NULL;
    }
    return prog;
}

static unsigned char *tb__ocl_program_binary(tb__ocl_device *dev, tb__cl_program prog,
                                             size_t *size) {
    size_t n = 0;
    unsigned char *bin, *ptrs[1];
    if (TB__OCL_CALL(dev->rt, GetProgramInfo)(prog, TB__CL_PROGRAM_BINARY_SIZES, sizeof n, &n,
                                              NULL) != TB__CL_SUCCESS ||
        n == 0)
        return NULL;
    bin = (unsigned char *)tb__alloc(n);
    if (bin == NULL) return NULL;
    ptrs[0] = bin;
    if (TB__OCL_CALL(dev->rt, GetProgramInfo)(prog, TB__CL_PROGRAM_BINARIES, sizeof ptrs, ptrs,
                                              NULL) != TB__CL_SUCCESS) {
        tb__free(bin);
        return NULL;
    }
    *size = n;
    return bin;
}

/* Writes a program's binary to the disk cache once, if that is still to do. The binary is
   read only now: PoCL, for one, serialises it at the first request, with the kernels compiled
   by then. */
static void tb__ocl_program_save(tb__ocl_device *dev, tb__ocl_program *p) {
    if (p->save_dir != NULL) {
        size_t n = 0;
        unsigned char *bin = tb__ocl_program_binary(dev, p->program, &n);
        tb__disk_key key;
        tb__ocl_program_disk_key(dev, p->base.source, p->base.source_len, &key);
        tb__disk_store(&tb__ocl_disk_format, p->save_dir, &key, p->base.key,
                       &dev->rt->cache_dir_reported, bin, n);
        tb__free(bin);
    }
    tb__free(p->save_dir);
    p->save_dir = NULL;
}

/* a program out of the cache: its binary saved if it was waiting for it, then released */
static void tb__ocl_program_drop(void *ctx, tb__kit_prog *base) {
    tb__ocl_device *dev = (tb__ocl_device *)ctx;
    tb__ocl_program *p = (tb__ocl_program *)base;
    tb__ocl_program_save(dev, p);
    if (p->program != NULL) TB__OCL_CALL(dev->rt, ReleaseProgram)(p->program);
    tb__free(p->base.source);
    tb__free(p);
}

static void tb__ocl_program_unref(tb__ocl_device *dev, tb__ocl_program *p) {
    if (p != NULL) tb__kit_prog_unref(&dev->programs, &p->base, tb__ocl_program_drop, dev);
}

/* Drops cached programs no computation uses, oldest first, until at most `keep` remain. */
static void tb__ocl_programs_trim(tb__ocl_device *dev, size_t keep) {
    tb__kit_progs_trim(&dev->programs, keep, tb__ocl_program_drop, dev);
}

/* Whether the device's driver keeps what it compiles on disk itself: PoCL with its kernel
   cache on (POCL_KERNEL_CACHE unset or not 0). Its programs' binaries are then not written to
   ours: PoCL compiles every kernel once more to serialise a program (a ResNet-18 forward's
   first run took 9.2 s with that write and 3.9 s without). A later process finds the
   program and its kernels in PoCL's cache, but slower than in ours: PoCL preprocesses the
   source to look it up, about 24 ms a program where a binary of ours loads in about 1 ms.
   A model's graphs are few programs; a process of hundreds of small graphs is better served
   by POCL_KERNEL_CACHE=0 (the README's "OpenCL"). */
static bool tb__ocl_driver_caches(const tb__ocl_device *dev) {
    const char *v = tb__getenv("POCL_KERNEL_CACHE");
    return strstr(dev->platform_name, "Portable Computing Language") != NULL &&
           (v == NULL || strcmp(v, "0") != 0);
}

/* The program from the disk cache, or NULL (then *save_dir is the folder to write it to after
   its first run, or NULL when the disk cache is off or not usable, or the driver caches its
   programs itself: tb__ocl_driver_caches). An entry that is there but cannot be used (another
   key, damaged, not a regular file of ours, a binary the driver does not take) is removed and
   counted: the program built now takes its place. */
static tb__cl_program tb__ocl_disk_load(tb__ocl_device *dev, const char *src, size_t len,
                                        const uint64_t key[2], char **save_dir) {
    tb__cl_program prog = NULL;
    tb__disk_key dkey;
    unsigned char *bin;
    char *path = NULL;
    const char *why = NULL;
    size_t n = 0;
    tb__ocl_program_disk_key(dev, src, len, &dkey);
    bin = tb__disk_lookup(&tb__ocl_disk_format, &dkey, key, &dev->rt->cache_dir_reported, &n,
                          save_dir, &path, &why);
    if (path == NULL) return NULL; /* the cache is off or its folder not usable */
    if (bin != NULL) {
        prog = tb__ocl_build_binary(dev, bin, n);
        if (prog == NULL) {
            why = "a binary the driver does not load";
            *save_dir = tb__disk_cache_path();
        }
    }
    if (prog != NULL) {
        (void)TB__ATOMIC_ADD(&dev->stats.disk_hits, 1);
        tb__ocl_metric(dev, "OpenCL::DiskCacheHit", 1);
        tb__progress_from_disk();
    } else {
        (void)TB__ATOMIC_ADD(&dev->stats.disk_misses, 1);
        tb__ocl_metric(dev, "OpenCL::DiskCacheMiss", 1);
        if (why != NULL) {
            if (tb_debug_level() >= 1) {
                tb_log_message(TB_LOG_INFO, "opencl:%d: program cache file %s not used: %s",
                               (int)dev->ordinal, path, why);
            }
            tb__disk_reject(path);
            (void)TB__ATOMIC_ADD(&dev->stats.disk_rejected, 1);
            tb__ocl_metric(dev, "OpenCL::DiskCacheRejected", 1);
        }
    }
    if (prog == NULL && *save_dir != NULL && tb__ocl_driver_caches(dev)) {
        tb__free(*save_dir);
        *save_dir = NULL;
    }
    tb__free(bin);
    tb__free(path);
    return prog;
}

/* The cached program of a source, with a reference for the caller, or NULL. `count`: the
   lookup counts its hit or its key collisions. Call with the device's lock held. */
static tb__ocl_program *tb__ocl_program_find(tb__ocl_device *dev, const uint64_t key[2],
                                             const char *src, size_t len, bool count) {
    int64_t collisions = 0;
    tb__kit_prog *p = tb__kit_prog_find(dev->programs, key, src, len, &collisions);
    if (count && collisions > 0) tb__ocl_metric(dev, "OpenCL::ProgramKeyCollision", collisions);
    if (count && p != NULL) tb__ocl_metric(dev, "OpenCL::ProgramCacheHit", 1);
    return (tb__ocl_program *)p;
}

/* Builds a program from source; NULL with the error set (the build log in the message). */
static tb__cl_program tb__ocl_build_source(tb__ocl_device *dev, const char *src, size_t len) {
    tb__ocl_runtime *rt = dev->rt;
    tb__cl_int err = TB__CL_SUCCESS;
    const char *srcs[1];
    tb__cl_program prog;
    char *log;
    srcs[0] = src;
    prog = TB__OCL_CALL(rt, CreateProgramWithSource)(dev->ctx, 1, srcs, &len, &err);
    if (prog == NULL || err != TB__CL_SUCCESS) {
        tb__error(TB_ERR_COMPILE, "opencl:%d: clCreateProgramWithSource failed: %s (%d)",
                  (int)dev->ordinal, tb__cl_error_name(err), (int)err);
        return NULL;
    }
    (void)TB__ATOMIC_ADD(&dev->stats.builds, 1);
    tb__ocl_metric(dev, "OpenCL::ProgramBuild", 1);
    err = TB__OCL_CALL(rt, BuildProgram)(prog, 1, &dev->id, dev->build_options, NULL, NULL);
    if (err == TB__CL_SUCCESS) return prog;
    log = tb__ocl_build_log(dev, prog);
    if (log != NULL && tb_debug_level() >= 1) {
        tb_log_message(TB_LOG_ERROR, "opencl:%d: build log:\n%s", (int)dev->ordinal, log);
    }
    tb__error(TB_ERR_COMPILE,
              "opencl:%d (%s): the program does not build: %s (%d); "
              "build log:\n%.800s",
              (int)dev->ordinal, dev->info.name, tb__cl_error_name(err), (int)err,
              log != NULL ? log : "(none)");
    tb__free(log);
    TB__OCL_CALL(rt, ReleaseProgram)(prog);
    return NULL;
}

/* The built program for a source: from memory, from the disk cache, or built now. Call
   without the device's lock (it is taken to look the cache up and to add to it; the build runs
   without it, so another device, or another graph of this one, runs meanwhile). Two threads
   building one source at once both build it; the first to finish is kept. */
static tb_status tb__ocl_get_program(tb__ocl_device *dev, const char *src, size_t len,
                                     tb__ocl_program **out) {
    uint64_t key[2];
    tb__ocl_program *p;
    tb__cl_program prog;
    char *save_dir = NULL, *source;
    tb__ocl_program_key(dev, src, len, key);
    tb__ocl_device_lock(dev);
    p = tb__ocl_program_find(dev, key, src, len, true);
    tb__ocl_device_release(dev);
    if (p != NULL) {
        *out = p;
        return TB_OK;
    }
    source = (char *)tb__alloc(len + 1);
    if (source == NULL) return TB_ERR_OUT_OF_MEMORY;
    memcpy(source, src, len);
    source[len] = '\0';
    prog = tb__ocl_disk_load(dev, src, len, key, &save_dir);
    if (prog == NULL) prog = tb__ocl_build_source(dev, src, len);
    p = prog != NULL ? (tb__ocl_program *)tb__calloc(1, sizeof *p) : NULL;
    if (p == NULL) {
        tb_status st = prog != NULL ? TB_ERR_OUT_OF_MEMORY : tb_last_status();
        if (prog != NULL) TB__OCL_CALL(dev->rt, ReleaseProgram)(prog);
        tb__free(save_dir);
        tb__free(source);
        return st;
    }
    p->base.key[0] = key[0];
    p->base.key[1] = key[1];
    p->base.source = source;
    p->base.source_len = len;
    p->program = prog;
    p->save_dir = save_dir; /* written after the first run (tb__ocl_program_save) */
    p->base.refcount = 2;   /* the cache and the caller */
    tb__ocl_device_lock(dev);
    *out = tb__ocl_program_find(dev, key, src, len, false);
    if (*out == NULL) {
        p->base.next = dev->programs;
        dev->programs = &p->base;
        tb__ocl_programs_trim(dev, TB__OCL_MAX_PROGRAMS);
        *out = p;
        p = NULL;
    }
    tb__ocl_device_release(dev);
    if (p != NULL) { /* built meanwhile by another thread: theirs is kept */
        TB__OCL_CALL(dev->rt, ReleaseProgram)(p->program);
        tb__free(p->save_dir);
        tb__free(p->base.source);
        tb__free(p);
    }
    return TB_OK;
}

#endif /* TB_NO_OPENCL */

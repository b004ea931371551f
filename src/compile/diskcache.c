/* ===========================================================================================
   The disk cache of compiled programs, shared by the compiled backends (OpenCL program
   binaries, native shared objects). One folder ($TB_CACHE_DIR, else $XDG_CACHE_HOME or
   ~/.cache, then torch_backend/), private (0700, ours, not writable by others); one file per
   program, named by a 128-bit hash of its key and holding the whole key, so that a hit is
   confirmed byte for byte. Entries are written to a fresh temporary file (O_EXCL) and renamed
   into place, read without following links or blocking on FIFOs, and a bad one (or one that
   others may write to) is removed. The folder is bounded: past TB_CACHE_MAX bytes, the entries
   used least recently (a hit touches its entry's modification time) are removed.

   An entry, <folder>/<key hash as 32 hex digits><suffix>:
     0  magic (8 bytes)    8 .. 11  format version   12 .. 15  header size
    16  key hash (2 x 8)  32  key size K           40  payload size N
    48  XXH64 of the key and the payload (finds torn and damaged files)    56  zero
    64  the key (K bytes): tb__disk_key_bytes of the key's parts
    64 + K  the payload (N bytes)
   Numbers are little-endian.
   =========================================================================================== */
#include "../impl_begin.h"

#if defined(TB__HAVE_COMPILED_BACKENDS)

#if !defined(_WIN32)
#include <ctype.h>
#include <dirent.h>
#include <utime.h>
#endif

#define TB__DISK_HEADER    64u
#define TB__DISK_MAX       ((uint64_t)1 << 30) /* no payload of ours is bigger */
#define TB__DISK_SEED      0x636c62696e617279ull
#define TB__DISK_TMP_TRIES 16
/* the cap when TB_CACHE_MAX is unset: room for the programs of many models */
#define TB__DISK_DEFAULT_MAX ((uint64_t)1 << 30)
/* a temporary file this old was left by a process that died while writing it */
#define TB__DISK_STALE_TMP_S 3600

/* The disk cache opens its files without following links (O_NOFOLLOW, POSIX 2008). glibc
   hides the name under a strict -std when the feature macros come after its first header (our
   own public part includes <stdint.h>), but always defines the value under another name.
   Without it the cache is off. */
#if defined(O_NOFOLLOW)
#define TB__DISK_O_NOFOLLOW O_NOFOLLOW
#elif defined(__O_NOFOLLOW)
#define TB__DISK_O_NOFOLLOW __O_NOFOLLOW
#endif
#if defined(O_CLOEXEC)
#define TB__DISK_O_CLOEXEC O_CLOEXEC
#elif defined(__O_CLOEXEC)
#define TB__DISK_O_CLOEXEC __O_CLOEXEC
#else
#define TB__DISK_O_CLOEXEC 0
#endif
#if !defined(_WIN32) && defined(TB__DISK_O_NOFOLLOW) && defined(O_NONBLOCK)
#define TB__DISK_CACHE 1
#else
#define TB__DISK_CACHE 0
#endif

/* Names temporary files of the disk cache apart (atomic: compiles run on several threads). */
static TB__UNUSED uint32_t tb__disk_counter = 0;

static void tb__disk_put64(unsigned char *p, uint64_t v) {
    int i;
    for (i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static TB__UNUSED uint64_t tb__disk_get64(const unsigned char *p) {
    uint64_t v = 0;
    int i;
    for (i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* A 128-bit hash of a key's parts (each as its length and its bytes), masked by `mask`. */
static void tb__disk_key_hash(const tb__disk_key *key, uint64_t mask, uint64_t out[2]) {
    static const uint64_t seeds[2] = {0x746270726f677231ull, 0x746270726f677232ull};
    size_t i;
    int s;
    for (s = 0; s < 2; s++) {
        uint64_t h = seeds[s];
        for (i = 0; i < key->count; i++) {
            h = tb__hash_u64(h, (uint64_t)key->lens[i]);
            h = tb__hash_bytes(h, key->parts[i], key->lens[i]);
        }
        out[s] = h & mask;
    }
}

/* Adds a part (a NUL-terminated text when len is (size_t)-1). False when the key is full. */
static bool tb__disk_key_add(tb__disk_key *key, const char *part, size_t len) {
    if (key->count >= TB__DISK_MAX_PARTS) return false;
    key->parts[key->count] = part != NULL ? part : "";
    key->lens[key->count] = len == (size_t)-1 ? strlen(key->parts[key->count]) : len;
    key->count++;
    return true;
}

#if TB__DISK_CACHE

/* The full key an entry stores: each part as its length (8 bytes) and its bytes. NULL when
   out of memory. */
static unsigned char *tb__disk_key_bytes(const tb__disk_key *key, size_t *size) {
    size_t total = 0, i;
    unsigned char *out, *at;
    for (i = 0; i < key->count; i++) {
        if (key->lens[i] > SIZE_MAX / 2 - total - 8) return NULL;
        total += 8 + key->lens[i];
    }
    out = (unsigned char *)tb__alloc(total > 0 ? total : 1);
    if (out == NULL) return NULL;
    for (at = out, i = 0; i < key->count; i++) {
        tb__disk_put64(at, (uint64_t)key->lens[i]);
        memcpy(at + 8, key->parts[i], key->lens[i]);
        at += 8 + key->lens[i];
    }
    *size = total;
    return out;
}

static uint64_t tb__disk_checksum(const unsigned char *key, size_t key_size,
                                  const unsigned char *payload, size_t n) {
    return tb__hash_bytes(tb__hash_bytes(TB__DISK_SEED, key, key_size), payload, n);
}

static bool tb__disk_read_all(int fd, void *buf, size_t n) {
    unsigned char *p = (unsigned char *)buf;
    while (n > 0) {
        ssize_t got = read(fd, p, n);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return false;
        p += got;
        n -= (size_t)got;
    }
    return true;
}

static bool tb__disk_write_all(int fd, const void *buf, size_t n) {
    const unsigned char *p = (const unsigned char *)buf;
    while (n > 0) {
        ssize_t put = write(fd, p, n);
        if (put < 0 && errno == EINTR) continue;
        if (put <= 0) return false;
        p += put;
        n -= (size_t)put;
    }
    return true;
}

/* True for the first caller only (threads may race to say why a folder is not used). */
static bool tb__disk_first_report(int32_t *reported) {
    if (TB__ATOMIC_LOAD(reported) != 0) return false;
    return TB__ATOMIC_ADD(reported, 1) == 1;
}

/* The cache folder's path (not yet created or checked), or NULL when the cache is off. */
static char *tb__disk_cache_path(void) {
    const char *env = tb__getenv("TB_CACHE_DIR");
    if (env != NULL) {
        if (strcmp(env, "off") == 0 || env[0] == '\0') return NULL;
        return tb__strdup(env);
    }
    if (tb__getenv("XDG_CACHE_HOME") != NULL && tb__getenv("XDG_CACHE_HOME")[0] != '\0')
        return tb__format("%s/torch_backend", tb__getenv("XDG_CACHE_HOME"));
    if (tb__getenv("HOME") != NULL && tb__getenv("HOME")[0] != '\0')
        return tb__format("%s/.cache/torch_backend", tb__getenv("HOME"));
    return NULL;
}

/* Whether the cache folder `dir` may be used, creating it and its missing parents private
   (0700). A folder that is not ours or that others may write to is not used: they could put a
   program there that we would run. Why a folder is not used is said once per *reported flag
   (atomic) (at TB_DEBUG for a folder that is not private, as a warning when it cannot be made);
   `who` names the backend in the message. Entries are checked one by one too (tb__disk_read: a
   regular file of ours, holding our whole key), so a folder swapped after this check gives
   nothing that we did not write ourselves. */
static bool tb__disk_cache_usable(const char *who, const char *dir, int32_t *reported) {
    char *copy = tb__strdup(dir), *p;
    struct stat st;
    if (copy == NULL) return false;
    for (p = copy + 1; *p != '\0'; p++) {
        if (*p != '/') continue;
        *p = '\0';
        (void)mkdir(copy, 0700);
        *p = '/';
    }
    (void)mkdir(copy, 0700);
    tb__free(copy);
    /* a link to the folder itself is followed: a user may keep the cache elsewhere */
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        const char *why = stat(dir, &st) != 0 ? strerror(errno) : "not a folder";
        if (tb__disk_first_report(reported)) {
            tb_log_message(TB_LOG_WARN, "%s: the program cache folder %s is not usable: %s", who,
                           dir, why);
        }
        return false;
    }
    if (st.st_uid != geteuid() || (st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
        if (tb__disk_first_report(reported) && tb_debug_level() >= 1) {
            tb_log_message(TB_LOG_WARN,
                           "%s: the program cache folder %s is not used: %s (make it yours "
                           "with mode 0700, or set TB_CACHE_DIR)",
                           who, dir,
                           st.st_uid != geteuid() ? "another user owns it"
                                                  : "it is writable by others");
        }
        *reported = true;
        return false;
    }
    return true;
}

/* The payload of the entry at `path` if it holds the key `kb`, else NULL; then `*why` says what
   is wrong with the file there, or is NULL when there is none. The file is opened without
   following a link or waiting on a FIFO, and read only if it is a regular file of ours whose
   size is that of an entry for this key. */
static unsigned char *tb__disk_read(const tb__disk_format *fmt, const char *path,
                                    const uint64_t key[2], const unsigned char *kb, size_t kn,
                                    size_t *size, const char **why) {
    unsigned char header[TB__DISK_HEADER];
    unsigned char *stored = NULL, *payload = NULL;
    uint64_t n = 0, size_of_entry;
    struct stat st;
    int fd =
        open(path, O_RDONLY | TB__DISK_O_NOFOLLOW | O_NONBLOCK | TB__DISK_O_CLOEXEC | O_NOCTTY);
    *why = NULL;
    if (fd < 0) {
        if (errno != ENOENT) *why = errno == ELOOP ? "a symbolic link" : strerror(errno);
        return NULL;
    }
    if (fstat(fd, &st) != 0) {
        *why = strerror(errno);
    } else if (!S_ISREG(st.st_mode)) {
        *why = "not a regular file";
    } else if (st.st_uid != geteuid()) {
        *why = "owned by another user";
    } else if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
        /* anyone who may write it may rewrite it with a checksum that matches */
        *why = "writable by others";
    } else if (st.st_size < 0 || (uint64_t)st.st_size <= (uint64_t)TB__DISK_HEADER + kn ||
               (uint64_t)st.st_size > (uint64_t)TB__DISK_HEADER + kn + TB__DISK_MAX) {
        *why = "not the size of an entry for this key";
    } else if (!tb__disk_read_all(fd, header, sizeof header)) {
        *why = "truncated";
    } else {
        size_of_entry = (uint64_t)st.st_size;
        n = tb__disk_get64(header + 40);
        if (memcmp(header, fmt->magic, 8) != 0 ||
            tb__disk_get64(header + 8) !=
                ((uint64_t)fmt->version | ((uint64_t)TB__DISK_HEADER << 32))) {
            *why = "not an entry of this format";
        } else if (tb__disk_get64(header + 16) != key[0] || tb__disk_get64(header + 24) != key[1] ||
                   tb__disk_get64(header + 32) != (uint64_t)kn) {
            *why = "an entry for another key";
        } else if (n == 0 || n != size_of_entry - TB__DISK_HEADER - kn) {
            *why = "truncated";
        } else if ((stored = (unsigned char *)tb__alloc(kn > 0 ? kn : 1)) == NULL ||
                   (payload = (unsigned char *)tb__alloc((size_t)n)) == NULL) {
            *why = "out of memory";
        } else if (!tb__disk_read_all(fd, stored, kn) ||
                   !tb__disk_read_all(fd, payload, (size_t)n)) {
            *why = "truncated";
        } else if (memcmp(stored, kb, kn) != 0) {
            *why = "an entry for another key";
        } else if (tb__disk_checksum(stored, kn, payload, (size_t)n) !=
                   tb__disk_get64(header + 48)) {
            *why = "damaged (checksum)";
        }
    }
    close(fd);
    tb__free(stored);
    if (*why != NULL) {
        tb__free(payload);
        return NULL;
    }
    *size = (size_t)n;
    return payload;
}

/* Writes the entry `name` of the folder `dir`: into a new temporary file of the folder (O_EXCL:
   never through a link nor into a file that is there), in full, then renamed over the entry,
   so that a reader sees the old entry, no entry or the whole new one. */
static void tb__disk_write(const tb__disk_format *fmt, const char *dir, const char *name,
                           const uint64_t key[2], const unsigned char *kb, size_t kn,
                           const unsigned char *payload, size_t n) {
    unsigned char header[TB__DISK_HEADER];
    char *tmp = NULL, *path;
    int fd = -1, tries;
    bool ok;
    int err;
    memset(header, 0, sizeof header);
    memcpy(header, fmt->magic, 8);
    tb__disk_put64(header + 8, (uint64_t)fmt->version | ((uint64_t)TB__DISK_HEADER << 32));
    tb__disk_put64(header + 16, key[0]);
    tb__disk_put64(header + 24, key[1]);
    tb__disk_put64(header + 32, (uint64_t)kn);
    tb__disk_put64(header + 40, (uint64_t)n);
    tb__disk_put64(header + 48, tb__disk_checksum(kb, kn, payload, n));
    path = tb__format("%s/%s", dir, name);
    if (path == NULL) return;
    for (tries = 0; tries < TB__DISK_TMP_TRIES && fd < 0; tries++) {
        unsigned serial = (unsigned)(TB__ATOMIC_ADD(&tb__disk_counter, 1) - 1);
        tb__free(tmp);
        tmp = tb__format("%s/.%016llx%016llx.%ld.%u.tmp", dir, (unsigned long long)key[0],
                         (unsigned long long)key[1], (long)getpid(), serial);
        if (tmp == NULL) break;
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | TB__DISK_O_CLOEXEC | O_NOCTTY, 0600);
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) {
        if (tmp != NULL) {
            tb_log_message(TB_LOG_WARN, "%s: cannot write the program cache file %s: %s", fmt->who,
                           tmp, strerror(errno));
        }
        tb__free(tmp);
        tb__free(path);
        return;
    }
    /* errno is read at the call that failed (close and rename may change it on success, and a
       short write need not set it) */
    errno = 0;
    ok = tb__disk_write_all(fd, header, sizeof header) && tb__disk_write_all(fd, kb, kn) &&
         tb__disk_write_all(fd, payload, n);
    err = ok ? 0 : (errno != 0 ? errno : EIO);
    if (close(fd) != 0 && ok) {
        ok = false;
        err = errno != 0 ? errno : EIO;
    }
    if (ok && rename(tmp, path) != 0) {
        ok = false;
        err = errno != 0 ? errno : EIO;
    }
    if (!ok) {
        tb_log_message(TB_LOG_WARN, "%s: cannot write the program cache file %s: %s", fmt->who,
                       path, strerror(err));
        (void)unlink(tmp);
    }
    tb__free(tmp);
    tb__free(path);
}

/* TB_CACHE_MAX, the cap of the cache folder in bytes: a whole number with an optional K, M
   or G (powers of 1024); 0 means no cap; unset or empty, TB__DISK_DEFAULT_MAX. A bad value is
   said once (a warning) and the default kept. */
static uint64_t tb__disk_cap(void) {
    static int32_t reported = 0;
    const char *v = tb__getenv("TB_CACHE_MAX");
    char *end = NULL;
    unsigned long long n;
    unsigned shift = 0;
    if (v == NULL || v[0] == '\0') return TB__DISK_DEFAULT_MAX;
    errno = 0;
    n = v[0] >= '0' && v[0] <= '9' ? strtoull(v, &end, 10) : 0;
    if (end != NULL && (*end == 'K' || *end == 'k'))
        shift = 10, end++;
    else if (end != NULL && (*end == 'M' || *end == 'm'))
        shift = 20, end++;
    else if (end != NULL && (*end == 'G' || *end == 'g'))
        shift = 30, end++;
    if (end == NULL || end == v || *end != '\0' || errno != 0 || n > (UINT64_MAX >> shift)) {
        if (tb__disk_first_report(&reported)) {
            tb_log_message(TB_LOG_WARN,
                           "TB_CACHE_MAX='%.64s' is not a size (bytes, or a number with K, M or "
                           "G; 0: no cap); using 1G",
                           v);
        }
        return TB__DISK_DEFAULT_MAX;
    }
    return (uint64_t)n << shift;
}

/* Whether `name` is an entry's (32 hex digits, then a suffix), or a temporary file of one
   (tb__disk_write's ".<32 hex digits>.<pid>.<serial>.tmp"). */
static bool tb__disk_is_ours(const char *name, bool *tmp) {
    size_t i, n = strlen(name);
    *tmp = name[0] == '.';
    for (i = 0; i < 32; i++)
        if (!isxdigit((unsigned char)name[*tmp + i])) return false;
    return *tmp ? n > 37 && strcmp(name + n - 4, ".tmp") == 0 : name[32] == '.';
}

/* A file's modification time in nanoseconds where the C library says them (entries written
   or used within one second are still told apart), else in seconds. */
static int64_t tb__disk_mtime_ns(const struct stat *st) {
#if defined(st_mtime) /* POSIX 2008's st_mtim, st_mtime its seconds */
    return (int64_t)st->st_mtim.tv_sec * 1000000000 + (int64_t)st->st_mtim.tv_nsec;
#elif defined(__GLIBC__) /* glibc's name when POSIX 2008's is hidden */
    return (int64_t)st->st_mtime * 1000000000 + (int64_t)st->st_mtimensec;
#else
    return (int64_t)st->st_mtime * 1000000000;
#endif
}

typedef struct tb__disk_file {
    char *name;
    uint64_t bytes;
    int64_t used; /* modification time in ns: written or last read */
} tb__disk_file;

static int tb__disk_by_use(const void *a, const void *b) {
    const tb__disk_file *x = (const tb__disk_file *)a, *y = (const tb__disk_file *)b;
    if (x->used != y->used) return x->used < y->used ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* Once the entries of the folder `dir` pass `cap` bytes (0: no cap), removes the least
   recently used until they take at most three quarters of it, never the entry `keep` just
   written; temporary files left by a process that died while writing go too. Only regular
   files of ours with an entry's name are counted or removed. Processes sharing the folder may
   trim at once: a removal is an unlink, a reader that has an entry open reads it whole, and
   removing what another process removed first is no error. */
static uint64_t tb__disk_trim(const char *dir, const char *keep, uint64_t cap) {
    DIR *d;
    struct dirent *e;
    tb__disk_file *files = NULL;
    size_t count = 0, capacity = 0, i;
    uint64_t total = 0;
    int64_t now = (int64_t)time(NULL);
    if (cap == 0 || (d = opendir(dir)) == NULL) return 0;
    while ((e = readdir(d)) != NULL) {
        struct stat st;
        bool tmp;
        char *path;
        int fd;
        if (!tb__disk_is_ours(e->d_name, &tmp)) continue;
        path = tb__format("%s/%s", dir, e->d_name);
        if (path == NULL) break;
        fd =
            open(path, O_RDONLY | TB__DISK_O_NOFOLLOW | O_NONBLOCK | TB__DISK_O_CLOEXEC | O_NOCTTY);
        if (fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid()) {
            if (tmp) {
                if (now - (int64_t)st.st_mtime > TB__DISK_STALE_TMP_S) (void)unlink(path);
            } else if (tb__grow((void **)&files, &capacity, count + 1, sizeof *files) == TB_OK &&
                       (files[count].name = tb__strdup(e->d_name)) != NULL) {
                files[count].bytes = (uint64_t)st.st_size;
                files[count].used = tb__disk_mtime_ns(&st);
                total += files[count].bytes;
                count++;
            }
        }
        if (fd >= 0) close(fd);
        tb__free(path);
    }
    closedir(d);
    if (total > cap) {
        qsort(files, count, sizeof *files, tb__disk_by_use);
        size_t removed = 0;
        for (i = 0; i < count && total > cap / 4 * 3; i++) {
            char *path;
            if (strcmp(files[i].name, keep) == 0) continue;
            path = tb__format("%s/%s", dir, files[i].name);
            if (path != NULL && (unlink(path) == 0 || errno == ENOENT)) {
                total -= files[i].bytes;
                removed++;
            }
            tb__free(path);
        }
        if (tb_debug_level() >= 1)
            tb_log_message(TB_LOG_INFO,
                           "program cache %s: %zu least recently used entries removed "
                           "(TB_CACHE_MAX %llu bytes)",
                           dir, removed, (unsigned long long)cap);
    }
    for (i = 0; i < count; i++)
        tb__free(files[i].name);
    tb__free(files);
    return total;
}

/* What this process knows of the folder's size (its last scan plus what it wrote since; other
   processes' entries are seen at the next scan), and the stores since that scan. */
static uint64_t tb__disk_known_bytes = 0, tb__disk_known_dir = 0;
static uint32_t tb__disk_stores = 0;
static tb__mutex tb__disk_trim_mutex = TB__MUTEX_INIT;

/* After a store of `bytes`: the folder is scanned (tb__disk_trim) at the first store into it,
   when what is known of it passes the cap, and every 64th store (others may write to it too),
   not at every store: a scan opens every entry. */
static void tb__disk_maybe_trim(const char *dir, const char *keep, uint64_t bytes) {
    uint64_t cap = tb__disk_cap(), which = tb__hash_bytes(0x646972ull, dir, strlen(dir));
    bool scan;
    if (cap == 0) return;
    tb__mutex_lock(&tb__disk_trim_mutex);
    tb__disk_known_bytes += bytes;
    scan = which != tb__disk_known_dir || ++tb__disk_stores % 64 == 0 || tb__disk_known_bytes > cap;
    tb__disk_known_dir = which;
    if (scan) tb__disk_known_bytes = tb__disk_trim(dir, keep, cap);
    tb__mutex_unlock(&tb__disk_trim_mutex);
}

#endif /* TB__DISK_CACHE */

static void tb__disk_entry_name(const tb__disk_format *fmt, const uint64_t key[2], char name[64]) {
    snprintf(name, 64, "%016llx%016llx%s", (unsigned long long)key[0], (unsigned long long)key[1],
             fmt->suffix);
}

/* Looks the entry of `key` up. Returns its payload (caller frees) or NULL. On NULL,
   *save_dir is the folder to write the program to once it is built (caller frees; NULL when
   the cache is off or its folder not usable). A payload the caller then cannot use goes to
   tb__disk_reject. *path (caller frees) is the entry's path, for tb__disk_reject. */
static unsigned char *tb__disk_lookup(const tb__disk_format *fmt, const tb__disk_key *key,
                                      const uint64_t hash[2], int32_t *reported, size_t *size,
                                      char **save_dir, char **path, const char **why) {
#if TB__DISK_CACHE
    char *dir = tb__disk_cache_path(), name[64];
    unsigned char *kb = NULL, *payload = NULL;
    size_t kn = 0;
    *save_dir = NULL;
    *path = NULL;
    *why = NULL;
    if (dir == NULL) return NULL;
    tb__disk_entry_name(fmt, hash, name);
    *path = tb__disk_cache_usable(fmt->who, dir, reported) ? tb__format("%s/%s", dir, name) : NULL;
    if (*path == NULL) {
        tb__free(dir);
        return NULL;
    }
    kb = tb__disk_key_bytes(key, &kn);
    if (kb != NULL) payload = tb__disk_read(fmt, *path, hash, kb, kn, size, why);
    tb__free(kb);
    if (payload != NULL) {
        (void)utime(*path, NULL); /* used now: the last to go when the folder is trimmed */
        tb__free(dir);
    } else {
        *save_dir = dir;
    }
    return payload;
#else
    (void)fmt, (void)key, (void)hash, (void)reported, (void)size;
    *save_dir = NULL;
    *path = NULL;
    *why = NULL;
    return NULL;
#endif
}

/* Removes an entry that is there but cannot be used (a link itself, never what it points to). */
static void tb__disk_reject(const char *path) {
#if TB__DISK_CACHE
    if (path != NULL) (void)unlink(path);
#else
    (void)path;
#endif
}

/* Writes `payload` as the entry of `key` in the folder `dir` (from tb__disk_lookup). */
static void tb__disk_store(const tb__disk_format *fmt, const char *dir, const tb__disk_key *key,
                           const uint64_t hash[2], int32_t *reported, const unsigned char *payload,
                           size_t n) {
#if TB__DISK_CACHE
    size_t kn = 0;
    unsigned char *kb;
    char name[64];
    if (dir == NULL || payload == NULL) return;
    kb = tb__disk_key_bytes(key, &kn);
    if (kb != NULL && tb__disk_cache_usable(fmt->who, dir, reported)) {
        tb__disk_entry_name(fmt, hash, name);
        tb__disk_write(fmt, dir, name, hash, kb, kn, payload, n);
        tb__disk_maybe_trim(dir, name, (uint64_t)n + kn + TB__DISK_HEADER);
    }
    tb__free(kb);
#else
    (void)fmt, (void)dir, (void)key, (void)hash, (void)reported, (void)payload, (void)n;
#endif
}

#endif /* TB__HAVE_COMPILED_BACKENDS */

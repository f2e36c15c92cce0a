/*
 * The shipped file's launcher: tools/build_dist.py puts it in front of the plugin's bundle.
 *
 * The shipped file is this program, then the PyInstaller bundle as a gzip'd ustar archive,
 * then one text line that names the build and says where the archive lies:
 *
 *     NAME bundle version=V key=K glibc=2.M offset=O size=S
 *
 * Every launch reads that line, finds the build's directory in the cache and execs the plugin
 * in it, so the plugin keeps the process ID Nomad started. The first launch of a build unpacks
 * the archive there first. zlib is linked in and the archive is read here, so no other program
 * is needed: a Nomad client may start plugins with an empty PATH, or on an image without
 * coreutils, tar or gzip. The rules (where the cache is, the atomic rename, which builds are
 * kept) are the ones docs/operator.md states under "The executable".
 *
 * Built by zig cc for glibc 2.17's symbol versions (tools/build_python.py), so it starts on
 * any node the bundle can run on, and on an older one says which glibc it needs.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <gnu/libc-version.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#ifndef NAME
#error "NAME (the plugin's name) must be defined"
#endif
#ifndef CACHE_ENV
#error "CACHE_ENV (the cache directory's variable) must be defined"
#endif

#define TRAILER_MAX 512
#define BLOCK 512
#define STALE_SECONDS 3600 /* a partial unpack older than this was left by a killed launch */

static const char *self_name; /* argv[0], as the operator or the agent wrote it */

static void die(const char *fmt, ...) {
    va_list ap;
    fputs(NAME ": ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(1);
}

static char *format(const char *fmt, ...) {
    va_list ap;
    char *out = NULL;
    va_start(ap, fmt);
    int n = vasprintf(&out, fmt, ap);
    va_end(ap);
    if (n < 0) die("out of memory");
    return out;
}

struct bundle {
    char version[64];
    char key[17];
    unsigned glibc_minor;
    off_t offset;
    off_t size;
};

/* The last line of the file; 0 when it is there and agrees with the file's size. */
static int read_trailer(int fd, struct bundle *b) {
    struct stat st;
    if (fstat(fd, &st) != 0) return -1;
    char buf[TRAILER_MAX + 1];
    off_t n = st.st_size < TRAILER_MAX ? st.st_size : TRAILER_MAX;
    if (n < 2 || pread(fd, buf, (size_t)n, st.st_size - n) != n || buf[n - 1] != '\n') return -1;
    buf[n - 1] = '\0';
    char *nl = memrchr(buf, '\n', (size_t)(n - 1));
    if (nl == NULL) return -1;
    unsigned long long offset, size;
    int used = -1;
    int got = sscanf(nl + 1, NAME " bundle version=%63[A-Za-z0-9.+_-] key=%16[0-9a-f] glibc=2.%u offset=%llu size=%llu%n",
                     b->version, b->key, &b->glibc_minor, &offset, &size, &used);
    if (got != 5 || used < 0 || nl[1 + used] != '\0' || strlen(b->key) != 16) return -1;
    off_t trailer = (off_t)(buf + n - nl);
    if (offset + size + (unsigned long long)trailer != (unsigned long long)st.st_size) return -1;
    b->offset = (off_t)offset;
    b->size = (off_t)size;
    return 0;
}

static char *cache_dir(void) {
    const char *v;
    if ((v = getenv(CACHE_ENV)) != NULL && *v) return format("%s", v);
    if ((v = getenv("XDG_CACHE_HOME")) != NULL && *v) return format("%s/" NAME, v);
    if ((v = getenv("HOME")) != NULL && *v && strcmp(v, "/") != 0) return format("%s/.cache/" NAME, v);
    return format("/var/cache/" NAME);
}

/* mkdir -p: each missing directory gets 0777 less the umask. */
static int make_dirs(const char *path) {
    char *p = format("%s", path);
    for (char *s = p + 1;; s++) {
        if (*s == '/' || *s == '\0') {
            char saved = *s;
            *s = '\0';
            if (mkdir(p, 0777) != 0 && errno != EEXIST) {
                free(p);
                return -1;
            }
            *s = saved;
            if (saved == '\0') break;
        }
    }
    free(p);
    struct stat st;
    if (stat(path, &st) != 0) return -1;
    if (!S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        return -1;
    }
    return 0;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

static void remove_tree(const char *path) { nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS); }

/* ---- the archive: gzip'd ustar, regular files and directories only (tools/build_dist.py) ---- */

enum { OK = 0, DAMAGED = -1, IO = -2 };

struct reader {
    z_stream z;
    int fd;
    off_t at, left; /* where the next compressed byte is, and how many are left */
    unsigned char in[1 << 16];
};

/* More compressed input, when zlib has used up what it had. With none left, inflate itself says
 * whether the stream may end there (Z_STREAM_END) or was cut short (Z_BUF_ERROR). */
static int refill(struct reader *r) {
    if (r->z.avail_in > 0 || r->left == 0) return OK;
    size_t chunk = r->left < (off_t)sizeof r->in ? (size_t)r->left : sizeof r->in;
    ssize_t got = pread(r->fd, r->in, chunk, r->at);
    if (got <= 0) return got < 0 ? IO : DAMAGED;
    r->at += got;
    r->left -= got;
    r->z.next_in = r->in;
    r->z.avail_in = (uInt)got;
    return OK;
}

/* Inflate exactly n bytes into out (NULL: discard them). */
static int inflate_exact(struct reader *r, unsigned char *out, size_t n) {
    unsigned char scratch[BLOCK];
    while (n > 0) {
        size_t want = out ? n : (n < sizeof scratch ? n : sizeof scratch);
        r->z.next_out = out ? out : scratch;
        r->z.avail_out = (uInt)want;
        while (r->z.avail_out > 0) {
            int rc = refill(r);
            if (rc != OK) return rc;
            int z = inflate(&r->z, Z_NO_FLUSH);
            if (z == Z_STREAM_END && r->z.avail_out > 0) return DAMAGED;
            if (z != Z_OK && z != Z_STREAM_END) return DAMAGED;
        }
        if (out) out += want;
        n -= want;
    }
    return OK;
}

/* After the end-of-archive blocks: only zero padding, then the gzip stream's end (its CRC and
 * length checked by zlib), then nothing. */
static int finish(struct reader *r) {
    unsigned char pad[BLOCK];
    for (;;) {
        r->z.next_out = pad;
        r->z.avail_out = sizeof pad;
        int rc = refill(r);
        if (rc != OK) return rc;
        int z = inflate(&r->z, Z_NO_FLUSH);
        size_t made = sizeof pad - r->z.avail_out;
        for (size_t i = 0; i < made; i++)
            if (pad[i] != 0) return DAMAGED;
        if (z == Z_STREAM_END) return (r->z.avail_in == 0 && r->left == 0) ? OK : DAMAGED;
        if (z != Z_OK) return DAMAGED;
    }
}

static int octal(const unsigned char *p, size_t n, unsigned long long *out) {
    size_t i = 0;
    unsigned long long v = 0;
    while (i < n && p[i] == ' ') i++;
    size_t start = i;
    for (; i < n && p[i] >= '0' && p[i] <= '7'; i++) v = v * 8 + (unsigned)(p[i] - '0');
    if (i == start || (i < n && p[i] != '\0' && p[i] != ' ')) return -1;
    *out = v;
    return 0;
}

static int header_ok(const unsigned char *h) {
    unsigned long long want, sum = 0;
    for (int i = 0; i < BLOCK; i++) sum += (i >= 148 && i < 156) ? ' ' : h[i];
    return octal(h + 148, 8, &want) == 0 && want == sum && memcmp(h + 257, "ustar", 5) == 0;
}

/* A relative path of plain names: no absolute path, no "." or ".." component. */
static int safe_path(const char *path) {
    if (*path == '\0' || *path == '/') return 0;
    for (const char *s = path; *s;) {
        const char *e = strchrnul(s, '/');
        size_t len = (size_t)(e - s);
        if (len == 0 || (len == 1 && s[0] == '.') || (len == 2 && s[0] == '.' && s[1] == '.')) return 0;
        s = *e ? e + 1 : e;
    }
    return 1;
}

/* The directory that holds path's last component, opened under root without following links
 * (missing ones are made); *leaf points at that component. */
static int open_parent(int root, char *path, char **leaf) {
    int fd = dup(root);
    char *s = path;
    for (char *slash; fd >= 0 && (slash = strchr(s, '/')) != NULL; s = slash + 1) {
        *slash = '\0';
        if (mkdirat(fd, s, 0777) != 0 && errno != EEXIST) {
            close(fd);
            return -1;
        }
        int next = openat(fd, s, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        *slash = '/';
        close(fd);
        fd = next;
    }
    *leaf = s;
    return fd;
}

static int write_all(int fd, const unsigned char *p, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return IO;
        p += w;
        n -= (size_t)w;
    }
    return OK;
}

static int extract_file(struct reader *r, int parent, const char *leaf, mode_t mode, unsigned long long size) {
    int fd = openat(parent, leaf, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
    if (fd < 0) return IO;
    unsigned char buf[1 << 16];
    int rc = OK;
    for (unsigned long long left = size; rc == OK && left > 0;) {
        size_t n = left < sizeof buf ? (size_t)left : sizeof buf;
        rc = inflate_exact(r, buf, n);
        if (rc == OK) rc = write_all(fd, buf, n);
        left -= n;
    }
    if (close(fd) != 0 && rc == OK) rc = IO;
    if (rc == OK && size % BLOCK) rc = inflate_exact(r, NULL, BLOCK - size % BLOCK);
    return rc;
}

static int extract(struct reader *r, int root) {
    unsigned char h[BLOCK];
    for (;;) {
        int rc = inflate_exact(r, h, BLOCK);
        if (rc != OK) return rc;
        int zero = 1;
        for (int i = 0; i < BLOCK && zero; i++) zero = h[i] == 0;
        if (zero) {
            rc = inflate_exact(r, h, BLOCK); /* the second end-of-archive block */
            if (rc != OK) return rc;
            for (int i = 0; i < BLOCK; i++)
                if (h[i] != 0) return DAMAGED;
            return finish(r);
        }
        unsigned long long mode, size;
        if (!header_ok(h) || octal(h + 100, 8, &mode) != 0 || octal(h + 124, 12, &size) != 0) return DAMAGED;
        char path[256 + 100 + 1];
        int plen = (int)strnlen((const char *)h + 345, 155), nlen = (int)strnlen((const char *)h, 100);
        snprintf(path, sizeof path, "%.*s%s%.*s", plen, (const char *)h + 345, plen ? "/" : "", nlen, (const char *)h);
        size_t len = strlen(path);
        while (len > 0 && path[len - 1] == '/') path[--len] = '\0';
        char type = (char)h[156];
        if (!safe_path(path) || (type != '0' && type != '\0' && type != '5')) return DAMAGED;
        char *leaf;
        int parent = open_parent(root, path, &leaf);
        if (parent < 0) return IO;
        if (type == '5') {
            rc = (mkdirat(parent, leaf, (mode_t)(mode & 0777)) == 0 || errno == EEXIST) ? OK : IO;
            if (rc == OK && size != 0) rc = DAMAGED;
        } else {
            rc = extract_file(r, parent, leaf, (mode_t)(mode & 0777), size);
        }
        close(parent);
        if (rc != OK) return rc;
    }
}

static int unpack_into(int fd, const struct bundle *b, const char *dir) {
    struct reader *r = calloc(1, sizeof *r);
    if (r == NULL) die("out of memory");
    r->fd = fd;
    r->at = b->offset;
    r->left = b->size;
    if (inflateInit2(&r->z, 16 + MAX_WBITS) != Z_OK) die("cannot start zlib");
    int root = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int rc = root < 0 ? IO : extract(r, root);
    int saved = errno;
    if (root >= 0) close(root);
    inflateEnd(&r->z);
    free(r);
    errno = saved;
    return rc;
}

/* ---- the cache: keep this build and the most recent other one, drop stale partial unpacks ---- */

struct build {
    char *name;
    struct timespec mtime;
};

static int newest_first(const void *a, const void *b) {
    const struct build *x = a, *y = b;
    if (x->mtime.tv_sec != y->mtime.tv_sec) return x->mtime.tv_sec > y->mtime.tv_sec ? -1 : 1;
    if (x->mtime.tv_nsec != y->mtime.tv_nsec) return x->mtime.tv_nsec > y->mtime.tv_nsec ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* ".NAME-<build>.XXXXXX": a temporary directory of an unpack. */
static int partial_unpack(const char *name) {
    size_t len = strlen(name);
    return name[0] == '.' && strncmp(name + 1, NAME "-", sizeof NAME) == 0 && len > sizeof NAME + 8 &&
           name[len - 7] == '.';
}

static void prune(const char *cache, const char *keep) {
    DIR *dir = opendir(cache);
    if (dir == NULL) return;
    struct build *builds = NULL;
    size_t count = 0, cap = 0;
    time_t now = time(NULL);
    for (struct dirent *e; (e = readdir(dir)) != NULL;) {
        const char *name = e->d_name;
        int build = strncmp(name, NAME "-", sizeof NAME) == 0 && strchr(name + sizeof NAME, '-') != NULL;
        if (!build && !partial_unpack(name)) continue;
        if (build && strcmp(name, keep) == 0) continue;
        char *path = format("%s/%s", cache, name);
        struct stat st;
        if (lstat(path, &st) != 0) {
            free(path);
            continue;
        }
        if (!build) {
            if (S_ISDIR(st.st_mode) && now - st.st_mtime > STALE_SECONDS) remove_tree(path);
            free(path);
            continue;
        }
        free(path);
        if (count == cap) {
            cap = cap ? cap * 2 : 8;
            builds = realloc(builds, cap * sizeof *builds);
            if (builds == NULL) die("out of memory");
        }
        builds[count].name = format("%s", name);
        builds[count++].mtime = st.st_mtim;
    }
    closedir(dir);
    qsort(builds, count, sizeof *builds, newest_first);
    for (size_t i = 0; i < count; i++) {
        if (i >= 1) { /* the most recent other build stays: the previous version may still be running */
            char *path = format("%s/%s", cache, builds[i].name);
            remove_tree(path);
            free(path);
        }
        free(builds[i].name);
    }
    free(builds);
}

/* Whether the build's plugin is in place (whether it may run is exec's to say: a noexec mount, say). */
static int unpacked(const char *exe) {
    struct stat st;
    return stat(exe, &st) == 0 && S_ISREG(st.st_mode);
}

static void check_glibc(unsigned floor) {
    const char *v = gnu_get_libc_version();
    unsigned major, minor;
    if (sscanf(v, "%u.%u", &major, &minor) == 2 && major == 2 && minor < floor)
        die("needs glibc >= 2.%u, this node has %s", floor, v);
}

static void install(int fd, const struct bundle *b, const char *cache, const char *build, const char *dir,
                    const char *exe) {
    check_glibc(b->glibc_minor);
    mode_t umask_was = umask(077);
    if (make_dirs(cache) != 0)
        die("cannot create the cache directory %s: %s (set " CACHE_ENV " to a writable local directory)", cache,
            strerror(errno));
    char *tmp = format("%s/.%s.XXXXXX", cache, build);
    if (mkdtemp(tmp) == NULL) die("cannot create a directory in %s: %s", cache, strerror(errno));
    int rc = unpack_into(fd, b, tmp);
    if (rc != OK) {
        int saved = errno;
        remove_tree(tmp);
        if (rc == DAMAGED)
            die("cannot unpack %s: the file is truncated or damaged (compare it with " NAME ".sha256)", self_name);
        die("cannot unpack %s into %s: %s", self_name, cache, strerror(saved));
    }
    /* Atomic: a concurrent first launch that won the race already installed the same bytes. */
    if (rename(tmp, dir) != 0) {
        int saved = errno;
        remove_tree(tmp);
        if (!unpacked(exe) && (saved == ENOTEMPTY || saved == EEXIST))
            die("cannot install the bundle into %s: that directory exists but holds no " NAME
                " (delete it; the next launch unpacks again)", dir);
        if (!unpacked(exe)) die("cannot install the bundle into %s: %s", dir, strerror(saved));
    }
    free(tmp);
    prune(cache, build);
    umask(umask_was);
}

int main(int argc, char **argv) {
    (void)argc;
    self_name = argv[0] ? argv[0] : NAME;
    int fd = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
    if (fd < 0 && argv[0] && strchr(argv[0], '/')) fd = open(argv[0], O_RDONLY | O_CLOEXEC);
    if (fd < 0) die("cannot read %s itself: %s", self_name, strerror(errno));
    struct bundle b;
    if (read_trailer(fd, &b) != 0)
        die("%s is truncated or damaged: no bundle at its end (compare it with " NAME ".sha256)", self_name);
    char *cache = cache_dir();
    if (cache[0] != '/')
        die("the cache directory must be an absolute path, got '%s' (set " CACHE_ENV ")", cache);
    char *build = format(NAME "-%s-%s", b.version, b.key);
    char *dir = format("%s/%s", cache, build);
    char *exe = format("%s/" NAME, dir);
    if (!unpacked(exe)) install(fd, &b, cache, build, dir, exe);
    close(fd);
    struct stat st;
    if (stat(dir, &st) != 0) die("cannot read %s: %s", dir, strerror(errno));
    if (st.st_uid != geteuid()) die("%s is not owned by this user; refusing to run it (set " CACHE_ENV ")", dir);
    argv[0] = exe;
    execv(exe, argv);
    if (errno == EACCES)
        die("cannot run %s: %s (is the cache on a noexec file system? set " CACHE_ENV " to a directory on one that is not)",
            exe, strerror(errno));
    die("cannot run %s: %s", exe, strerror(errno));
}

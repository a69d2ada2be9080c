/* The compute device's allocation and lookup (device.h); the GPU's side is
 * cuda/backend.cu. */
#define _DEFAULT_SOURCE /* madvise, MAP_ANONYMOUS */
#include "device.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "fourfold/gemm.h"
#include "internal.h"

struct ff_cuda *ff_ctx_cuda(const ff_ctx *ctx) { return ctx ? ctx->cuda : NULL; }

const char *ff_ctx_device(const ff_ctx *ctx)
{
#ifdef FF_CUDA
    if (ctx->cuda)
        return ff_cuda_describe(ctx->cuda);
#endif
    (void)ctx;
    return "cpu";
}

void ff_ctx_device_work(const ff_ctx *ctx, long long *gpu, long long *cpu)
{
    int64_t g = 0, c = 0;
#ifdef FF_CUDA
    if (ctx->cuda)
        ff_cuda_counts(ctx->cuda, &g, &c);
#endif
    (void)ctx;
    *gpu = (long long)g;
    *cpu = (long long)c;
}

/* Buffers of at least one huge page are mapped on their own, starting on
 * a huge page's boundary, and the kernel is asked for transparent huge
 * pages there (MADV_HUGEPAGE; the system's setting decides: with "never" it
 * is a no-op). The length is rounded to 4 KiB pages only: the last partial
 * huge page's worth stays on small pages rather than costing up to 2 MiB
 * more per buffer. The streaming passes over the parameters, gradients and
 * moments miss the TLB on every 4 KiB page otherwise: AdamW over 124M
 * parameters took 138 ms in a training step against 77-95 ms on huge pages
 * (docs/results.md, "One pool of threads, huge pages"). The sanitizer build
 * keeps calloc, whose buffers AddressSanitizer guards (redzones, leaks). */
#define HUGE_PAGE  ((size_t)2 << 20)
#define SMALL_PAGE ((size_t)4096)
#if defined(__SANITIZE_ADDRESS__)
#define FF_MAP_HUGE 0
#else
#define FF_MAP_HUGE 1
#endif

/* Every live buffer, whichever way it was made (a mapping, calloc, CUDA's
 * managed memory), is listed in one hash table keyed by its address (open
 * addressing, linear probing), with the bytes asked for and, for a
 * mapping, the mapping's length: ff_fbuf_free needs that length to unmap,
 * and ff_fbuf_live_bytes reports the sum of what is live (tests measure a
 * model's memory with it, tests/test_samo.c). One lock guards the table and
 * the sum; allocations are few (the layers pool their buffers). A buffer
 * that cannot be listed is not handed out (NULL, as when out of memory). */
typedef struct {
    void *p;        /* NULL: a free slot */
    size_t bytes;   /* asked for: n floats */
    size_t map_len; /* the mapping's length, 0 for calloc's and CUDA's */
} live_buf;

static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static live_buf *table;
static size_t table_cap, table_n, table_bytes; /* cap a power of 2 or 0 */

static size_t slot_of(const void *p, size_t cap)
{
    uint64_t h = (uint64_t)(uintptr_t)p;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull; /* MurmurHash3's finaliser */
    h ^= h >> 33;
    return (size_t)h & (cap - 1);
}

/* Under the lock: adds (p, bytes, map_len); 0 if the table cannot grow. */
static int table_put(void *p, size_t bytes, size_t map_len)
{
    if (2 * (table_n + 1) > table_cap) { /* at most half full */
        size_t cap = table_cap ? 2 * table_cap : 256;
        live_buf *t = calloc(cap, sizeof *t);
        if (!t)
            return 0;
        for (size_t i = 0; i < table_cap; i++)
            if (table[i].p) {
                size_t j = slot_of(table[i].p, cap);
                while (t[j].p)
                    j = (j + 1) & (cap - 1);
                t[j] = table[i];
            }
        free(table);
        table = t, table_cap = cap;
    }
    size_t j = slot_of(p, table_cap);
    while (table[j].p)
        j = (j + 1) & (table_cap - 1);
    table[j] = (live_buf){p, bytes, map_len};
    table_n++;
    table_bytes += bytes;
    return 1;
}

/* Under the lock: removes p's entry into *out; 0 if p is not listed. The
 * entries after it in its run move back (no tombstones). */
static int table_take(const void *p, live_buf *out)
{
    if (!table_cap)
        return 0;
    const size_t mask = table_cap - 1;
    size_t i = slot_of(p, table_cap);
    while (table[i].p != p) {
        if (!table[i].p)
            return 0;
        i = (i + 1) & mask;
    }
    *out = table[i];
    for (size_t j = i;;) {
        j = (j + 1) & mask;
        if (!table[j].p)
            break;
        size_t home = slot_of(table[j].p, table_cap);
        /* j's entry may fill the hole at i unless its home lies in (i, j] */
        if (i <= j ? (i < home && home <= j) : (i < home || home <= j))
            continue;
        table[i] = table[j];
        i = j;
    }
    table[i].p = NULL;
    table_n--;
    table_bytes -= out->bytes;
    if (table_n == 0) {
        free(table);
        table = NULL;
        table_cap = 0;
    }
    return 1;
}

static int listed(void *p, size_t bytes, size_t map_len)
{
    pthread_mutex_lock(&table_lock);
    int ok = table_put(p, bytes, map_len);
    pthread_mutex_unlock(&table_lock);
    return ok;
}

size_t ff_fbuf_live_bytes(void)
{
    pthread_mutex_lock(&table_lock);
    size_t b = table_bytes;
    pthread_mutex_unlock(&table_lock);
    return b;
}

size_t ff_fbuf_bytes(const void *p)
{
    size_t b = 0;
    pthread_mutex_lock(&table_lock);
    if (p && table_cap) {
        size_t i = slot_of(p, table_cap);
        while (table[i].p && table[i].p != p)
            i = (i + 1) & (table_cap - 1);
        b = table[i].p == p ? table[i].bytes : 0;
    }
    pthread_mutex_unlock(&table_lock);
    return b;
}

/* n floats, zero, on a mapping aligned to a huge page; NULL if mmap fails */
static float *map_huge(size_t n)
{
    size_t len = (n * sizeof(float) + SMALL_PAGE - 1) & ~(SMALL_PAGE - 1);
    if (len < n * sizeof(float) || len > SIZE_MAX - HUGE_PAGE) /* would wrap */
        return NULL;
    char *base =
        mmap(NULL, len + HUGE_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED)
        return NULL;
    char *p = (char *)(((uintptr_t)base + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
    if (p > base) /* the unaligned head and tail go back */
        munmap(base, (size_t)(p - base));
    if (p + len < base + len + HUGE_PAGE)
        munmap(p + len, (size_t)(base + len + HUGE_PAGE - (p + len)));
#ifdef MADV_HUGEPAGE
    madvise(p, len, MADV_HUGEPAGE);
#endif
    if (!listed(p, n * sizeof(float), len)) {
        munmap(p, len);
        return NULL;
    }
    return (float *)p;
}

float *ff_fbuf_alloc(const ff_ctx *ctx, size_t n)
{
    if (n > SIZE_MAX / sizeof(float))
        return NULL;
#ifdef FF_CUDA
    if (ctx && ctx->cuda) {
        float *d = ff_cuda_alloc(ctx->cuda, n ? n : 1);
        if (d && !listed(d, n * sizeof(float), 0)) {
            ff_cuda_free(d);
            d = NULL;
        }
        return d;
    }
#else
    (void)ctx;
#endif
    if (FF_MAP_HUGE && n >= HUGE_PAGE / sizeof(float)) {
        float *p = map_huge(n);
        if (p)
            return p;
    }
    float *p = calloc(n ? n : 1, sizeof(float));
    if (p && !listed(p, n * sizeof(float), 0)) {
        free(p);
        p = NULL;
    }
    return p;
}

float *ff_floats_alloc(size_t n) { return ff_fbuf_alloc(NULL, n); }
void ff_floats_free(void *p) { ff_fbuf_free(p); }

void ff_fbuf_free(void *p)
{
    if (!p)
        return;
    live_buf e = {NULL, 0, 0};
    pthread_mutex_lock(&table_lock);
    table_take(p, &e);
    pthread_mutex_unlock(&table_lock);
#ifdef FF_CUDA
    if (ff_cuda_free(p))
        return;
#endif
    if (e.map_len)
        munmap(p, e.map_len);
    else
        free(p);
}

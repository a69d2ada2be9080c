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
 * (docs/results.md, "One pool of threads, huge pages"). The mappings are listed so that
 * ff_fbuf_free can tell them from calloc's. The sanitizer build keeps
 * calloc, whose buffers AddressSanitizer guards (redzones, leaks). */
#define HUGE_PAGE  ((size_t)2 << 20)
#define SMALL_PAGE ((size_t)4096)
#if defined(__SANITIZE_ADDRESS__)
#define FF_MAP_HUGE 0
#else
#define FF_MAP_HUGE 1
#endif

typedef struct {
    void *p;
    size_t len;
} mapping;

static pthread_mutex_t maps_lock = PTHREAD_MUTEX_INITIALIZER;
static mapping *maps;
static size_t n_maps, cap_maps;

static int remember(void *p, size_t len)
{
    pthread_mutex_lock(&maps_lock);
    int ok = 1;
    if (n_maps == cap_maps) {
        size_t cap = cap_maps ? 2 * cap_maps : 64;
        mapping *m = realloc(maps, cap * sizeof *m);
        if (m)
            maps = m, cap_maps = cap;
        else
            ok = 0;
    }
    if (ok)
        maps[n_maps++] = (mapping){p, len};
    pthread_mutex_unlock(&maps_lock);
    return ok;
}

/* the length of p's mapping, removed from the list; 0 if p is not one */
static size_t forget(void *p)
{
    size_t len = 0;
    pthread_mutex_lock(&maps_lock);
    for (size_t i = 0; i < n_maps; i++)
        if (maps[i].p == p) {
            len = maps[i].len;
            maps[i] = maps[--n_maps];
            break;
        }
    if (n_maps == 0) {
        free(maps);
        maps = NULL;
        cap_maps = 0;
    }
    pthread_mutex_unlock(&maps_lock);
    return len;
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
    if (!remember(p, len)) {
        munmap(p, len);
        return NULL;
    }
    return (float *)p;
}

float *ff_fbuf_alloc(const ff_ctx *ctx, size_t n)
{
#ifdef FF_CUDA
    if (ctx && ctx->cuda)
        return ff_cuda_alloc(ctx->cuda, n ? n : 1);
#else
    (void)ctx;
#endif
    if (FF_MAP_HUGE && n >= HUGE_PAGE / sizeof(float) && n <= SIZE_MAX / sizeof(float)) {
        float *p = map_huge(n);
        if (p)
            return p;
    }
    return calloc(n ? n : 1, sizeof(float));
}

float *ff_floats_alloc(size_t n) { return ff_fbuf_alloc(NULL, n); }
void ff_floats_free(void *p) { ff_fbuf_free(p); }

void ff_fbuf_free(void *p)
{
    if (!p)
        return;
#ifdef FF_CUDA
    if (ff_cuda_free(p))
        return;
#endif
    size_t len = forget(p);
    if (len)
        munmap(p, len);
    else
        free(p);
}

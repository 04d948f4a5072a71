// A stand-in for libcudart built at test time, so that the purego bindings are
// exercised without a GPU: argument passing, return codes, error mapping,
// events and library lookup. Device memory is host memory from malloc and
// copies are synchronous memcpy, so every event is complete as soon as it is
// recorded unless a test injects "not ready" answers.
//
// It also stands in for the part of libcuda device/cuda binds (the
// primary context and virtual memory management), over the same memory:
// reserved address space is host address space, and a copy touching a page
// of a reservation that is not mapped with access set fails with
// cudaErrorIllegalAddress, as the GPU would fault.
//
// Variants: -DOMIT_EVENT_QUERY drops cudaEventQuery (missing-symbol test),
// -DOMIT_ERROR_NAME drops cudaGetErrorName (built-in name table),
// -DOMIT_VMM drops the virtual memory management calls, -DOMIT_DRIVER
// every driver call, -DFAKE_NAME='"..."' sets the device name.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#ifndef FAKE_NAME
#define FAKE_NAME "Fake CUDA GPU"
#endif

enum {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
    cudaErrorIllegalAddress = 700,
    cudaErrorUnknown = 999,
};

#define MAX_ALLOCS 4096
#define STREAM_MAGIC 0x5354524dU
#define EVENT_MAGIC 0x4556544eU

struct alloc { void *p; size_t n; int host; };
struct obj { unsigned magic; unsigned flags; int recorded; long long t; };

static struct alloc allocs[MAX_ALLOCS];
static size_t total = (size_t)1 << 30, used;
static int device_count = 2, current_device;
static long long alloc_calls, fail_alloc_at = -1;  /* fail the N-th cudaMalloc from now */
static int fail_copy_code;                         /* next cudaMemcpyAsync returns this */
static int query_not_ready;                        /* next N cudaEventQuery return 600 */
static long long clock_ns;                         /* the device clock events record */
static int elapsed_not_ready;                      /* next N cudaEventElapsedTime return 600 */
static int fail_elapsed_code;                      /* next cudaEventElapsedTime returns this */
static long long last[16];
static void vmm_reset(void);
static int vmm_check(const void *p, size_t n);

/* Indices into last[] read by fake_last. */
enum { L_KIND, L_COUNT, L_STREAM, L_HOST_FLAGS, L_STREAM_FLAGS, L_EVENT_FLAGS,
       L_DEVICE, L_ASYNC_COPIES, L_WAITS, L_WAIT_FLAGS, L_RECORDS, L_SYNC_COPIES,
       L_DEVICE_SYNCS };

__attribute__((constructor)) void fake_reset(void) {
    for (int i = 0; i < MAX_ALLOCS; i++) {
        free(allocs[i].p);
        allocs[i].p = NULL;
    }
    used = 0;
    total = (size_t)1 << 30;
    const char *env = getenv("FAKE_CUDART_TOTAL_MB");
    if (env) total = (size_t)atoll(env) << 20;
    current_device = 0;
    alloc_calls = 0;
    fail_alloc_at = -1;
    fail_copy_code = 0;
    query_not_ready = 0;
    clock_ns = 0; elapsed_not_ready = 0; fail_elapsed_code = 0;
    memset(last, 0, sizeof last);
    vmm_reset();
}
void fake_set_total(long long n) { total = (size_t)n; }
void fake_fail_alloc_after(long long n) { fail_alloc_at = alloc_calls + n; }
void fake_fail_next_copy(int code) { fail_copy_code = code; }
void fake_query_not_ready(int n) { query_not_ready = n; }
/* Event timing: records stamp the clock, which only tests move. */
void fake_advance_clock(long long ns) { clock_ns += ns; }
void fake_elapsed_not_ready(int n) { elapsed_not_ready = n; }
void fake_fail_next_elapsed(int code) { fail_elapsed_code = code; }
long long fake_last(int i) { return last[i]; }
long long fake_live_allocs(void) {
    long long n = 0;
    for (int i = 0; i < MAX_ALLOCS; i++) n += allocs[i].p != NULL;
    return n;
}

static int track(void *p, size_t n, int host) {
    for (int i = 0; i < MAX_ALLOCS; i++) {
        if (!allocs[i].p) {
            allocs[i].p = p; allocs[i].n = n; allocs[i].host = host;
            return 0;
        }
    }
    return -1;
}

static int untrack(void *p, int host) {
    for (int i = 0; i < MAX_ALLOCS; i++) {
        if (allocs[i].p == p && allocs[i].host == host) {
            if (!host) used -= allocs[i].n;
            free(p);
            allocs[i].p = NULL;
            return 0;
        }
    }
    return -1;
}

int cudaSetDevice(int dev) {
    if (dev < 0 || dev >= device_count) return cudaErrorInvalidDevice;
    current_device = dev;
    last[L_DEVICE] = dev;
    return cudaSuccess;
}
int cudaGetDeviceCount(int *n) { *n = device_count; return cudaSuccess; }
int cudaDeviceSynchronize(void) { last[L_DEVICE_SYNCS]++; return cudaSuccess; }

int cudaGetDeviceProperties_v2(void *prop, int dev) {
    if (dev < 0 || dev >= device_count) return cudaErrorInvalidDevice;
    strcpy((char *)prop, FAKE_NAME);
    return cudaSuccess;
}

#ifndef OMIT_ERROR_NAME
const char *cudaGetErrorName(int code) {
    switch (code) {
    case 0: return "cudaSuccess";
    case 1: return "cudaErrorInvalidValue";
    case 2: return "cudaErrorMemoryAllocation";
    case 101: return "cudaErrorInvalidDevice";
    case 222: return "cudaErrorUnsupportedPtxVersion";
    case 400: return "cudaErrorInvalidResourceHandle";
    case 600: return "cudaErrorNotReady";
    case 700: return "cudaErrorIllegalAddress";
    case 999: return "cudaErrorUnknown";
    }
    return "unrecognized error code";
}
#endif

int cudaMalloc(void **p, size_t n) {
    if (fail_alloc_at >= 0 && alloc_calls++ == fail_alloc_at) return cudaErrorMemoryAllocation;
    if (n == 0) { *p = NULL; return cudaSuccess; }
    if (used + n > total) return cudaErrorMemoryAllocation;
    void *m = malloc(n);
    if (!m || track(m, n, 0)) { free(m); return cudaErrorMemoryAllocation; }
    used += n;
    *p = m;
    return cudaSuccess;
}
int cudaFree(void *p) {
    if (!p) return cudaSuccess;
    return untrack(p, 0) ? cudaErrorInvalidValue : cudaSuccess;
}
int cudaHostAlloc(void **p, size_t n, unsigned flags) {
    last[L_HOST_FLAGS] = flags;
    void *m = malloc(n ? n : 1);
    if (!m || track(m, n, 1)) { free(m); return cudaErrorMemoryAllocation; }
    *p = m;
    return cudaSuccess;
}
int cudaFreeHost(void *p) { return untrack(p, 1) ? cudaErrorInvalidValue : cudaSuccess; }
int cudaMemGetInfo(size_t *f, size_t *t) { *f = total - used; *t = total; return cudaSuccess; }

static int valid_stream(void *s) {
    return s == NULL || ((struct obj *)s)->magic == STREAM_MAGIC;
}

int cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind, void *stream) {
    last[L_KIND] = kind; last[L_COUNT] = (long long)n; last[L_STREAM] = (long long)(uintptr_t)stream;
    last[L_ASYNC_COPIES]++;
    if (fail_copy_code) { int c = fail_copy_code; fail_copy_code = 0; return c; }
    if (kind < 1 || kind > 3 || !valid_stream(stream)) return cudaErrorInvalidValue;
    if (vmm_check(dst, n) || vmm_check(src, n)) return cudaErrorIllegalAddress;
    memmove(dst, src, n);
    return cudaSuccess;
}
int cudaMemcpy(void *dst, const void *src, size_t n, int kind) {
    last[L_KIND] = kind; last[L_COUNT] = (long long)n; last[L_SYNC_COPIES]++;
    if (kind < 1 || kind > 3) return cudaErrorInvalidValue;
    if (vmm_check(dst, n) || vmm_check(src, n)) return cudaErrorIllegalAddress;
    memmove(dst, src, n);
    return cudaSuccess;
}

int cudaStreamCreateWithFlags(void **s, unsigned flags) {
    struct obj *o = calloc(1, sizeof *o);
    o->magic = STREAM_MAGIC; o->flags = flags;
    last[L_STREAM_FLAGS] = flags;
    *s = o;
    return cudaSuccess;
}
int cudaStreamDestroy(void *s) {
    if (!s || !valid_stream(s)) return cudaErrorInvalidResourceHandle;
    ((struct obj *)s)->magic = 0;
    free(s);
    return cudaSuccess;
}
int cudaStreamSynchronize(void *s) { return valid_stream(s) ? cudaSuccess : cudaErrorInvalidResourceHandle; }
int cudaStreamWaitEvent(void *s, void *e, unsigned flags) {
    last[L_WAITS]++; last[L_WAIT_FLAGS] = flags;
    if (!valid_stream(s) || !e || ((struct obj *)e)->magic != EVENT_MAGIC) return cudaErrorInvalidResourceHandle;
    return cudaSuccess;
}

int cudaEventCreateWithFlags(void **e, unsigned flags) {
    struct obj *o = calloc(1, sizeof *o);
    o->magic = EVENT_MAGIC; o->flags = flags;
    last[L_EVENT_FLAGS] = flags;
    *e = o;
    return cudaSuccess;
}
static int valid_event(void *e) { return e && ((struct obj *)e)->magic == EVENT_MAGIC; }
int cudaEventRecord(void *e, void *s) {
    last[L_RECORDS]++;
    if (!valid_event(e) || !valid_stream(s)) return cudaErrorInvalidResourceHandle;
    ((struct obj *)e)->recorded = 1;
    ((struct obj *)e)->t = clock_ns;
    return cudaSuccess;
}
/* As CUDA: events made with cudaEventDisableTiming (0x02), or never
   recorded, are invalid handles here. */
int cudaEventElapsedTime(float *ms, void *start, void *end) {
    if (!ms) return cudaErrorInvalidValue;
    if (!valid_event(start) || !valid_event(end)) return cudaErrorInvalidResourceHandle;
    struct obj *a = start, *b = end;
    if ((a->flags & 0x02) || (b->flags & 0x02) || !a->recorded || !b->recorded) return cudaErrorInvalidResourceHandle;
    if (fail_elapsed_code) { int c = fail_elapsed_code; fail_elapsed_code = 0; return c; }
    if (elapsed_not_ready > 0) { elapsed_not_ready--; return cudaErrorNotReady; }
    *ms = (float)((double)(b->t - a->t) / 1e6);
    return cudaSuccess;
}
#ifndef OMIT_EVENT_QUERY
int cudaEventQuery(void *e) {
    if (!valid_event(e)) return cudaErrorInvalidResourceHandle;
    if (query_not_ready > 0) { query_not_ready--; return cudaErrorNotReady; }
    return cudaSuccess;
}
#endif
int cudaEventSynchronize(void *e) { return valid_event(e) ? cudaSuccess : cudaErrorInvalidResourceHandle; }
int cudaEventDestroy(void *e) {
    if (!valid_event(e)) return cudaErrorInvalidResourceHandle;
    ((struct obj *)e)->magic = 0;
    free(e);
    return cudaSuccess;
}

/* ---- libcuda: the primary context and virtual memory management ---- */

enum { CUDA_SUCCESS = 0, CUDA_ERROR_INVALID_VALUE = 1, CUDA_ERROR_OUT_OF_MEMORY = 2,
       CUDA_ERROR_NOT_INITIALIZED = 3, CUDA_ERROR_INVALID_DEVICE = 101, CUDA_ERROR_INVALID_CONTEXT = 201,
       CUDA_ERROR_INVALID_HANDLE = 400, CUDA_ERROR_NOT_SUPPORTED = 801, CUDA_ERROR_UNKNOWN = 999 };

#define MAX_RES 64
#define MAX_HANDLES 65536
#define MAX_DEVICES 2

/* Page states of a reservation. */
enum { UNMAPPED, MAPPED, ACCESSIBLE };

struct reservation { char *base; size_t size; unsigned char *state; int *handle; };
struct handle { int live; int released; size_t size; char *at; };

static struct reservation res[MAX_RES];
static struct handle handles[MAX_HANDLES + 1]; /* handle ids are indices, from 1 */
static size_t granularity;
static long long create_calls, fail_create_at = -1, map_calls, fail_map_at = -1;
static int fail_map_code;
static long long vmm_counts[8];
enum { V_CREATES, V_MAPS, V_UNMAPS, V_RELEASES, V_ACCESS, V_RESERVES, V_FREES };

static int initialized, retained[MAX_DEVICES];
static int ctx_tokens[MAX_DEVICES];
static __thread int ctx_depth;
static __thread void *ctx_stack[8];
static long long net_pushes;

static void vmm_reset(void) {
    for (int i = 0; i < MAX_RES; i++) {
        if (res[i].base) {
            munmap(res[i].base, res[i].size);
            free(res[i].state);
            free(res[i].handle);
        }
    }
    memset(res, 0, sizeof res);
    memset(handles, 0, sizeof handles);
    granularity = (size_t)2 << 20;
    const char *env = getenv("FAKE_CUDA_GRANULARITY");
    if (env) granularity = (size_t)atoll(env);
    create_calls = map_calls = 0;
    fail_create_at = fail_map_at = -1;
    fail_map_code = 0;
    memset(vmm_counts, 0, sizeof vmm_counts);
}

void fake_set_granularity(long long n) { granularity = (size_t)n; }
void fake_fail_create_after(long long n) { fail_create_at = create_calls + n; }
void fake_fail_map_after(long long n, int code) { fail_map_at = map_calls + n; fail_map_code = code; }
long long fake_vmm_count(int i) { return vmm_counts[i]; }
long long fake_live_handles(void) {
    long long n = 0;
    for (int i = 1; i <= MAX_HANDLES; i++) n += handles[i].live;
    return n;
}
long long fake_mapped_bytes(void) {
    long long n = 0;
    for (int i = 0; i < MAX_RES; i++)
        for (size_t j = 0; res[i].base && j < res[i].size / granularity; j++)
            n += res[i].state[j] != UNMAPPED ? (long long)granularity : 0;
    return n;
}
long long fake_reservations(void) {
    long long n = 0;
    for (int i = 0; i < MAX_RES; i++) n += res[i].base != NULL;
    return n;
}
long long fake_net_pushes(void) { return net_pushes; }
long long fake_used(void) { return (long long)used; }

/* find_res returns the reservation holding [p, p+n), or NULL. */
static struct reservation *find_res(const void *p, size_t n) {
    const char *c = p;
    for (int i = 0; i < MAX_RES; i++)
        if (res[i].base && c >= res[i].base && c + n <= res[i].base + res[i].size) return &res[i];
    return NULL;
}

/* vmm_check fails a copy of n bytes at p that touches a reservation's page
 * not mapped with access. Memory outside reservations is not checked. */
static int vmm_check(const void *p, size_t n) {
    const char *c = p;
    for (int i = 0; i < MAX_RES; i++) {
        struct reservation *r = &res[i];
        if (!r->base || c + n <= r->base || c >= r->base + r->size) continue;
        if (c < r->base || c + n > r->base + r->size) return -1;
        if (n == 0) return 0;
        for (size_t j = (size_t)(c - r->base) / granularity; j <= (size_t)(c + n - 1 - r->base) / granularity; j++)
            if (r->state[j] != ACCESSIBLE) return -1;
    }
    return 0;
}

#ifndef OMIT_DRIVER
int cuInit(unsigned flags) { if (flags) return CUDA_ERROR_INVALID_VALUE; initialized = 1; return CUDA_SUCCESS; }
int cuDeviceGet(int *dev, int ordinal) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (ordinal < 0 || ordinal >= device_count) return CUDA_ERROR_INVALID_DEVICE;
    *dev = ordinal;
    return CUDA_SUCCESS;
}
int cuDevicePrimaryCtxRetain(void **ctx, int dev) {
    if (dev < 0 || dev >= MAX_DEVICES) return CUDA_ERROR_INVALID_DEVICE;
    retained[dev]++;
    *ctx = &ctx_tokens[dev];
    return CUDA_SUCCESS;
}
int cuDevicePrimaryCtxRelease_v2(int dev) {
    if (dev < 0 || dev >= MAX_DEVICES || retained[dev] == 0) return CUDA_ERROR_INVALID_CONTEXT;
    retained[dev]--;
    return CUDA_SUCCESS;
}
int fake_retained(int dev) { return retained[dev]; }
int cuCtxPushCurrent_v2(void *ctx) {
    if ((ctx != &ctx_tokens[0] && ctx != &ctx_tokens[1]) || ctx_depth == 8) return CUDA_ERROR_INVALID_CONTEXT;
    ctx_stack[ctx_depth++] = ctx;
    net_pushes++;
    return CUDA_SUCCESS;
}
int cuCtxPopCurrent_v2(void **ctx) {
    if (ctx_depth == 0) return CUDA_ERROR_INVALID_CONTEXT;
    ctx_depth--;
    net_pushes--;
    if (ctx) *ctx = ctx_stack[ctx_depth];
    return CUDA_SUCCESS;
}
/* current_device is the device of the thread's current context, -1 for none. */
static int ctx_device(void) {
    if (ctx_depth == 0) return -1;
    return ctx_stack[ctx_depth - 1] == &ctx_tokens[0] ? 0 : 1;
}
int cuGetErrorName(int rc, const char **s) {
    switch (rc) {
    case 1: *s = "CUDA_ERROR_INVALID_VALUE"; return 0;
    case 2: *s = "CUDA_ERROR_OUT_OF_MEMORY"; return 0;
    case 101: *s = "CUDA_ERROR_INVALID_DEVICE"; return 0;
    case 201: *s = "CUDA_ERROR_INVALID_CONTEXT"; return 0;
    case 400: *s = "CUDA_ERROR_INVALID_HANDLE"; return 0;
    case 999: *s = "CUDA_ERROR_UNKNOWN"; return 0;
    }
    *s = "CUDA_ERROR_FAKE";
    return 0;
}
/* Modules are not modelled: device/cuda does not load any. */
int cuModuleLoadData(void **mod, const void *image) { (void)mod; (void)image; return CUDA_ERROR_NOT_SUPPORTED; }
int cuModuleUnload(void *mod) { (void)mod; return CUDA_ERROR_NOT_SUPPORTED; }
int cuModuleGetFunction(void **fn, void *mod, const char *name) { (void)fn; (void)mod; (void)name; return CUDA_ERROR_NOT_SUPPORTED; }
int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                   unsigned shared, void *stream, void **params, void **extra) {
    (void)f; (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shared; (void)stream; (void)params; (void)extra;
    return CUDA_ERROR_NOT_SUPPORTED;
}

#ifndef OMIT_VMM
/* CUmemAllocationProp and CUmemAccessDesc, as cuda.h lays them out. */
struct prop { int type, handle_types, loc_type, loc_id; void *win32; unsigned char flags[8]; };
struct access { int loc_type, loc_id, flags; };

/* valid_prop: pinned memory on the device of the current context. */
static int valid_prop(const struct prop *p) {
    return p && p->type == 1 && p->handle_types == 0 && p->loc_type == 1 && p->loc_id == ctx_device();
}

int cuMemGetAllocationGranularity(size_t *g, const struct prop *p, int option) {
    if (ctx_device() < 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (!valid_prop(p) || (option != 0 && option != 1)) return CUDA_ERROR_INVALID_VALUE;
    *g = granularity;
    return CUDA_SUCCESS;
}
int cuMemAddressReserve(uintptr_t *ptr, size_t size, size_t align, uintptr_t addr, unsigned long long flags) {
    if (ctx_device() < 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (size == 0 || size % granularity || align || addr || flags) return CUDA_ERROR_INVALID_VALUE;
    for (int i = 0; i < MAX_RES; i++) {
        if (res[i].base) continue;
        /* Over-reserve to align the base on a page, as the driver does. */
        char *m = mmap(NULL, size + granularity, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
        char *base = (char *)(((uintptr_t)m + granularity - 1) & ~(uintptr_t)(granularity - 1));
        if (base > m) munmap(m, (size_t)(base - m));
        munmap(base + size, (size_t)(m + size + granularity - (base + size)));
        res[i].base = base;
        res[i].size = size;
        res[i].state = calloc(size / granularity, 1);
        res[i].handle = calloc(size / granularity, sizeof(int));
        vmm_counts[V_RESERVES]++;
        *ptr = (uintptr_t)base;
        return CUDA_SUCCESS;
    }
    return CUDA_ERROR_OUT_OF_MEMORY;
}
int cuMemAddressFree(uintptr_t ptr, size_t size) {
    if (ctx_device() < 0) return CUDA_ERROR_INVALID_CONTEXT;
    for (int i = 0; i < MAX_RES; i++) {
        struct reservation *r = &res[i];
        if (r->base != (char *)ptr) continue;
        if (r->size != size) return CUDA_ERROR_INVALID_VALUE;
        for (size_t j = 0; j < size / granularity; j++)
            if (r->state[j] != UNMAPPED) return CUDA_ERROR_INVALID_VALUE; /* unmap first */
        munmap(r->base, r->size);
        free(r->state);
        free(r->handle);
        memset(r, 0, sizeof *r);
        vmm_counts[V_FREES]++;
        return CUDA_SUCCESS;
    }
    return CUDA_ERROR_INVALID_VALUE;
}
int cuMemCreate(unsigned long long *h, size_t size, const struct prop *p, unsigned long long flags) {
    if (ctx_device() < 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (size == 0 || size % granularity || flags || !valid_prop(p)) return CUDA_ERROR_INVALID_VALUE;
    if (fail_create_at >= 0 && create_calls++ == fail_create_at) return CUDA_ERROR_OUT_OF_MEMORY;
    if (used + size > total) return CUDA_ERROR_OUT_OF_MEMORY;
    for (int i = 1; i <= MAX_HANDLES; i++) {
        if (handles[i].live) continue;
        handles[i] = (struct handle){.live = 1, .size = size};
        used += size;
        vmm_counts[V_CREATES]++;
        *h = (unsigned long long)i;
        return CUDA_SUCCESS;
    }
    return CUDA_ERROR_OUT_OF_MEMORY;
}
static struct handle *get_handle(unsigned long long h) {
    if (h == 0 || h > MAX_HANDLES || !handles[h].live) return NULL;
    return &handles[h];
}
/* drop frees a handle's memory once it is released and unmapped. */
static void drop(struct handle *x) {
    if (x->released && !x->at) {
        used -= x->size;
        x->live = 0;
    }
}
int cuMemRelease(unsigned long long h) {
    if (ctx_device() < 0) return CUDA_ERROR_INVALID_CONTEXT;
    struct handle *x = get_handle(h);
    if (!x || x->released) return CUDA_ERROR_INVALID_VALUE;
    x->released = 1;
    vmm_counts[V_RELEASES]++;
    drop(x);
    return CUDA_SUCCESS;
}
int cuMemMap(uintptr_t ptr, size_t size, size_t offset, unsigned long long h, unsigned long long flags) {
    if (ctx_device() < 0) return CUDA_ERROR_INVALID_CONTEXT;
    struct handle *x = get_handle(h);
    struct reservation *r = find_res((void *)ptr, size);
    if (!x || x->released || x->at || size != x->size || offset || flags || !r || (ptr - (uintptr_t)r->base) % granularity)
        return CUDA_ERROR_INVALID_VALUE;
    if (fail_map_at >= 0 && map_calls++ == fail_map_at) return fail_map_code;
    size_t lo = (ptr - (uintptr_t)r->base) / granularity, n = size / granularity;
    for (size_t j = lo; j < lo + n; j++)
        if (r->state[j] != UNMAPPED) return CUDA_ERROR_INVALID_VALUE; /* mapped twice */
    for (size_t j = lo; j < lo + n; j++) {
        r->state[j] = MAPPED;
        r->handle[j] = (int)h;
    }
    x->at = (char *)ptr;
    vmm_counts[V_MAPS]++;
    return CUDA_SUCCESS;
}
int cuMemSetAccess(uintptr_t ptr, size_t size, const struct access *d, size_t count) {
    if (ctx_device() < 0) return CUDA_ERROR_INVALID_CONTEXT;
    struct reservation *r = find_res((void *)ptr, size);
    if (!r || count != 1 || !d || d->loc_type != 1 || d->loc_id != ctx_device() || d->flags != 3 ||
        size == 0 || (ptr - (uintptr_t)r->base) % granularity || size % granularity)
        return CUDA_ERROR_INVALID_VALUE;
    size_t lo = (ptr - (uintptr_t)r->base) / granularity, n = size / granularity;
    for (size_t j = lo; j < lo + n; j++)
        if (r->state[j] == UNMAPPED) return CUDA_ERROR_INVALID_VALUE;
    for (size_t j = lo; j < lo + n; j++) r->state[j] = ACCESSIBLE;
    vmm_counts[V_ACCESS]++;
    return CUDA_SUCCESS;
}
/* cuMemUnmap unmaps whole mappings only: every page of the range mapped,
 * and no mapping partly inside it. */
int cuMemUnmap(uintptr_t ptr, size_t size) {
    if (ctx_device() < 0) return CUDA_ERROR_INVALID_CONTEXT;
    struct reservation *r = find_res((void *)ptr, size);
    if (!r || size == 0 || (ptr - (uintptr_t)r->base) % granularity || size % granularity) return CUDA_ERROR_INVALID_VALUE;
    size_t lo = (ptr - (uintptr_t)r->base) / granularity, n = size / granularity;
    for (size_t j = lo; j < lo + n; j++) {
        if (r->state[j] == UNMAPPED) return CUDA_ERROR_INVALID_VALUE;
        struct handle *x = &handles[r->handle[j]];
        if ((uintptr_t)x->at < ptr || (uintptr_t)x->at + x->size > ptr + size) return CUDA_ERROR_INVALID_VALUE;
    }
    for (size_t j = lo; j < lo + n; j++) {
        struct handle *x = &handles[r->handle[j]];
        x->at = NULL;
        drop(x);
        r->state[j] = UNMAPPED;
        r->handle[j] = 0;
    }
    madvise((void *)ptr, size, MADV_DONTNEED); /* the memory is gone */
    vmm_counts[V_UNMAPS]++;
    return CUDA_SUCCESS;
}
#endif /* OMIT_VMM */
#endif /* OMIT_DRIVER */

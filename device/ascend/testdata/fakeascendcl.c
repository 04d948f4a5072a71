// A stand-in for libascendcl built at test time, so that the purego bindings
// are exercised without an NPU. Device memory is host memory from malloc and
// copies are synchronous memmove. Like AscendCL, the context is per thread:
// calls on a thread without a current context fail with
// ACL_ERROR_RT_CONTEXT_NULL, and a never-recorded event queries as not ready.
//
// The virtual memory calls (aclrtReserveMemAddress, aclrtMallocPhysical,
// aclrtMapMem, ...) are modelled over host address space: a copy touching a
// reserved page that is not mapped fails, as the NPU would fault.
//
// Variants: -DOMIT_QUERY drops aclrtQueryEventStatus (missing-symbol test),
// -DOMIT_TIMING drops the event timing calls (an older runtime),
// -DOMIT_VMM drops the virtual memory calls, -DFAKE_SOC='"..."' sets the
// SoC name.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#ifndef FAKE_SOC
#define FAKE_SOC "FakeAscend910B"
#endif

enum {
    ACL_SUCCESS = 0,
    ACL_ERROR_INVALID_PARAM = 100000,
    ACL_ERROR_UNINITIALIZE = 100001,
    ACL_ERROR_REPEAT_INITIALIZE = 100002,
    ACL_ERROR_REPEAT_FINALIZE = 100037,
    ACL_ERROR_RT_PARAM_INVALID = 107000,
    ACL_ERROR_RT_INVALID_DEVICEID = 107001,
    ACL_ERROR_RT_CONTEXT_NULL = 107002,
    ACL_ERROR_RT_MEMORY_ALLOCATION = 207001,
};

#define MAX_ALLOCS 4096
#define STREAM_MAGIC 0x5354524dU
#define EVENT_MAGIC 0x4556544eU

struct alloc { void *p; size_t n; int host; };
struct obj { unsigned magic; int recorded; unsigned flags; long long t; };

static struct alloc allocs[MAX_ALLOCS];
static size_t total = (size_t)1 << 30, used;
static int initialized, device_count = 2;
static int ctxs[2];
static __thread void *current_ctx;
static long long alloc_calls, fail_alloc_at = -1;
static int fail_copy_code, query_not_ready;
static long long clock_ns;                /* the device clock events record */
static int elapsed_not_ready, fail_elapsed_code;
static long long last[16];
static void vmm_reset(void);
static int vmm_check(const void *p, size_t n);

enum { L_KIND, L_COUNT, L_DESTMAX, L_STREAM, L_POLICY, L_MEMATTR, L_INITS,
       L_FINALIZES, L_ASYNC_COPIES, L_WAITS, L_RESETS, L_DEVICE };

__attribute__((constructor)) void fake_reset(void) {
    for (int i = 0; i < MAX_ALLOCS; i++) { free(allocs[i].p); allocs[i].p = NULL; }
    used = 0;
    total = (size_t)1 << 30;
    alloc_calls = 0; fail_alloc_at = -1; fail_copy_code = 0; query_not_ready = 0;
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
int fake_initialized(void) { return initialized; }
/* Drops this thread's context, as on a thread that never called aclrtSetDevice. */
void fake_clear_context(void) { current_ctx = NULL; }

static int track(void *p, size_t n, int host) {
    for (int i = 0; i < MAX_ALLOCS; i++)
        if (!allocs[i].p) { allocs[i].p = p; allocs[i].n = n; allocs[i].host = host; return 0; }
    return -1;
}
static int untrack(void *p, int host) {
    for (int i = 0; i < MAX_ALLOCS; i++)
        if (allocs[i].p == p && allocs[i].host == host) {
            if (!host) used -= allocs[i].n;
            free(p); allocs[i].p = NULL;
            return 0;
        }
    return -1;
}

#define NEED_CTX() do { if (!initialized) return ACL_ERROR_UNINITIALIZE; \
                        if (!current_ctx) return ACL_ERROR_RT_CONTEXT_NULL; } while (0)

int aclInit(const char *config) {
    last[L_INITS]++;
    if (config) return ACL_ERROR_INVALID_PARAM; /* tests expect NULL */
    if (initialized) return ACL_ERROR_REPEAT_INITIALIZE;
    initialized = 1;
    return ACL_SUCCESS;
}
int aclFinalize(void) {
    last[L_FINALIZES]++;
    if (!initialized) return ACL_ERROR_REPEAT_FINALIZE;
    initialized = 0;
    return ACL_SUCCESS;
}
int aclrtGetDeviceCount(uint32_t *n) { *n = (uint32_t)device_count; return ACL_SUCCESS; }
int aclrtSetDevice(int32_t id) {
    if (!initialized) return ACL_ERROR_UNINITIALIZE;
    if (id < 0 || id >= device_count) return ACL_ERROR_RT_INVALID_DEVICEID;
    current_ctx = &ctxs[id];
    last[L_DEVICE] = id;
    return ACL_SUCCESS;
}
int aclrtResetDevice(int32_t id) { last[L_RESETS]++; (void)id; return ACL_SUCCESS; }
int aclrtGetCurrentContext(void **ctx) { NEED_CTX(); *ctx = current_ctx; return ACL_SUCCESS; }
int aclrtSetCurrentContext(void *ctx) {
    if (ctx != &ctxs[0] && ctx != &ctxs[1]) return ACL_ERROR_INVALID_PARAM;
    current_ctx = ctx;
    return ACL_SUCCESS;
}
int aclrtSynchronizeDevice(void) { NEED_CTX(); return ACL_SUCCESS; }
const char *aclrtGetSocName(void) { return FAKE_SOC; }

int aclrtMalloc(void **p, size_t n, int policy) {
    NEED_CTX();
    last[L_POLICY] = policy;
    if (fail_alloc_at >= 0 && alloc_calls++ == fail_alloc_at) return ACL_ERROR_RT_MEMORY_ALLOCATION;
    if (n == 0) return ACL_ERROR_INVALID_PARAM;
    if (used + n > total) return ACL_ERROR_RT_MEMORY_ALLOCATION;
    void *m = malloc(n);
    if (!m || track(m, n, 0)) { free(m); return ACL_ERROR_RT_MEMORY_ALLOCATION; }
    used += n; *p = m;
    return ACL_SUCCESS;
}
int aclrtFree(void *p) { NEED_CTX(); return untrack(p, 0) ? ACL_ERROR_INVALID_PARAM : ACL_SUCCESS; }
int aclrtMallocHost(void **p, size_t n) {
    NEED_CTX();
    void *m = malloc(n ? n : 1);
    if (!m || track(m, n, 1)) { free(m); return ACL_ERROR_RT_MEMORY_ALLOCATION; }
    *p = m;
    return ACL_SUCCESS;
}
int aclrtFreeHost(void *p) { NEED_CTX(); return untrack(p, 1) ? ACL_ERROR_INVALID_PARAM : ACL_SUCCESS; }
int aclrtGetMemInfo(int attr, size_t *f, size_t *t) {
    NEED_CTX();
    last[L_MEMATTR] = attr;
    *f = total - used; *t = total;
    return ACL_SUCCESS;
}

static int valid_stream(void *s) { return s == NULL || ((struct obj *)s)->magic == STREAM_MAGIC; }
static int valid_event(void *e) { return e && ((struct obj *)e)->magic == EVENT_MAGIC; }

int aclrtMemcpyAsync(void *dst, size_t destMax, const void *src, size_t n, int kind, void *stream) {
    NEED_CTX();
    last[L_KIND] = kind; last[L_COUNT] = (long long)n; last[L_DESTMAX] = (long long)destMax;
    last[L_STREAM] = (long long)(uintptr_t)stream; last[L_ASYNC_COPIES]++;
    if (fail_copy_code) { int c = fail_copy_code; fail_copy_code = 0; return c; }
    if (kind < 1 || kind > 3 || n > destMax || !valid_stream(stream)) return ACL_ERROR_INVALID_PARAM;
    if (vmm_check(dst, n) || vmm_check(src, n)) return ACL_ERROR_RT_PARAM_INVALID;
    memmove(dst, src, n);
    return ACL_SUCCESS;
}
int aclrtMemcpy(void *dst, size_t destMax, const void *src, size_t n, int kind) {
    NEED_CTX();
    last[L_KIND] = kind; last[L_COUNT] = (long long)n; last[L_DESTMAX] = (long long)destMax;
    if (kind < 1 || kind > 3 || n > destMax) return ACL_ERROR_INVALID_PARAM;
    if (vmm_check(dst, n) || vmm_check(src, n)) return ACL_ERROR_RT_PARAM_INVALID;
    memmove(dst, src, n);
    return ACL_SUCCESS;
}

int aclrtCreateStream(void **s) {
    NEED_CTX();
    struct obj *o = calloc(1, sizeof *o);
    o->magic = STREAM_MAGIC; *s = o;
    return ACL_SUCCESS;
}
int aclrtDestroyStream(void *s) {
    NEED_CTX();
    if (!s || !valid_stream(s)) return ACL_ERROR_INVALID_PARAM;
    ((struct obj *)s)->magic = 0; free(s);
    return ACL_SUCCESS;
}
int aclrtSynchronizeStream(void *s) { NEED_CTX(); return valid_stream(s) ? ACL_SUCCESS : ACL_ERROR_INVALID_PARAM; }
int aclrtStreamWaitEvent(void *s, void *e) {
    NEED_CTX();
    last[L_WAITS]++;
    return valid_stream(s) && valid_event(e) ? ACL_SUCCESS : ACL_ERROR_INVALID_PARAM;
}
int aclrtCreateEvent(void **e) {
    NEED_CTX();
    struct obj *o = calloc(1, sizeof *o);
    o->magic = EVENT_MAGIC; *e = o;
    return ACL_SUCCESS;
}
int aclrtDestroyEvent(void *e) {
    NEED_CTX();
    if (!valid_event(e)) return ACL_ERROR_INVALID_PARAM;
    ((struct obj *)e)->magic = 0; free(e);
    return ACL_SUCCESS;
}
int aclrtRecordEvent(void *e, void *s) {
    NEED_CTX();
    if (!valid_event(e) || !valid_stream(s)) return ACL_ERROR_INVALID_PARAM;
    ((struct obj *)e)->recorded = 1;
    ((struct obj *)e)->t = clock_ns;
    return ACL_SUCCESS;
}
#ifndef OMIT_TIMING
int aclrtCreateEventWithFlag(void **e, unsigned flag) {
    NEED_CTX();
    struct obj *o = calloc(1, sizeof *o);
    o->magic = EVENT_MAGIC; o->flags = flag; *e = o;
    return ACL_SUCCESS;
}
/* Events without ACL_EVENT_TIME_LINE (0x8) are refused; a never-recorded
   one is not complete. */
int aclrtEventElapsedTime(float *ms, void *start, void *end) {
    NEED_CTX();
    if (!ms || !valid_event(start) || !valid_event(end)) return ACL_ERROR_INVALID_PARAM;
    struct obj *a = start, *b = end;
    if (!(a->flags & 0x8) || !(b->flags & 0x8)) return ACL_ERROR_INVALID_PARAM;
    if (fail_elapsed_code) { int c = fail_elapsed_code; fail_elapsed_code = 0; return c; }
    if (!a->recorded || !b->recorded || elapsed_not_ready > 0) {
        if (elapsed_not_ready > 0) elapsed_not_ready--;
        return 507006; /* ACL_ERROR_RT_EVENT_NOT_COMPLETE */
    }
    *ms = (float)((double)(b->t - a->t) / 1e6);
    return ACL_SUCCESS;
}
#endif
#ifndef OMIT_QUERY
int aclrtQueryEventStatus(void *e, int *status) {
    NEED_CTX();
    if (!valid_event(e)) return ACL_ERROR_INVALID_PARAM;
    int ready = ((struct obj *)e)->recorded;
    if (query_not_ready > 0) { query_not_ready--; ready = 0; }
    *status = ready ? 1 : 0; /* ACL_EVENT_RECORDED_STATUS_COMPLETE : _NOT_READY */
    return ACL_SUCCESS;
}
#endif
int aclrtSynchronizeEvent(void *e) { NEED_CTX(); return valid_event(e) ? ACL_SUCCESS : ACL_ERROR_INVALID_PARAM; }

/* ---- virtual memory ---- */

#define MAX_RES 64
#define MAX_HANDLES 65536

struct reservation { char *base; size_t size; int *handle; /* per page, 0 unmapped */ };
struct handle { int live; size_t size; char *at; };

static struct reservation res[MAX_RES];
static struct handle handles[MAX_HANDLES + 1];
static size_t granularity;
static long long malloc_calls, fail_malloc_at = -1, map_calls, fail_map_at = -1;
static int fail_map_code;
static long long vmm_counts[8];
enum { V_MALLOCS, V_MAPS, V_UNMAPS, V_FREES, V_RESERVES, V_RELEASES };

static void vmm_reset(void) {
    for (int i = 0; i < MAX_RES; i++) {
        if (res[i].base) { munmap(res[i].base, res[i].size); free(res[i].handle); }
    }
    memset(res, 0, sizeof res);
    memset(handles, 0, sizeof handles);
    granularity = (size_t)2 << 20;
    malloc_calls = map_calls = 0;
    fail_malloc_at = fail_map_at = -1;
    fail_map_code = 0;
    memset(vmm_counts, 0, sizeof vmm_counts);
}
void fake_set_granularity(long long n) { granularity = (size_t)n; }
void fake_fail_malloc_physical_after(long long n) { fail_malloc_at = malloc_calls + n; }
void fake_fail_map_after(long long n, int code) { fail_map_at = map_calls + n; fail_map_code = code; }
long long fake_vmm_count(int i) { return vmm_counts[i]; }
long long fake_live_handles(void) {
    long long n = 0;
    for (int i = 1; i <= MAX_HANDLES; i++) n += handles[i].live;
    return n;
}
long long fake_reservations(void) {
    long long n = 0;
    for (int i = 0; i < MAX_RES; i++) n += res[i].base != NULL;
    return n;
}
long long fake_used(void) { return (long long)used; }

static struct reservation *find_res(const void *p, size_t n) {
    const char *c = p;
    for (int i = 0; i < MAX_RES; i++)
        if (res[i].base && c >= res[i].base && c + n <= res[i].base + res[i].size) return &res[i];
    return NULL;
}
static int vmm_check(const void *p, size_t n) {
    const char *c = p;
    for (int i = 0; i < MAX_RES; i++) {
        struct reservation *r = &res[i];
        if (!r->base || c + n <= r->base || c >= r->base + r->size) continue;
        if (c < r->base || c + n > r->base + r->size) return -1;
        if (n == 0) return 0;
        for (size_t j = (size_t)(c - r->base) / granularity; j <= (size_t)(c + n - 1 - r->base) / granularity; j++)
            if (!r->handle[j]) return -1;
    }
    return 0;
}

#ifndef OMIT_VMM
/* aclrtPhysicalMemProp, as acl_rt.h lays it out. */
struct prop { int handle_type, allocation_type, mem_attr; unsigned loc_id; int loc_type; uint64_t reserve; };

static int ctx_id(void) { return current_ctx == &ctxs[0] ? 0 : current_ctx == &ctxs[1] ? 1 : -1; }
static int valid_prop(const struct prop *p) {
    return p && p->handle_type == 0 && p->allocation_type == 0 && p->mem_attr == 4 && p->loc_type == 1 &&
           (int)p->loc_id == ctx_id();
}

int aclrtMemGetAllocationGranularity(const struct prop *p, int option, size_t *g) {
    NEED_CTX();
    if (!valid_prop(p) || (option != 0 && option != 1)) return ACL_ERROR_INVALID_PARAM;
    *g = granularity;
    return ACL_SUCCESS;
}
int aclrtReserveMemAddress(void **ptr, size_t size, size_t align, void *expect, uint64_t flags) {
    NEED_CTX();
    if (size == 0 || size % granularity || align || expect || flags) return ACL_ERROR_INVALID_PARAM;
    for (int i = 0; i < MAX_RES; i++) {
        if (res[i].base) continue;
        char *m = mmap(NULL, size + granularity, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED) return ACL_ERROR_RT_MEMORY_ALLOCATION;
        char *base = (char *)(((uintptr_t)m + granularity - 1) & ~(uintptr_t)(granularity - 1));
        if (base > m) munmap(m, (size_t)(base - m));
        munmap(base + size, (size_t)(m + size + granularity - (base + size)));
        res[i] = (struct reservation){.base = base, .size = size, .handle = calloc(size / granularity, sizeof(int))};
        vmm_counts[V_RESERVES]++;
        *ptr = base;
        return ACL_SUCCESS;
    }
    return ACL_ERROR_RT_MEMORY_ALLOCATION;
}
int aclrtReleaseMemAddress(void *ptr) {
    NEED_CTX();
    for (int i = 0; i < MAX_RES; i++) {
        struct reservation *r = &res[i];
        if (r->base != ptr) continue;
        for (size_t j = 0; j < r->size / granularity; j++)
            if (r->handle[j]) return ACL_ERROR_INVALID_PARAM; /* unmap first */
        munmap(r->base, r->size);
        free(r->handle);
        memset(r, 0, sizeof *r);
        vmm_counts[V_RELEASES]++;
        return ACL_SUCCESS;
    }
    return ACL_ERROR_INVALID_PARAM;
}
int aclrtMallocPhysical(void **h, size_t size, const struct prop *p, uint64_t flags) {
    NEED_CTX();
    if (size == 0 || size % granularity || flags || !valid_prop(p)) return ACL_ERROR_INVALID_PARAM;
    if (fail_malloc_at >= 0 && malloc_calls++ == fail_malloc_at) return ACL_ERROR_RT_MEMORY_ALLOCATION;
    if (used + size > total) return ACL_ERROR_RT_MEMORY_ALLOCATION;
    for (int i = 1; i <= MAX_HANDLES; i++) {
        if (handles[i].live) continue;
        handles[i] = (struct handle){.live = 1, .size = size};
        used += size;
        vmm_counts[V_MALLOCS]++;
        *h = (void *)(uintptr_t)i;
        return ACL_SUCCESS;
    }
    return ACL_ERROR_RT_MEMORY_ALLOCATION;
}
static struct handle *get_handle(void *h) {
    uintptr_t i = (uintptr_t)h;
    if (i == 0 || i > MAX_HANDLES || !handles[i].live) return NULL;
    return &handles[i];
}
int aclrtFreePhysical(void *h) {
    NEED_CTX();
    struct handle *x = get_handle(h);
    if (!x || x->at) return ACL_ERROR_INVALID_PARAM; /* unmap first */
    used -= x->size;
    x->live = 0;
    vmm_counts[V_FREES]++;
    return ACL_SUCCESS;
}
int aclrtMapMem(void *ptr, size_t size, size_t offset, void *h, uint64_t flags) {
    NEED_CTX();
    struct handle *x = get_handle(h);
    struct reservation *r = find_res(ptr, size);
    if (!x || x->at || size != x->size || offset || flags || !r || ((char *)ptr - r->base) % granularity)
        return ACL_ERROR_INVALID_PARAM;
    if (fail_map_at >= 0 && map_calls++ == fail_map_at) return fail_map_code;
    size_t lo = (size_t)((char *)ptr - r->base) / granularity, n = size / granularity;
    for (size_t j = lo; j < lo + n; j++)
        if (r->handle[j]) return ACL_ERROR_INVALID_PARAM; /* mapped twice */
    for (size_t j = lo; j < lo + n; j++) r->handle[j] = (int)(uintptr_t)h;
    x->at = ptr;
    vmm_counts[V_MAPS]++;
    return ACL_SUCCESS;
}
/* aclrtUnmapMem unmaps the one mapping that starts at ptr. */
int aclrtUnmapMem(void *ptr) {
    NEED_CTX();
    struct reservation *r = find_res(ptr, 1);
    if (!r || ((char *)ptr - r->base) % granularity) return ACL_ERROR_INVALID_PARAM;
    size_t lo = (size_t)((char *)ptr - r->base) / granularity;
    struct handle *x = r->handle[lo] ? &handles[r->handle[lo]] : NULL;
    if (!x || x->at != ptr) return ACL_ERROR_INVALID_PARAM;
    for (size_t j = lo; j < lo + x->size / granularity; j++) r->handle[j] = 0;
    madvise(ptr, x->size, MADV_DONTNEED);
    x->at = NULL;
    vmm_counts[V_UNMAPS]++;
    return ACL_SUCCESS;
}
#endif /* OMIT_VMM */

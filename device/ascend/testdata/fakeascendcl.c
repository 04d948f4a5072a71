// A stand-in for libascendcl built at test time, so that the purego bindings
// are exercised without an NPU. Device memory is host memory from malloc and
// copies are synchronous memmove. Like AscendCL, the context is per thread:
// calls on a thread without a current context fail with
// ACL_ERROR_RT_CONTEXT_NULL, and a never-recorded event queries as not ready.
//
// Variants: -DOMIT_QUERY drops aclrtQueryEventStatus (missing-symbol test),
// -DFAKE_SOC='"..."' sets the SoC name.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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
struct obj { unsigned magic; int recorded; };

static struct alloc allocs[MAX_ALLOCS];
static size_t total = (size_t)1 << 30, used;
static int initialized, device_count = 2;
static int ctxs[2];
static __thread void *current_ctx;
static long long alloc_calls, fail_alloc_at = -1;
static int fail_copy_code, query_not_ready;
static long long last[16];

enum { L_KIND, L_COUNT, L_DESTMAX, L_STREAM, L_POLICY, L_MEMATTR, L_INITS,
       L_FINALIZES, L_ASYNC_COPIES, L_WAITS, L_RESETS, L_DEVICE };

__attribute__((constructor)) void fake_reset(void) {
    for (int i = 0; i < MAX_ALLOCS; i++) { free(allocs[i].p); allocs[i].p = NULL; }
    used = 0;
    total = (size_t)1 << 30;
    alloc_calls = 0; fail_alloc_at = -1; fail_copy_code = 0; query_not_ready = 0;
    memset(last, 0, sizeof last);
}
void fake_set_total(long long n) { total = (size_t)n; }
void fake_fail_alloc_after(long long n) { fail_alloc_at = alloc_calls + n; }
void fake_fail_next_copy(int code) { fail_copy_code = code; }
void fake_query_not_ready(int n) { query_not_ready = n; }
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
    memmove(dst, src, n);
    return ACL_SUCCESS;
}
int aclrtMemcpy(void *dst, size_t destMax, const void *src, size_t n, int kind) {
    NEED_CTX();
    last[L_KIND] = kind; last[L_COUNT] = (long long)n; last[L_DESTMAX] = (long long)destMax;
    if (kind < 1 || kind > 3 || n > destMax) return ACL_ERROR_INVALID_PARAM;
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
    return ACL_SUCCESS;
}
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

// A stand-in for libcudart built at test time, so that the purego bindings are
// exercised without a GPU: argument passing, return codes, error mapping,
// events and library lookup. Device memory is host memory from malloc and
// copies are synchronous memcpy, so every event is complete as soon as it is
// recorded unless a test injects "not ready" answers.
//
// Variants: -DOMIT_EVENT_QUERY drops cudaEventQuery (missing-symbol test),
// -DOMIT_ERROR_NAME drops cudaGetErrorName (built-in name table),
// -DFAKE_NAME='"..."' sets the device name.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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
    cudaErrorUnknown = 999,
};

#define MAX_ALLOCS 4096
#define STREAM_MAGIC 0x5354524dU
#define EVENT_MAGIC 0x4556544eU

struct alloc { void *p; size_t n; int host; };
struct obj { unsigned magic; unsigned flags; int recorded; };

static struct alloc allocs[MAX_ALLOCS];
static size_t total = (size_t)1 << 30, used;
static int device_count = 2, current_device;
static long long alloc_calls, fail_alloc_at = -1;  /* fail the N-th cudaMalloc from now */
static int fail_copy_code;                         /* next cudaMemcpyAsync returns this */
static int query_not_ready;                        /* next N cudaEventQuery return 600 */
static long long last[16];

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
    memset(last, 0, sizeof last);
}
void fake_set_total(long long n) { total = (size_t)n; }
void fake_fail_alloc_after(long long n) { fail_alloc_at = alloc_calls + n; }
void fake_fail_next_copy(int code) { fail_copy_code = code; }
void fake_query_not_ready(int n) { query_not_ready = n; }
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
    memmove(dst, src, n);
    return cudaSuccess;
}
int cudaMemcpy(void *dst, const void *src, size_t n, int kind) {
    last[L_KIND] = kind; last[L_COUNT] = (long long)n; last[L_SYNC_COPIES]++;
    if (kind < 1 || kind > 3) return cudaErrorInvalidValue;
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

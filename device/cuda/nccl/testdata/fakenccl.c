// A stand-in for libnccl built at test time, so that the purego bindings
// and the Channel are exercised without a GPU. "Device memory" is host
// memory (fake_dev_alloc), and a communicator of N ranks lives in this one
// process: ncclCommInitAll makes N at once, ncclCommInitRank and
// ncclCommInitRankScalable join the ranks that pass the same id.
//
// Streams are plain keys (any cudaStream_t value, never dereferenced) of
// in-order queues. A collective is queued on the caller's stream and runs
// when every rank of its communicator has queued its part and each part has
// reached the front of its stream (the copies queued before it ran), as
// on a GPU; the k-th collective of each rank matches the k-th of the
// others. Copies queued with fake_memcpy_async run when they reach the
// front. Everything runs under one mutex, in the calls themselves: nothing
// runs in the background, so results are deterministic. The tests poll
// fake_stream_completed against fake_stream_ticket as they would an event.
//
// ncclGroupStart/ncclGroupEnd defer a thread's collectives to its
// ncclGroupEnd (the group is per thread, as in NCCL). ncclCommAbort frees a
// rank's queued parts (its stream moves on); the collectives it was part of
// never run, so the other ranks wait, as they would for a dead peer.
//
// Test hooks: fake_reset, fake_fail_next (the next call of a name returns a
// code, with a last-error message), fake_set_async_error,
// fake_last_init_kind and fake_last_id (what the initialiser received),
// fake_live_comms, fake_live_allocs, fake_collectives.
//
// Variants: -DOMIT_SCALABLE drops ncclCommInitRankScalable (NCCL before
// 2.23: InitRank passes the id by value), -DOMIT_LAST_ERROR drops
// ncclGetLastError, -DOMIT_ALLREDUCE drops ncclAllReduce (missing-symbol
// test), -DFAKE_VERSION=n sets the version code.
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef FAKE_VERSION
#define FAKE_VERSION 22703
#endif

typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7,
    ncclTimeout = 8,
    ncclNumResults = 9
} ncclResult_t;

enum { ncclInt8, ncclUint8, ncclInt32, ncclUint32, ncclInt64, ncclUint64,
       ncclFloat16, ncclFloat32, ncclFloat64, ncclBfloat16, ncclNumTypes = 10 };
enum { ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg, ncclNumOps };

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct { char internal[NCCL_UNIQUE_ID_BYTES]; } ncclUniqueId;

#define MAX_RANKS 16
#define MAX_GROUPS 64
#define MAX_COMMS 256
#define MAX_SLOTS 64
#define MAX_STREAMS 256
#define QCAP 256
#define MAX_DEFER 256
#define MAX_ALLOCS 4096

enum { OP_BCAST = 1, OP_ALLREDUCE = 2 };

struct slot {
    int used, executed, kind;
    long long seq;
    size_t count;
    int dtype, op, root;
    int posted, popped;
    unsigned front;               /* ranks whose part is at the front of its stream */
    const void *send[MAX_RANKS];
    void *recv[MAX_RANKS];
};

struct group {
    int used, n, joined;
    int has_id;
    ncclUniqueId id;
    struct comm *ranks[MAX_RANKS];
    long long next_seq[MAX_RANKS];
    struct slot slots[MAX_SLOTS];
};

struct comm {
    int used, freed, aborted;
    struct group *g;
    int rank, dev;
    int async_err;
};

struct qop {
    int kind;                     /* 0 copy, 1 collective part */
    void *dst; const void *src; size_t n;
    struct comm *c; struct slot *slot; long long seq;
};

struct stream {
    int used;
    uintptr_t key;
    long long enq, done;
    int head, len;
    struct qop q[QCAP];
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct group groups[MAX_GROUPS];
static struct comm comms[MAX_COMMS];
static struct stream streams[MAX_STREAMS];
static void *allocs[MAX_ALLOCS];
static int device_count = 8;
static long long id_counter, stream_counter, collectives;
static char fail_call[64];
static int fail_code;
static char last_msg[256];
static int last_init_kind;        /* 1 ncclCommInitRank, 2 ncclCommInitRankScalable, 3 ncclCommInitAll */
static ncclUniqueId last_id;

struct deferred {
    int kind;
    struct comm *c;
    const void *send; void *recv; size_t count;
    int dtype, op, root;
    uintptr_t stream;
};
static __thread int group_depth;
static __thread int ndefer;
static __thread struct deferred defer_list[MAX_DEFER];

static void setmsg(const char *m) { snprintf(last_msg, sizeof last_msg, "%s", m); }

/* inject returns the injected code for call, if any (mu held). */
static int inject(const char *call) {
    if (fail_code && (fail_call[0] == 0 || strcmp(fail_call, call) == 0)) {
        int rc = fail_code;
        fail_code = 0;
        snprintf(last_msg, sizeof last_msg, "fake: injected failure in %s", call);
        return rc;
    }
    return 0;
}

void fake_reset(void) {
    pthread_mutex_lock(&mu);
    memset(groups, 0, sizeof groups);
    memset(comms, 0, sizeof comms);
    memset(streams, 0, sizeof streams);
    for (int i = 0; i < MAX_ALLOCS; i++) { free(allocs[i]); allocs[i] = NULL; }
    const char *env = getenv("FAKE_NCCL_DEVICES");
    device_count = env ? atoi(env) : 8;
    stream_counter = 0; collectives = 0;
    fail_code = 0; fail_call[0] = 0; last_msg[0] = 0;
    last_init_kind = 0;
    memset(&last_id, 0, sizeof last_id);
    pthread_mutex_unlock(&mu);
}

void fake_fail_next(const char *call, int code) {
    pthread_mutex_lock(&mu);
    snprintf(fail_call, sizeof fail_call, "%s", call ? call : "");
    fail_code = code;
    pthread_mutex_unlock(&mu);
}

void fake_set_async_error(uintptr_t h, int code) {
    pthread_mutex_lock(&mu);
    ((struct comm *)h)->async_err = code;
    pthread_mutex_unlock(&mu);
}

int fake_last_init_kind(void) { return last_init_kind; }
void fake_last_id(ncclUniqueId *out) { *out = last_id; }
long long fake_collectives(void) { return collectives; }

int fake_live_comms(void) {
    int n = 0;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < MAX_COMMS; i++) n += comms[i].used && !comms[i].freed;
    pthread_mutex_unlock(&mu);
    return n;
}

/* Device memory: zeroed host memory. */
void *fake_dev_alloc(size_t n) {
    pthread_mutex_lock(&mu);
    void *p = NULL;
    for (int i = 0; i < MAX_ALLOCS; i++) {
        if (!allocs[i]) { p = allocs[i] = calloc(1, n ? n : 1); break; }
    }
    pthread_mutex_unlock(&mu);
    return p;
}

int fake_dev_free(void *p) {
    int rc = 1;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < MAX_ALLOCS; i++) {
        if (allocs[i] == p) { free(p); allocs[i] = NULL; rc = 0; break; }
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

int fake_live_allocs(void) {
    int n = 0;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < MAX_ALLOCS; i++) n += allocs[i] != NULL;
    pthread_mutex_unlock(&mu);
    return n;
}

/* ---- streams ---- */

static struct stream *find_stream(uintptr_t key, int create) {
    struct stream *free_slot = NULL;
    for (int i = 0; i < MAX_STREAMS; i++) {
        if (streams[i].used && streams[i].key == key) return &streams[i];
        if (!streams[i].used && !free_slot) free_slot = &streams[i];
    }
    if (!create || !free_slot) return NULL;
    memset(free_slot, 0, sizeof *free_slot);
    free_slot->used = 1;
    free_slot->key = key;
    return free_slot;
}

static int push(struct stream *s, struct qop op) {
    if (s->len == QCAP) return -1;
    s->q[(s->head + s->len) % QCAP] = op;
    s->len++;
    s->enq++;
    return 0;
}

static void pop(struct stream *s) {
    s->head = (s->head + 1) % QCAP;
    s->len--;
    s->done++;
}

static size_t type_size(int dt) {
    switch (dt) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    }
    return 0;
}

static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        if (man == 0) bits = sign;
        else {
            exp = 127 - 15 + 1;
            while (!(man & 0x400)) { man <<= 1; exp--; }
            bits = sign | (exp << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) bits = sign | 0x7f800000 | (man << 13);
    else bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static uint16_t float_to_half(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    int exp = (int)((x >> 23) & 0xff) - 127 + 15;
    uint32_t man = x & 0x7fffff;
    if (((x >> 23) & 0xff) == 0xff) return (uint16_t)(sign | 0x7c00 | (man ? 0x200 : 0));
    if (exp >= 31) return (uint16_t)(sign | 0x7c00);
    if (exp <= 0) {
        if (exp < -10) return (uint16_t)sign;
        man |= 0x800000;
        uint32_t shift = (uint32_t)(14 - exp);
        uint32_t h = man >> shift, rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1))) h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = sign | ((uint32_t)exp << 10) | (man >> 13), rem = man & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
    return (uint16_t)h;
}

static double load(int dt, const void *p, size_t i) {
    switch (dt) {
    case ncclInt8: return ((const int8_t *)p)[i];
    case ncclUint8: return ((const uint8_t *)p)[i];
    case ncclInt32: return ((const int32_t *)p)[i];
    case ncclUint32: return ((const uint32_t *)p)[i];
    case ncclInt64: return (double)((const int64_t *)p)[i];
    case ncclUint64: return (double)((const uint64_t *)p)[i];
    case ncclFloat16: return half_to_float(((const uint16_t *)p)[i]);
    case ncclFloat32: return ((const float *)p)[i];
    case ncclFloat64: return ((const double *)p)[i];
    case ncclBfloat16: {
        uint32_t bits = (uint32_t)((const uint16_t *)p)[i] << 16;
        float f;
        memcpy(&f, &bits, 4);
        return f;
    }
    }
    return 0;
}

static void store(int dt, void *p, size_t i, double v) {
    switch (dt) {
    case ncclInt8: ((int8_t *)p)[i] = (int8_t)v; break;
    case ncclUint8: ((uint8_t *)p)[i] = (uint8_t)v; break;
    case ncclInt32: ((int32_t *)p)[i] = (int32_t)v; break;
    case ncclUint32: ((uint32_t *)p)[i] = (uint32_t)v; break;
    case ncclInt64: ((int64_t *)p)[i] = (int64_t)v; break;
    case ncclUint64: ((uint64_t *)p)[i] = (uint64_t)v; break;
    case ncclFloat16: ((uint16_t *)p)[i] = float_to_half((float)v); break;
    case ncclFloat32: ((float *)p)[i] = (float)v; break;
    case ncclFloat64: ((double *)p)[i] = v; break;
    case ncclBfloat16: {
        float f = (float)v;
        uint32_t bits;
        memcpy(&bits, &f, 4);
        bits += 0x7fff + ((bits >> 16) & 1); /* round to nearest even */
        ((uint16_t *)p)[i] = (uint16_t)(bits >> 16);
        break;
    }
    }
}

static void execute(struct group *g, struct slot *sl) {
    size_t bytes = sl->count * type_size(sl->dtype);
    if (sl->kind == OP_BCAST) {
        for (int r = 0; r < g->n; r++)
            if (sl->recv[r] != sl->send[sl->root]) memmove(sl->recv[r], sl->send[sl->root], bytes);
    } else {
        void *tmp = malloc(bytes ? bytes : 1);
        for (size_t i = 0; i < sl->count; i++) {
            double acc = load(sl->dtype, sl->send[0], i);
            for (int r = 1; r < g->n; r++) {
                double v = load(sl->dtype, sl->send[r], i);
                switch (sl->op) {
                case ncclSum: case ncclAvg: acc += v; break;
                case ncclProd: acc *= v; break;
                case ncclMax: if (v > acc) acc = v; break;
                case ncclMin: if (v < acc) acc = v; break;
                }
            }
            if (sl->op == ncclAvg) acc /= g->n;
            store(sl->dtype, tmp, i, acc);
        }
        for (int r = 0; r < g->n; r++) memcpy(sl->recv[r], tmp, bytes);
        free(tmp);
    }
    sl->executed = 1;
    collectives++;
}

static int group_aborted(struct group *g) {
    for (int r = 0; r < g->n; r++)
        if (g->ranks[r] && g->ranks[r]->aborted) return 1;
    return 0;
}

/* progress runs every copy and collective that can run (mu held). */
static void progress(void) {
    int changed = 1;
    while (changed) {
        changed = 0;
        for (int i = 0; i < MAX_STREAMS; i++) {
            struct stream *s = &streams[i];
            while (s->used && s->len > 0) {
                struct qop *op = &s->q[s->head];
                if (op->kind == 0) {
                    if (op->n) memmove(op->dst, op->src, op->n);
                } else if (op->c->aborted) {
                    /* the part of an aborted rank is dropped */
                } else if (op->slot->seq != op->seq || !op->slot->executed) {
                    op->slot->front |= 1u << op->c->rank;
                    break;
                } else if (++op->slot->popped == op->c->g->n) {
                    op->slot->used = 0;
                }
                pop(s);
                changed = 1;
            }
        }
        for (int gi = 0; gi < MAX_GROUPS; gi++) {
            struct group *g = &groups[gi];
            if (!g->used || group_aborted(g)) continue;
            for (int k = 0; k < MAX_SLOTS; k++) {
                struct slot *sl = &g->slots[k];
                if (sl->used && !sl->executed && sl->posted == g->n && sl->front == (1u << g->n) - 1) {
                    execute(g, sl);
                    changed = 1;
                }
            }
        }
    }
}

/* fake stream API for the tests' Memory */
uintptr_t fake_stream_create(void) {
    pthread_mutex_lock(&mu);
    uintptr_t key = (uintptr_t)0x5eed0000 + (uintptr_t)(++stream_counter) * 16;
    find_stream(key, 1);
    pthread_mutex_unlock(&mu);
    return key;
}

void fake_stream_destroy(uintptr_t key) {
    pthread_mutex_lock(&mu);
    struct stream *s = find_stream(key, 0);
    if (s && s->len == 0) s->used = 0;
    pthread_mutex_unlock(&mu);
}

int fake_memcpy_async(void *dst, const void *src, size_t n, uintptr_t key) {
    pthread_mutex_lock(&mu);
    struct stream *s = find_stream(key, 1);
    struct qop op = {0};
    op.dst = dst; op.src = src; op.n = n;
    int rc = !s || push(s, op) ? 1 : 0;
    progress();
    pthread_mutex_unlock(&mu);
    return rc;
}

long long fake_stream_ticket(uintptr_t key) {
    pthread_mutex_lock(&mu);
    struct stream *s = find_stream(key, 1);
    long long t = s ? s->enq : 0;
    pthread_mutex_unlock(&mu);
    return t;
}

long long fake_stream_completed(uintptr_t key) {
    pthread_mutex_lock(&mu);
    progress();
    struct stream *s = find_stream(key, 1);
    long long t = s ? s->done : 0;
    pthread_mutex_unlock(&mu);
    return t;
}

/* ---- NCCL API ---- */

const char *ncclGetErrorString(ncclResult_t rc) {
    switch (rc) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    case ncclTimeout: return "NCCL operation timed out";
    default: return "unknown result code";
    }
}

#ifndef OMIT_LAST_ERROR
const char *ncclGetLastError(void *comm) { (void)comm; return last_msg; }
#endif

ncclResult_t ncclGetVersion(int *version) {
    pthread_mutex_lock(&mu);
    int rc = inject("ncclGetVersion");
    pthread_mutex_unlock(&mu);
    if (rc) return rc;
    if (!version) return ncclInvalidArgument;
    *version = FAKE_VERSION;
    return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    pthread_mutex_lock(&mu);
    int rc = inject("ncclGetUniqueId");
    if (!rc) {
        long long k = ++id_counter;
        memcpy(id->internal, "FAKENCCL", 8);
        for (int i = 8; i < NCCL_UNIQUE_ID_BYTES; i++) id->internal[i] = (char)((k * 31 + i * 7) & 0xff);
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

static struct comm *new_comm(struct group *g, int rank, int dev) {
    for (int i = 0; i < MAX_COMMS; i++) {
        if (!comms[i].used) {
            struct comm *c = &comms[i];
            memset(c, 0, sizeof *c);
            c->used = 1; c->g = g; c->rank = rank; c->dev = dev;
            g->ranks[rank] = c;
            g->joined++;
            return c;
        }
    }
    return NULL;
}

static struct group *new_group(int n) {
    for (int i = 0; i < MAX_GROUPS; i++) {
        if (!groups[i].used) {
            memset(&groups[i], 0, sizeof groups[i]);
            groups[i].used = 1;
            groups[i].n = n;
            return &groups[i];
        }
    }
    return NULL;
}

ncclResult_t ncclCommInitAll(void **out, int ndev, const int *devlist) {
    pthread_mutex_lock(&mu);
    int rc = inject("ncclCommInitAll");
    if (rc) goto done;
    if (!out || ndev < 1 || ndev > MAX_RANKS) { setmsg("fake: bad ndev"); rc = ncclInvalidArgument; goto done; }
    for (int i = 0; i < ndev; i++) {
        int d = devlist ? devlist[i] : i;
        if (d < 0 || d >= device_count) { setmsg("fake: invalid device ordinal"); rc = ncclUnhandledCudaError; goto done; }
        for (int j = 0; j < i; j++)
            if (devlist && devlist[j] == d) { setmsg("fake: duplicate GPU detected"); rc = ncclInvalidUsage; goto done; }
    }
    struct group *g = new_group(ndev);
    if (!g) { rc = ncclSystemError; goto done; }
    for (int i = 0; i < ndev; i++) {
        struct comm *c = new_comm(g, i, devlist ? devlist[i] : i);
        if (!c) { rc = ncclSystemError; goto done; }
        out[i] = c;
    }
    last_init_kind = 3;
done:
    pthread_mutex_unlock(&mu);
    return rc;
}

/* join adds rank to the group of id (mu held). */
static int join(void **out, int nranks, const ncclUniqueId *id, int rank, int kind) {
    last_init_kind = kind;
    last_id = *id;
    if (!out || nranks < 1 || nranks > MAX_RANKS || rank < 0 || rank >= nranks) return ncclInvalidArgument;
    if (memcmp(id->internal, "FAKENCCL", 8) != 0) { setmsg("fake: not a unique id"); return ncclInvalidArgument; }
    struct group *g = NULL;
    for (int i = 0; i < MAX_GROUPS; i++)
        if (groups[i].used && groups[i].has_id && memcmp(&groups[i].id, id, sizeof *id) == 0) g = &groups[i];
    if (!g) {
        if (!(g = new_group(nranks))) return ncclSystemError;
        g->has_id = 1;
        g->id = *id;
    }
    if (g->n != nranks) { setmsg("fake: nranks differs between ranks"); return ncclInvalidUsage; }
    if (g->ranks[rank]) { setmsg("fake: rank joined twice"); return ncclInvalidUsage; }
    struct comm *c = new_comm(g, rank, 0);
    if (!c) return ncclSystemError;
    *out = c;
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(void **out, int nranks, ncclUniqueId id, int rank) {
    pthread_mutex_lock(&mu);
    int rc = inject("ncclCommInitRank");
    if (!rc) rc = join(out, nranks, &id, rank, 1);
    pthread_mutex_unlock(&mu);
    return rc;
}

#ifndef OMIT_SCALABLE
ncclResult_t ncclCommInitRankScalable(void **out, int nranks, int rank, int nId, ncclUniqueId *ids, void *config) {
    (void)config;
    pthread_mutex_lock(&mu);
    int rc = inject("ncclCommInitRankScalable");
    if (!rc) rc = nId < 1 || !ids ? ncclInvalidArgument : join(out, nranks, &ids[0], rank, 2);
    pthread_mutex_unlock(&mu);
    return rc;
}
#endif

/* valid checks a handle (mu held). */
static int valid(struct comm *c) {
    if (!c || c < comms || c >= comms + MAX_COMMS || !c->used || c->freed) {
        setmsg("fake: invalid communicator");
        return 0;
    }
    return 1;
}

static ncclResult_t release(struct comm *c, const char *call, int abort) {
    pthread_mutex_lock(&mu);
    int rc = inject(call);
    if (!rc && !valid(c)) rc = ncclInvalidArgument;
    if (!rc || abort) {
        if (valid(c)) {
            c->freed = 1;
            if (abort) c->aborted = 1;
            progress();
        }
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

ncclResult_t ncclCommDestroy(void *comm) { return release(comm, "ncclCommDestroy", 0); }
ncclResult_t ncclCommAbort(void *comm) { return release(comm, "ncclCommAbort", 1); }

static ncclResult_t query(void *comm, int *out, int what, const char *call) {
    pthread_mutex_lock(&mu);
    struct comm *c = comm;
    int rc = inject(call);
    if (!rc && (!valid(c) || !out)) rc = ncclInvalidArgument;
    if (!rc) *out = what == 0 ? c->g->n : what == 1 ? c->dev : what == 2 ? c->rank : c->async_err;
    pthread_mutex_unlock(&mu);
    return rc;
}

ncclResult_t ncclCommCount(void *comm, int *n) { return query(comm, n, 0, "ncclCommCount"); }
ncclResult_t ncclCommCuDevice(void *comm, int *d) { return query(comm, d, 1, "ncclCommCuDevice"); }
ncclResult_t ncclCommUserRank(void *comm, int *r) { return query(comm, r, 2, "ncclCommUserRank"); }
ncclResult_t ncclCommGetAsyncError(void *comm, int *e) { return query(comm, e, 3, "ncclCommGetAsyncError"); }

/* post queues rank c's part of its next collective (mu held). */
static int post(struct deferred *d) {
    struct comm *c = d->c;
    if (!valid(c)) return ncclInvalidArgument;
    if (d->dtype < 0 || d->dtype >= ncclNumTypes || d->op < 0 || d->op >= ncclNumOps) {
        setmsg("fake: bad datatype or op");
        return ncclInvalidArgument;
    }
    if (d->kind == OP_BCAST && (d->root < 0 || d->root >= c->g->n)) { setmsg("fake: bad root"); return ncclInvalidArgument; }
    if (d->count && (!d->recv || ((d->kind == OP_ALLREDUCE || c->rank == d->root) && !d->send))) {
        setmsg("fake: null buffer");
        return ncclInvalidArgument;
    }
    struct group *g = c->g;
    long long seq = g->next_seq[c->rank];
    struct slot *sl = &g->slots[seq % MAX_SLOTS];
    if (sl->used && sl->seq != seq) { setmsg("fake: too many collectives outstanding"); return ncclInternalError; }
    if (!sl->used) {
        memset(sl, 0, sizeof *sl);
        sl->used = 1; sl->seq = seq; sl->kind = d->kind; sl->count = d->count;
        sl->dtype = d->dtype; sl->op = d->op; sl->root = d->root;
    } else if (sl->kind != d->kind || sl->count != d->count || sl->dtype != d->dtype ||
               sl->op != d->op || sl->root != d->root) {
        setmsg("fake: collective differs between ranks");
        return ncclInvalidUsage;
    }
    struct stream *s = find_stream(d->stream, 1);
    struct qop op = {0};
    op.kind = 1; op.c = c; op.slot = sl; op.seq = seq;
    if (!s || push(s, op)) { setmsg("fake: stream queue full"); return ncclInternalError; }
    g->next_seq[c->rank]++;
    sl->send[c->rank] = d->send;
    sl->recv[c->rank] = d->recv;
    sl->posted++;
    progress();
    return ncclSuccess;
}

static ncclResult_t collective(struct deferred *d, const char *call) {
    pthread_mutex_lock(&mu);
    int rc = inject(call);
    if (!rc) {
        if (group_depth > 0) {
            if (!valid(d->c)) rc = ncclInvalidArgument;
            else if (ndefer == MAX_DEFER) rc = ncclInternalError;
            else defer_list[ndefer++] = *d;
        } else {
            rc = post(d);
        }
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, int dtype, int root, void *comm, uintptr_t stream) {
    struct deferred d = {OP_BCAST, comm, send, recv, count, dtype, 0, root, stream};
    return collective(&d, "ncclBroadcast");
}

#ifndef OMIT_ALLREDUCE
ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, int dtype, int op, void *comm, uintptr_t stream) {
    struct deferred d = {OP_ALLREDUCE, comm, send, recv, count, dtype, op, 0, stream};
    return collective(&d, "ncclAllReduce");
}
#endif

ncclResult_t ncclGroupStart(void) {
    pthread_mutex_lock(&mu);
    int rc = inject("ncclGroupStart");
    if (!rc) group_depth++;
    pthread_mutex_unlock(&mu);
    return rc;
}

ncclResult_t ncclGroupEnd(void) {
    pthread_mutex_lock(&mu);
    int rc = inject("ncclGroupEnd");
    if (group_depth == 0) {
        setmsg("fake: ncclGroupEnd without ncclGroupStart");
        rc = ncclInvalidUsage;
    } else if (--group_depth == 0) {
        /* Even a failed end closes the group; its collectives are dropped. */
        for (int i = 0; i < ndefer && !rc; i++) rc = post(&defer_list[i]);
        ndefer = 0;
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

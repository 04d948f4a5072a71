// fakedriver.c stands in for libcuda and libnvrtc in the driver package's
// tests: the context stack per thread, modules, launches and NVRTC, with
// hooks that report what the package passed. A launch of the spin kernel
// records its stream and its parameter instead of waiting.
//
// Variants: -DOMIT_LAUNCH drops cuLaunchKernel (missing-symbol test).
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

// ---- libnvrtc ----
static char last_src[4096], last_options[1024];

int nvrtcCreateProgram(void **prog, const char *src, const char *name, int n, const char *const *h, const char *const *i) {
	(void)name; (void)n; (void)h; (void)i;
	if (!src || !strstr(src, "extern \"C\" __global__")) return 3; // NVRTC_ERROR_INVALID_INPUT
	strncpy(last_src, src, sizeof last_src - 1);
	*prog = malloc(1);
	return 0;
}
int nvrtcCompileProgram(void *prog, int n, const char *const *opts) {
	(void)prog;
	last_options[0] = 0;
	for (int i = 0; i < n; i++) {
		strncat(last_options, opts[i], sizeof last_options - strlen(last_options) - 2);
		strcat(last_options, " ");
	}
	return strstr(last_options, "--gpu-architecture=compute_") ? 0 : 6; // NVRTC_ERROR_COMPILATION
}
// The "PTX" is the source: the module loader finds the kernels by name in it.
int nvrtcGetPTXSize(void *prog, size_t *n) { (void)prog; *n = strlen(last_src) + 1; return 0; }
int nvrtcGetPTX(void *prog, char *out) { (void)prog; memcpy(out, last_src, strlen(last_src) + 1); return 0; }
int nvrtcGetProgramLogSize(void *prog, size_t *n) { (void)prog; *n = strlen(last_options) + 1; return 0; }
int nvrtcGetProgramLog(void *prog, char *out) { (void)prog; strcpy(out, last_options); return 0; }
int nvrtcDestroyProgram(void **prog) { free(*prog); *prog = 0; return 0; }
const char *nvrtcGetErrorString(int rc) { return rc == 6 ? "NVRTC_ERROR_COMPILATION" : "NVRTC_ERROR"; }
const char *fake_nvrtc_options(void) { return last_options; }

// ---- libcuda ----
enum { CUDA_ERROR_INVALID_VALUE = 1, CUDA_ERROR_NOT_INITIALIZED = 3, CUDA_ERROR_INVALID_DEVICE = 101,
       CUDA_ERROR_INVALID_CONTEXT = 201, CUDA_ERROR_INVALID_HANDLE = 400, CUDA_ERROR_NOT_FOUND = 500 };

static int initialized, retained;
static int ctx_tokens[2];
static __thread void *stack[8];
static __thread int depth;
static long long net_pushes; // over every thread: a push without its pop shows here
static long long launches, last_ns, bad_ctx_launches;
static uintptr_t last_stream;

struct module { char *image; };

int cuInit(unsigned flags) { if (flags) return CUDA_ERROR_INVALID_VALUE; initialized = 1; return 0; }
int cuDeviceGet(int *dev, int ordinal) {
	if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
	if (ordinal < 0 || ordinal > 1) return CUDA_ERROR_INVALID_DEVICE;
	*dev = ordinal;
	return 0;
}
int cuDevicePrimaryCtxRetain(void **ctx, int dev) { *ctx = &ctx_tokens[dev]; retained++; return 0; }
int cuDevicePrimaryCtxRelease_v2(int dev) { (void)dev; if (retained == 0) return CUDA_ERROR_INVALID_CONTEXT; retained--; return 0; }
static int valid_ctx(void *c) { return c == &ctx_tokens[0] || c == &ctx_tokens[1]; }
int cuCtxPushCurrent_v2(void *ctx) {
	if (!valid_ctx(ctx) || depth == 8) return CUDA_ERROR_INVALID_CONTEXT;
	stack[depth++] = ctx;
	net_pushes++;
	return 0;
}
int cuCtxPopCurrent_v2(void **ctx) {
	if (depth == 0) return CUDA_ERROR_INVALID_CONTEXT;
	depth--;
	net_pushes--;
	if (ctx) *ctx = stack[depth];
	return 0;
}
static void *current(void) { return depth ? stack[depth - 1] : 0; }
int cuModuleLoadData(void **mod, const void *image) {
	if (!current()) return CUDA_ERROR_INVALID_CONTEXT;
	if (!strstr((const char *)image, "__global__")) return 218; // CUDA_ERROR_INVALID_PTX
	struct module *m = malloc(sizeof *m);
	m->image = strdup((const char *)image);
	*mod = m;
	return 0;
}
int cuModuleUnload(void *mod) {
	if (!current()) return CUDA_ERROR_INVALID_CONTEXT;
	struct module *m = mod;
	free(m->image);
	free(m);
	return 0;
}
int cuModuleGetFunction(uintptr_t *fn, void *mod, const char *name) {
	if (!current()) return CUDA_ERROR_INVALID_CONTEXT;
	struct module *m = mod;
	char want[256];
	strcpy(want, "void ");
	strncat(want, name, sizeof want - 8);
	strcat(want, "(");
	if (!strstr(m->image, want)) return CUDA_ERROR_NOT_FOUND;
	*fn = (uintptr_t)m;
	return 0;
}
int cuGetErrorName(int rc, const char **s) {
	switch (rc) {
	case 1: *s = "CUDA_ERROR_INVALID_VALUE"; return 0;
	case 101: *s = "CUDA_ERROR_INVALID_DEVICE"; return 0;
	case 201: *s = "CUDA_ERROR_INVALID_CONTEXT"; return 0;
	case 500: *s = "CUDA_ERROR_NOT_FOUND"; return 0;
	}
	*s = "CUDA_ERROR_FAKE";
	return 0;
}
#ifndef OMIT_LAUNCH
int cuLaunchKernel(uintptr_t fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                   unsigned shared, void *stream, void **params, void **extra) {
	(void)shared;
	if (!current()) { bad_ctx_launches++; return CUDA_ERROR_INVALID_CONTEXT; }
	if (!fn) return CUDA_ERROR_INVALID_HANDLE;
	if (gx * gy * gz == 0 || bx * by * bz == 0 || extra) return CUDA_ERROR_INVALID_VALUE;
	launches++;
	last_stream = (uintptr_t)stream;
	last_ns = (long long)*(unsigned long long *)params[0];
	return 0;
}
#endif

long long fake_launches(void) { return launches; }
long long fake_last_ns(void) { return last_ns; }
uintptr_t fake_last_stream(void) { return last_stream; }
long long fake_net_pushes(void) { return net_pushes; }
int fake_retained(void) { return retained; }

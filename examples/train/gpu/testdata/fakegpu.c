// fakegpu.c stands in for libnvrtc, libcuda and libcublas in the gpu
// package's tests on machines without a GPU: one shared library that
// exports the symbols the package binds. "Device" pointers are host
// pointers and work runs at once on the calling thread, so the tests check
// what a GPU cannot show by itself being wrong: symbol names, argument
// order (cublasSgemm_v2 passes 8 of its 14 arguments on the stack), the
// kernel parameter encoding of cuLaunchKernel, and the row-major to
// column-major mapping.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

// ---- libnvrtc ----
static const char fake_ptx[] = "// fake PTX\n";
static char last_options[1024];

int nvrtcCreateProgram(void **prog, const char *src, const char *name, int n, const char *const *h, const char *const *i) {
	(void)name; (void)n; (void)h; (void)i;
	if (!src || !strstr(src, "extern \"C\" __global__")) return 3; // NVRTC_ERROR_INVALID_INPUT
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
int nvrtcGetPTXSize(void *prog, size_t *n) { (void)prog; *n = sizeof fake_ptx; return 0; }
int nvrtcGetPTX(void *prog, char *out) { (void)prog; memcpy(out, fake_ptx, sizeof fake_ptx); return 0; }
int nvrtcGetProgramLogSize(void *prog, size_t *n) { (void)prog; *n = strlen(last_options) + 1; return 0; }
int nvrtcGetProgramLog(void *prog, char *out) { (void)prog; strcpy(out, last_options); return 0; }
int nvrtcDestroyProgram(void **prog) { free(*prog); *prog = 0; return 0; }
const char *nvrtcGetErrorString(int rc) { return rc == 6 ? "NVRTC_ERROR_COMPILATION" : "NVRTC_ERROR"; }
const char *fake_nvrtc_options(void) { return last_options; }

// ---- libcuda ----
static int ctx_token = 7;
static const char *kernel_names[] = {"uniform_fill", "bias_act", "add", "relu_backward", "colsum", "mse_loss", "mse_backward", "sgd_momentum"};
static int launches;

int cuInit(unsigned flags) { (void)flags; return 0; }
int cuDeviceGet(int *dev, int ordinal) { if (ordinal != 0) return 101; *dev = 0; return 0; }
int cuDevicePrimaryCtxRetain(void **ctx, int dev) { (void)dev; *ctx = &ctx_token; return 0; }
int cuDevicePrimaryCtxRelease_v2(int dev) { (void)dev; return 0; }
static __thread void *current;
int cuCtxSetCurrent(void *ctx) { return ctx == &ctx_token ? 0 : 201; } // CUDA_ERROR_INVALID_CONTEXT
// One level of context stack is all the package uses: push, call, pop.
int cuCtxPushCurrent_v2(void *ctx) { if (ctx != &ctx_token || current) return 201; current = ctx; return 0; }
int cuCtxPopCurrent_v2(void **ctx) { if (!current) return 201; if (ctx) *ctx = current; current = 0; return 0; }
int cuModuleLoadData(void **mod, const void *image) {
	if (strcmp((const char *)image, fake_ptx) != 0) return 218; // CUDA_ERROR_INVALID_PTX
	*mod = malloc(1);
	return 0;
}
int cuModuleUnload(void *mod) { free(mod); return 0; }
int cuModuleGetFunction(uintptr_t *fn, void *mod, const char *name) {
	(void)mod;
	for (uintptr_t i = 0; i < sizeof kernel_names / sizeof *kernel_names; i++)
		if (strcmp(name, kernel_names[i]) == 0) { *fn = i + 1; return 0; }
	return 500; // CUDA_ERROR_NOT_FOUND
}
int cuGetErrorName(int rc, const char **s) {
	*s = rc == 500 ? "CUDA_ERROR_NOT_FOUND" : "CUDA_ERROR_FAKE";
	return 0;
}

typedef unsigned long long u64;
static u64 mixhash(u64 seed, u64 i) {
	u64 z = seed + (i + 1ULL) * 0x9E3779B97F4A7C15ULL;
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
	return z ^ (z >> 31);
}

#define P(T, i) (*(T *)params[i])

// The kernels of gpu/kernels.go, run serially, reading each parameter
// with the type the CUDA source declares.
int cuLaunchKernel(uintptr_t fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                   unsigned shared, void *stream, void **params, void **extra) {
	(void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shared; (void)stream;
	if (!current) return 201; // CUDA_ERROR_INVALID_CONTEXT
	if (gx == 0 || extra != 0) return 1;
	launches++;
	switch (fn) {
	case 1: { float *x = P(float *, 0); long long n = P(long long, 1); u64 seed = P(u64, 2); float scale = P(float, 3);
		for (long long i = 0; i < n; i++) {
			if (scale == 0.0f) { x[i] = 0.0f; continue; }
			float u = (float)(mixhash(seed, (u64)i) >> 40) * (1.0f / 16777216.0f);
			x[i] = scale * (2.0f * u - 1.0f);
		}
		return 0; }
	case 2: { float *y = P(float *, 0); const float *x = P(float *, 1); const float *b = P(float *, 2);
		long long rows = P(long long, 3); int cols = P(int, 4); int act = P(int, 5);
		for (long long i = 0; i < rows * cols; i++) {
			float v = x[i];
			if (b) v += b[i % cols];
			if (act == 1) v = v > 0.0f ? v : 0.0f;
			else if (act == 2) v = tanhf(v);
			y[i] = v;
		}
		return 0; }
	case 3: { float *y = P(float *, 0); const float *a = P(float *, 1), *b = P(float *, 2); long long n = P(long long, 3);
		for (long long i = 0; i < n; i++) y[i] = a[i] + b[i];
		return 0; }
	case 4: { float *dx = P(float *, 0); const float *dy = P(float *, 1), *y = P(float *, 2); long long n = P(long long, 3);
		for (long long i = 0; i < n; i++) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
		return 0; }
	case 5: { float *y = P(float *, 0); const float *x = P(float *, 1); long long rows = P(long long, 2); int cols = P(int, 3); int add = P(int, 4);
		for (int c = 0; c < cols; c++) { float s = 0.0f; for (long long r = 0; r < rows; r++) s += x[r * cols + c]; y[c] = add ? y[c] + s : s; }
		return 0; }
	case 6: { float *loss = P(float *, 0); const float *p = P(float *, 1), *t = P(float *, 2); long long n = P(long long, 3);
		long long total = P(long long, 4); int add = P(int, 5);
		float s = 0.0f;
		for (long long i = 0; i < n; i++) { float d = p[i] - t[i]; s += d * d; }
		float v = 0.5f * s / (float)total;
		loss[0] = add ? v + loss[0] : v;
		return 0; }
	case 7: { float *g = P(float *, 0); const float *p = P(float *, 1), *t = P(float *, 2); long long n = P(long long, 3);
		long long total = P(long long, 4);
		float inv = 1.0f / (float)total;
		for (long long i = 0; i < n; i++) g[i] = (p[i] - t[i]) * inv;
		return 0; }
	case 8: { float *p = P(float *, 0); const float *g = P(float *, 1); float *m = P(float *, 2);
		long long n = P(long long, 3); float lr = P(float, 4), mu = P(float, 5);
		for (long long i = 0; i < n; i++) { m[i] = mu * m[i] + g[i]; p[i] -= lr * m[i]; }
		return 0; }
	}
	return 400; // CUDA_ERROR_INVALID_HANDLE
}
int fake_launches(void) { return launches; }

// ---- libcublas ----
static int handle_token;
static uintptr_t bound_stream = 12345;
static int math_mode = -1;

int cublasCreate_v2(void **h) { *h = &handle_token; return 0; }
int cublasDestroy_v2(void *h) { return h == &handle_token ? 0 : 1; }
int cublasSetStream_v2(void *h, uintptr_t s) { if (h != &handle_token) return 1; bound_stream = s; return 0; }
int cublasSetMathMode(void *h, int mode) { if (h != &handle_token) return 1; math_mode = mode; return 0; }
int cublasSetPointerMode_v2(void *h, int mode) { return h == &handle_token && mode == 0 ? 0 : 7; }
const char *cublasGetStatusName(int rc) { return rc == 7 ? "CUBLAS_STATUS_INVALID_VALUE" : "CUBLAS_STATUS_FAKE"; }
uintptr_t fake_cublas_stream(void) { return bound_stream; }
int fake_cublas_math_mode(void) { return math_mode; }

// Column-major C = alpha*op(A)*op(B) + beta*C, as the reference BLAS.
int cublasSgemm_v2(void *h, int ta, int tb, int m, int n, int k, const float *alpha, const float *A, int lda,
                   const float *B, int ldb, const float *beta, float *C, int ldc) {
	if (h != &handle_token || m < 0 || n < 0 || k < 0) return 7;
	if (lda < (ta ? k : m) || ldb < (tb ? n : k) || ldc < m) return 7;
	for (int j = 0; j < n; j++)
		for (int i = 0; i < m; i++) {
			float s = 0.0f;
			for (int p = 0; p < k; p++) {
				float a = ta ? A[p + i * lda] : A[i + p * lda];
				float b = tb ? B[j + p * ldb] : B[p + j * ldb];
				s += a * b;
			}
			C[i + j * ldc] = *alpha * s + (*beta == 0.0f ? 0.0f : *beta * C[i + j * ldc]);
		}
	return 0;
}

package gpu

import (
	"fmt"

	"github.com/chameleon-go/chameleon/device/cuda/driver"
	"github.com/chameleon-go/chameleon/internal/dl"
)

// cuBLAS enums (cublas_api.h).
const (
	opN            = 0 // CUBLAS_OP_N
	opT            = 1 // CUBLAS_OP_T
	mathDefault    = 0 // CUBLAS_DEFAULT_MATH
	mathTF32       = 3 // CUBLAS_TF32_TENSOR_OP_MATH
	pointerModeHst = 0 // CUBLAS_POINTER_MODE_HOST
)

// cublas is the part of libcublas the example uses.
type cublas struct {
	lib *dl.Library
	// cublasStatus_t cublasCreate_v2(cublasHandle_t *handle);
	create func(handle *uintptr) int32
	// cublasStatus_t cublasDestroy_v2(cublasHandle_t handle);
	destroy func(handle uintptr) int32
	// cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t streamId);
	setStream func(handle, stream uintptr) int32
	// cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode);
	setMathMode func(handle uintptr, mode int32) int32
	// cublasStatus_t cublasSetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t mode);
	setPointerMode func(handle uintptr, mode int32) int32
	// const char *cublasGetStatusName(cublasStatus_t status); optional (CUDA 11.4+)
	statusName func(status int32) string
	// cublasStatus_t cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
	//     int m, int n, int k, const float *alpha, const float *A, int lda, const float *B, int ldb,
	//     const float *beta, float *C, int ldc);
	// Called through purego.SyscallN: it is on the hot path.
	sgemm uintptr
}

func loadCublas() (*cublas, error) {
	lib, err := driver.Open(driver.Candidates(EnvCublas, "libcublas.so.13", "libcublas.so", "libcublas.so.12"))
	if err != nil {
		return nil, fmt.Errorf("cublas: %w", err)
	}
	b := &cublas{lib: lib}
	if err := driver.Bind(lib,
		dl.Func{Ptr: &b.create, Name: "cublasCreate_v2"},
		dl.Func{Ptr: &b.destroy, Name: "cublasDestroy_v2"},
		dl.Func{Ptr: &b.setStream, Name: "cublasSetStream_v2"},
		dl.Func{Ptr: &b.setMathMode, Name: "cublasSetMathMode"},
		dl.Func{Ptr: &b.setPointerMode, Name: "cublasSetPointerMode_v2"},
	); err != nil {
		return nil, fmt.Errorf("cublas: %w", err)
	}
	if driver.Bind(lib, dl.Func{Ptr: &b.statusName, Name: "cublasGetStatusName"}) != nil {
		b.statusName = nil
	}
	if b.sgemm, err = driver.Sym(lib, "cublasSgemm_v2"); err != nil {
		return nil, fmt.Errorf("cublas: %w", err)
	}
	return b, nil
}

func (b *cublas) check(what string, rc int32) error {
	if rc == 0 {
		return nil
	}
	name := "CUBLAS_STATUS"
	if b.statusName != nil {
		name = b.statusName(rc)
	}
	return fmt.Errorf("cublas: %s: %s (%d)", what, name, rc)
}

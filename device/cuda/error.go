package cuda

import (
	"fmt"
	"sync/atomic"

	"github.com/chameleon-go/chameleon/device"
)

// Error is a cudaError_t returned by the CUDA runtime. errors.Is maps it to
// the device sentinels: code 2 is device.ErrOutOfMemory, the invalid-argument
// and invalid-handle codes are device.ErrInvalidValue.
type Error int32

// CUDA runtime error codes this package branches on or names without the
// library (driver_types.h).
const (
	ErrorInvalidValue          Error = 1
	ErrorMemoryAllocation      Error = 2
	ErrorInitializationError   Error = 3
	ErrorCudartUnloading       Error = 4
	ErrorInvalidDevicePointer  Error = 17
	ErrorInvalidMemcpyDir      Error = 21
	ErrorInsufficientDriver    Error = 35
	ErrorNoDevice              Error = 100
	ErrorInvalidDevice         Error = 101
	ErrorInvalidResourceHandle Error = 400
	ErrorNotReady              Error = 600
	ErrorIllegalAddress        Error = 700
	ErrorLaunchFailure         Error = 719
	ErrorNotSupported          Error = 801
	ErrorUnknown               Error = 999
)

var names = map[Error]string{
	ErrorInvalidValue:          "cudaErrorInvalidValue",
	ErrorMemoryAllocation:      "cudaErrorMemoryAllocation",
	ErrorInitializationError:   "cudaErrorInitializationError",
	ErrorCudartUnloading:       "cudaErrorCudartUnloading",
	ErrorInvalidDevicePointer:  "cudaErrorInvalidDevicePointer",
	ErrorInvalidMemcpyDir:      "cudaErrorInvalidMemcpyDirection",
	ErrorInsufficientDriver:    "cudaErrorInsufficientDriver",
	ErrorNoDevice:              "cudaErrorNoDevice",
	ErrorInvalidDevice:         "cudaErrorInvalidDevice",
	ErrorInvalidResourceHandle: "cudaErrorInvalidResourceHandle",
	ErrorNotReady:              "cudaErrorNotReady",
	ErrorIllegalAddress:        "cudaErrorIllegalAddress",
	ErrorLaunchFailure:         "cudaErrorLaunchFailure",
	ErrorNotSupported:          "cudaErrorNotSupported",
	ErrorUnknown:               "cudaErrorUnknown",
}

// libName is cudaGetErrorName of the most recently loaded runtime that has
// it. The runtime knows codes newer than this table.
var libName atomic.Pointer[func(int32) string]

// Name returns the CUDA name of the code, e.g. "cudaErrorMemoryAllocation".
func (e Error) Name() string { return errorName(e, libName.Load()) }

func errorName(e Error, lib *func(int32) string) string {
	if lib != nil {
		if n := (*lib)(int32(e)); n != "" && n != "unrecognized error code" {
			return n
		}
	}
	if n, ok := names[e]; ok {
		return n
	}
	return fmt.Sprintf("cudaError(%d)", int32(e))
}

// Error implements error: the CUDA name and the code.
func (e Error) Error() string { return fmt.Sprintf("%s (%d)", e.Name(), int32(e)) }

// Is maps codes to the device sentinels.
func (e Error) Is(target error) bool {
	switch target {
	case device.ErrOutOfMemory:
		return e == ErrorMemoryAllocation
	case device.ErrInvalidValue:
		return e == ErrorInvalidValue || e == ErrorInvalidDevicePointer ||
			e == ErrorInvalidMemcpyDir || e == ErrorInvalidResourceHandle || e == ErrorInvalidDevice
	}
	return false
}

// fail wraps a non-zero return code with the call that produced it.
func fail(call string, rc int32) error { return fmt.Errorf("cuda: %s: %w", call, Error(rc)) }

// check is fail for a non-zero status, nil for success.
func check(call string, rc int32) error {
	if rc == 0 {
		return nil
	}
	return fail(call, rc)
}

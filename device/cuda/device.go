package cuda

import (
	"bytes"
	"unsafe"

	"github.com/chameleon-go/chameleon/internal/dl"
)

type deviceFuncs struct {
	// cudaError_t cudaSetDevice(int device);
	cudaSetDevice func(device int32) int32
	// cudaError_t cudaGetDeviceCount(int *count);
	cudaGetDeviceCount func(count *int32) int32
	// cudaError_t cudaDeviceSynchronize(void);
	cudaDeviceSynchronize func() int32

	// Optional: a runtime without them still works.

	// const char *cudaGetErrorName(cudaError_t error);
	cudaGetErrorName func(code int32) string
	// cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device);
	// (exported as cudaGetDeviceProperties_v2 since CUDA 12). Only the first
	// field, char name[256], is read, so the struct layout of the runtime
	// version does not matter as long as the buffer is large enough.
	cudaGetDeviceProperties func(prop unsafe.Pointer, device int32) int32
}

// propBufSize exceeds sizeof(cudaDeviceProp) in every CUDA release (about
// 1 KiB) with a wide margin.
const propBufSize = 16 << 10

func (f *deviceFuncs) load(l *dl.Library) error {
	if err := l.Bind(
		dl.Func{Ptr: &f.cudaSetDevice, Name: "cudaSetDevice"},
		dl.Func{Ptr: &f.cudaGetDeviceCount, Name: "cudaGetDeviceCount"},
		dl.Func{Ptr: &f.cudaDeviceSynchronize, Name: "cudaDeviceSynchronize"},
	); err != nil {
		return err
	}
	if l.Bind(dl.Func{Ptr: &f.cudaGetErrorName, Name: "cudaGetErrorName"}) != nil {
		f.cudaGetErrorName = nil
	}
	_ = l.Bind(dl.Func{Ptr: &f.cudaGetDeviceProperties, Name: "cudaGetDeviceProperties_v2", Alt: []string{"cudaGetDeviceProperties"}})
	return nil
}

// deviceName reads cudaDeviceProp.name, or "" when the runtime cannot say.
func (f *deviceFuncs) deviceName(ordinal int) string {
	if f.cudaGetDeviceProperties == nil {
		return ""
	}
	buf := make([]byte, propBufSize)
	if f.cudaGetDeviceProperties(unsafe.Pointer(&buf[0]), int32(ordinal)) != 0 {
		return ""
	}
	name := buf[:256]
	if i := bytes.IndexByte(name, 0); i >= 0 {
		name = name[:i]
	}
	return string(name)
}

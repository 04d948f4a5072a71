package ascend

import (
	"github.com/ebitengine/purego"

	"github.com/chameleon-go/chameleon/internal/dl"
)

type deviceFuncs struct {
	// aclError aclInit(const char *configPath);
	aclInit func(configPath *byte) int32
	// aclError aclFinalize();
	aclFinalize func() int32
	// aclError aclrtSetDevice(int32_t deviceId);
	aclrtSetDevice func(deviceID int32) int32
	// aclError aclrtResetDevice(int32_t deviceId);
	aclrtResetDevice func(deviceID int32) int32
	// aclError aclrtGetDeviceCount(uint32_t *count);
	aclrtGetDeviceCount func(count *uint32) int32
	// aclError aclrtGetCurrentContext(aclrtContext *context);
	aclrtGetCurrentContext func(context *uintptr) int32
	// aclError aclrtSetCurrentContext(aclrtContext context);
	aclrtSetCurrentContext func(context uintptr) int32
	// aclError aclrtSynchronizeDevice(void);
	aclrtSynchronizeDevice func() int32

	// Optional.

	// const char *aclrtGetSocName();
	aclrtGetSocName func() string
}

func (f *deviceFuncs) load(l *dl.Library) error {
	err := l.Bind(
		dl.Func{Ptr: &f.aclInit, Name: "aclInit"},
		dl.Func{Ptr: &f.aclFinalize, Name: "aclFinalize"},
		dl.Func{Ptr: &f.aclrtSetDevice, Name: "aclrtSetDevice"},
		dl.Func{Ptr: &f.aclrtResetDevice, Name: "aclrtResetDevice"},
		dl.Func{Ptr: &f.aclrtGetDeviceCount, Name: "aclrtGetDeviceCount"},
		dl.Func{Ptr: &f.aclrtGetCurrentContext, Name: "aclrtGetCurrentContext"},
		dl.Func{Ptr: &f.aclrtSetCurrentContext, Name: "aclrtSetCurrentContext"},
		dl.Func{Ptr: &f.aclrtSynchronizeDevice, Name: "aclrtSynchronizeDevice"},
	)
	if err != nil {
		return err
	}
	// Called before every operation: see Device.enter.
	setCtx, err := l.Sym("aclrtSetCurrentContext")
	if err != nil {
		return err
	}
	f.aclrtSetCurrentContext = func(context uintptr) int32 { return fastCall(setCtx, context) }
	_ = l.Bind(dl.Func{Ptr: &f.aclrtGetSocName, Name: "aclrtGetSocName"})
	return nil
}

// fastCall calls a C function that takes only integer and pointer-sized
// arguments and returns an int32 status, without the reflection behind
// purego.RegisterFunc (about 0.4-1.3 us and 4 allocations a call, against
// about 0.1 us here). The swap hot path uses it.
func fastCall(fn uintptr, args ...uintptr) int32 {
	r, _, _ := purego.SyscallN(fn, args...)
	return int32(r) // aclError is a C int
}

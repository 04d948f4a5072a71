package gpu

import (
	"fmt"
	"runtime"

	"github.com/chameleon-go/chameleon/internal/dl"
)

// driver is the part of libcuda (the driver API) the example uses: load
// the PTX NVRTC made and launch its kernels.
type driver struct {
	lib *dl.Library
	// CUresult cuInit(unsigned int Flags);
	init func(flags uint32) int32
	// CUresult cuDeviceGet(CUdevice *device, int ordinal);
	deviceGet func(dev *int32, ordinal int32) int32
	// CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev);
	primaryRetain func(ctx *uintptr, dev int32) int32
	// CUresult cuDevicePrimaryCtxRelease(CUdevice dev); (_v2 since CUDA 11)
	primaryRelease func(dev int32) int32
	// CUresult cuCtxSetCurrent(CUcontext ctx);
	setCurrent func(ctx uintptr) int32
	// CUresult cuModuleLoadData(CUmodule *module, const void *image);
	moduleLoad func(mod *uintptr, image *byte) int32
	// CUresult cuModuleUnload(CUmodule hmod);
	moduleUnload func(mod uintptr) int32
	// CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name);
	getFunction func(fn *uintptr, mod uintptr, name *byte) int32
	// CUresult cuGetErrorName(CUresult error, const char **pStr);
	errorName func(code int32, out **byte) int32
	// CUresult cuLaunchKernel(CUfunction f, unsigned gridX, gridY, gridZ, blockX, blockY, blockZ,
	//                         unsigned sharedMemBytes, CUstream hStream, void **kernelParams, void **extra);
	// Called through purego.SyscallN: it is on the hot path.
	launch uintptr
	// CUresult cuCtxSetCurrent, the same, for the hot path.
	setCurrentAddr uintptr
}

func loadDriver() (*driver, error) {
	lib, err := open(candidates(EnvLibcuda, "libcuda.so.1", "libcuda.so"))
	if err != nil {
		return nil, fmt.Errorf("driver: %w", err)
	}
	d := &driver{lib: lib}
	if err := bind(lib,
		dl.Func{Ptr: &d.init, Name: "cuInit"},
		dl.Func{Ptr: &d.deviceGet, Name: "cuDeviceGet"},
		dl.Func{Ptr: &d.primaryRetain, Name: "cuDevicePrimaryCtxRetain"},
		dl.Func{Ptr: &d.primaryRelease, Name: "cuDevicePrimaryCtxRelease_v2", Alt: []string{"cuDevicePrimaryCtxRelease"}},
		dl.Func{Ptr: &d.setCurrent, Name: "cuCtxSetCurrent"},
		dl.Func{Ptr: &d.moduleLoad, Name: "cuModuleLoadData"},
		dl.Func{Ptr: &d.moduleUnload, Name: "cuModuleUnload"},
		dl.Func{Ptr: &d.getFunction, Name: "cuModuleGetFunction"},
		dl.Func{Ptr: &d.errorName, Name: "cuGetErrorName"},
	); err != nil {
		return nil, fmt.Errorf("driver: %w", err)
	}
	if d.launch, err = sym(lib, "cuLaunchKernel"); err != nil {
		return nil, fmt.Errorf("driver: %w", err)
	}
	if d.setCurrentAddr, err = sym(lib, "cuCtxSetCurrent"); err != nil {
		return nil, fmt.Errorf("driver: %w", err)
	}
	return d, nil
}

func (d *driver) check(what string, rc int32) error {
	if rc == 0 {
		return nil
	}
	var name *byte
	s := "CUDA_ERROR"
	if d.errorName(rc, &name) == 0 && name != nil {
		s = dl.GoString(name)
	}
	return fmt.Errorf("driver: %s: %s (%d)", what, s, rc)
}

// context is the primary context of one device: the one libcudart uses,
// so memory from cudaMalloc is valid in kernels launched here. The driver
// API keeps the current context per OS thread and goroutines move between
// threads, so every call makes it current on a locked thread first.
type context struct {
	drv *driver
	dev int32
	ctx uintptr
}

func newContext(drv *driver, ordinal int) (*context, error) {
	if err := drv.check("cuInit", drv.init(0)); err != nil {
		return nil, err
	}
	c := &context{drv: drv}
	if err := drv.check("cuDeviceGet", drv.deviceGet(&c.dev, int32(ordinal))); err != nil {
		return nil, err
	}
	if err := drv.check("cuDevicePrimaryCtxRetain", drv.primaryRetain(&c.ctx, c.dev)); err != nil {
		return nil, err
	}
	return c, nil
}

// do runs f with the context current on this goroutine's thread.
func (c *context) do(what string, f func() int32) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := c.drv.check("cuCtxSetCurrent", c.drv.setCurrent(c.ctx)); err != nil {
		return err
	}
	return c.drv.check(what, f())
}

func (c *context) release() error {
	return c.drv.check("cuDevicePrimaryCtxRelease", c.drv.primaryRelease(c.dev))
}

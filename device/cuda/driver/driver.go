package driver

import (
	"fmt"
	"runtime"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"

	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/internal/dl"
)

// Driver is one loaded libcuda.
type Driver struct {
	Path string
	lib  *dl.Library

	// CUresult cuInit(unsigned int Flags);
	cuInit func(flags uint32) int32
	// CUresult cuDeviceGet(CUdevice *device, int ordinal);
	cuDeviceGet func(dev *int32, ordinal int32) int32
	// CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev);
	cuDevicePrimaryCtxRetain func(ctx *uintptr, dev int32) int32
	// CUresult cuDevicePrimaryCtxRelease(CUdevice dev); (_v2 since CUDA 11)
	cuDevicePrimaryCtxRelease func(dev int32) int32
	// CUresult cuModuleLoadData(CUmodule *module, const void *image);
	cuModuleLoadData func(mod *uintptr, image *byte) int32
	// CUresult cuModuleUnload(CUmodule hmod);
	cuModuleUnload func(mod uintptr) int32
	// CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name);
	cuModuleGetFunction func(fn *uintptr, mod uintptr, name *byte) int32
	// CUresult cuGetErrorName(CUresult error, const char **pStr);
	cuGetErrorName func(code int32, out **byte) int32

	// Called through purego.SyscallN, on the hot path:
	// CUresult cuCtxPushCurrent(CUcontext ctx); (_v2)
	push uintptr
	// CUresult cuCtxPopCurrent(CUcontext *pctx); (_v2)
	pop uintptr
	// CUresult cuLaunchKernel(CUfunction f, unsigned gridX, gridY, gridZ, blockX, blockY, blockZ,
	//                         unsigned sharedMemBytes, CUstream hStream, void **kernelParams, void **extra);
	launch uintptr

	vmm    *VMM
	vmmErr error
}

var (
	driversMu sync.Mutex
	drivers   = map[*dl.Library]*Driver{}
)

// Load opens the first of paths that loads (Candidates(EnvLibcuda,
// LibcudaNames...) when paths is empty) and binds the calls every user
// needs. The virtual memory management calls are bound when the library
// has them (see VMM).
func Load(paths ...string) (*Driver, error) {
	if len(paths) == 0 {
		paths = Candidates(EnvLibcuda, LibcudaNames...)
	}
	lib, err := Open(paths)
	if err != nil {
		return nil, fmt.Errorf("driver: %w", err)
	}
	driversMu.Lock()
	defer driversMu.Unlock()
	if d, ok := drivers[lib]; ok {
		return d, nil
	}
	d := &Driver{Path: lib.Path, lib: lib}
	if err := Bind(lib,
		dl.Func{Ptr: &d.cuInit, Name: "cuInit"},
		dl.Func{Ptr: &d.cuDeviceGet, Name: "cuDeviceGet"},
		dl.Func{Ptr: &d.cuDevicePrimaryCtxRetain, Name: "cuDevicePrimaryCtxRetain"},
		dl.Func{Ptr: &d.cuDevicePrimaryCtxRelease, Name: "cuDevicePrimaryCtxRelease_v2", Alt: []string{"cuDevicePrimaryCtxRelease"}},
		dl.Func{Ptr: &d.cuModuleLoadData, Name: "cuModuleLoadData"},
		dl.Func{Ptr: &d.cuModuleUnload, Name: "cuModuleUnload"},
		dl.Func{Ptr: &d.cuModuleGetFunction, Name: "cuModuleGetFunction"},
		dl.Func{Ptr: &d.cuGetErrorName, Name: "cuGetErrorName"},
	); err != nil {
		return nil, fmt.Errorf("driver: %s: %w", lib.Path, err)
	}
	for _, s := range []struct {
		p     *uintptr
		names []string
	}{
		{&d.push, []string{"cuCtxPushCurrent_v2", "cuCtxPushCurrent"}},
		{&d.pop, []string{"cuCtxPopCurrent_v2", "cuCtxPopCurrent"}},
		{&d.launch, []string{"cuLaunchKernel"}},
	} {
		if *s.p, err = Sym(lib, s.names...); err != nil {
			return nil, fmt.Errorf("driver: %w", err)
		}
	}
	d.vmm, d.vmmErr = loadVMM(lib)
	drivers[lib] = d
	return d, nil
}

// Error is a CUresult a driver call returned. errors.Is maps it to the
// device sentinels: CUDA_ERROR_OUT_OF_MEMORY is device.ErrOutOfMemory, the
// invalid value, device and handle codes are device.ErrInvalidValue.
type Error struct {
	Call string
	Code int32
	// Name is cuGetErrorName's, e.g. "CUDA_ERROR_OUT_OF_MEMORY".
	Name string
}

// CUresult codes this package branches on.
const (
	errInvalidValue  = 1
	errOutOfMemory   = 2
	errInvalidDevice = 101
	errInvalidHandle = 400
)

func (e *Error) Error() string { return fmt.Sprintf("driver: %s: %s (%d)", e.Call, e.Name, e.Code) }

// Is maps codes to the device sentinels.
func (e *Error) Is(target error) bool {
	switch target {
	case device.ErrOutOfMemory:
		return e.Code == errOutOfMemory
	case device.ErrInvalidValue:
		return e.Code == errInvalidValue || e.Code == errInvalidDevice || e.Code == errInvalidHandle
	}
	return false
}

// Check returns nil for CUDA_SUCCESS, else an *Error naming call.
func (d *Driver) Check(call string, rc int32) error {
	if rc == 0 {
		return nil
	}
	var name *byte
	s := "CUDA_ERROR"
	if d.cuGetErrorName(rc, &name) == 0 && name != nil {
		s = dl.GoString(name)
	}
	return &Error{Call: call, Code: rc, Name: s}
}

// Context is the primary context of one device: the one libcudart uses,
// so memory from cudaMalloc is valid in kernels launched here and streams
// made by libcudart are streams here. The driver API keeps the current
// context per OS thread and goroutines move between threads, so every call
// pushes it on a locked thread and pops it after: the thread's context is
// left as it was, which a runtime serving other devices relies on.
type Context struct {
	drv     *Driver
	Device  int32
	Ordinal int
	ctx     uintptr
	// The arguments of cuCtxPushCurrent and cuCtxPopCurrent, made once:
	// the popped context goes to popped, a heap word that nothing reads
	// (held here as a pointer: the uintptr in popArgs does not keep it).
	pushArgs, popArgs []uintptr
	popped            *uintptr
}

// Primary initializes the driver and retains the primary context of the
// device with the given ordinal. Release gives it back.
func (d *Driver) Primary(ordinal int) (*Context, error) {
	if err := d.Check("cuInit", d.cuInit(0)); err != nil {
		return nil, err
	}
	c := &Context{drv: d, Ordinal: ordinal}
	if err := d.Check("cuDeviceGet", d.cuDeviceGet(&c.Device, int32(ordinal))); err != nil {
		return nil, err
	}
	if err := d.Check("cuDevicePrimaryCtxRetain", d.cuDevicePrimaryCtxRetain(&c.ctx, c.Device)); err != nil {
		return nil, err
	}
	c.pushArgs = []uintptr{c.ctx}
	c.popped = new(uintptr)
	c.popArgs = []uintptr{uintptr(unsafe.Pointer(c.popped))}
	return c, nil
}

// Driver returns the library the context belongs to.
func (c *Context) Driver() *Driver { return c.drv }

// Enter locks the calling goroutine to its OS thread and makes the
// context current there, until Leave: the calls documented as needing the
// context current run between the two.
func (c *Context) Enter() error {
	runtime.LockOSThread()
	if rc, _, _ := purego.SyscallN(c.drv.push, c.pushArgs...); rc != 0 {
		runtime.UnlockOSThread()
		return c.drv.Check("cuCtxPushCurrent", int32(rc))
	}
	return nil
}

// Leave restores the thread's previous context and unlocks the thread.
func (c *Context) Leave() {
	purego.SyscallN(c.drv.pop, c.popArgs...)
	runtime.UnlockOSThread()
}

// Do runs f with the context current and checks its CUresult.
func (c *Context) Do(call string, f func() int32) error {
	if err := c.Enter(); err != nil {
		return err
	}
	rc := f()
	c.Leave()
	return c.drv.Check(call, rc)
}

// Release gives back the reference Primary took.
func (c *Context) Release() error {
	return c.drv.Check("cuDevicePrimaryCtxRelease", c.drv.cuDevicePrimaryCtxRelease(c.Device))
}

// Module is a loaded CUmodule.
type Module struct {
	c *Context
	h uintptr
}

// Function is a CUfunction of a loaded module.
type Function uintptr

// LoadModule loads a module from image, PTX (NUL-terminated, as NVRTC
// makes it) or CUBIN.
func (c *Context) LoadModule(image []byte) (*Module, error) {
	if len(image) == 0 {
		return nil, fmt.Errorf("driver: load module: empty image: %w", device.ErrInvalidValue)
	}
	m := &Module{c: c}
	if err := c.Do("cuModuleLoadData", func() int32 { return c.drv.cuModuleLoadData(&m.h, &image[0]) }); err != nil {
		return nil, err
	}
	return m, nil
}

// Function returns the kernel called name (an extern "C" name).
func (m *Module) Function(name string) (Function, error) {
	cname := dl.CString(name)
	var fn uintptr
	if err := m.c.Do("cuModuleGetFunction "+name, func() int32 { return m.c.drv.cuModuleGetFunction(&fn, m.h, &cname[0]) }); err != nil {
		return 0, err
	}
	return Function(fn), nil
}

// Unload unloads the module. Work already queued still runs.
func (m *Module) Unload() error {
	return m.c.Do("cuModuleUnload", func() int32 { return m.c.drv.cuModuleUnload(m.h) })
}

// Dim is a grid or block shape.
type Dim struct{ X, Y, Z uint32 }

// Launch queues fn on stream (a cudaStream_t or CUstream; 0 is the legacy
// default stream) with params, cuLaunchKernel's array of pointers to the
// parameter values: the memory it points at and the values must stay put
// until Launch returns (pinned or C memory). It makes no allocation.
func (c *Context) Launch(fn Function, grid, block Dim, shared uint32, stream device.Stream, params unsafe.Pointer) error {
	if err := c.Enter(); err != nil {
		return err
	}
	rc := call(c.drv.launch, uintptr(fn), uintptr(grid.X), uintptr(grid.Y), uintptr(grid.Z),
		uintptr(block.X), uintptr(block.Y), uintptr(block.Z), uintptr(shared), uintptr(stream), uintptr(params), 0)
	c.Leave()
	if rc != 0 {
		return c.drv.Check("cuLaunchKernel", rc)
	}
	return nil
}

// args is the argument array of one call through purego.SyscallN. Passed
// as a slice that already exists, it spares SyscallN the allocation of
// its variadic argument (which go:uintptrescapes makes escape).
type args [11]uintptr

var argsPool = sync.Pool{New: func() any { return new(args) }}

// call calls the C function fn with integer and pointer arguments and
// returns its status, the low 32 bits of the result (CUresult is a C
// enum). It makes no allocation. Pointers among a must point at memory that
// does not move: heap or C memory, never a Go stack.
func call(fn uintptr, a ...uintptr) int32 {
	buf := argsPool.Get().(*args)
	n := copy(buf[:], a)
	rc, _, _ := purego.SyscallN(fn, buf[:n]...)
	argsPool.Put(buf)
	return int32(rc)
}

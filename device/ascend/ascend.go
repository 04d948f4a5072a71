// Package ascend implements device.Device over AscendCL (libascendcl) for
// Huawei Ascend NPUs, loaded at run time through purego without cgo.
//
// The library is looked up in this order: WithLibrary,
// $ASCEND_HOME_PATH/lib64/libascendcl.so,
// /usr/local/Ascend/ascend-toolkit/latest/lib64/libascendcl.so, then
// libascendcl.so on the loader path. The error when none loads wraps
// device.ErrLibraryNotFound and names every place tried.
//
// AscendCL differs from CUDA in two ways this package hides: its context is
// per thread (every call first makes the device's context current on the
// calling OS thread), and it reports a never-recorded event as not ready
// (this package tracks recording so that such an event counts as complete).
package ascend

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/device/internal/native"
	"github.com/chameleon-go/chameleon/internal/dl"
)

// EnvHome is the CANN environment variable whose lib64 holds libascendcl.so.
const EnvHome = "ASCEND_HOME_PATH"

const toolkitPath = "/usr/local/Ascend/ascend-toolkit/latest/lib64/libascendcl.so"

// Option configures New.
type Option interface{ apply(*config) }

type config struct {
	library string
	id      int
	stream  device.Stream
	noMap   bool
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// WithLibrary tries path first. An empty path is ignored.
func WithLibrary(path string) Option {
	return optionFunc(func(c *config) {
		if path != "" {
			c.library = path
		}
	})
}

// WithDevice selects the NPU by id (default 0).
func WithDevice(id int) Option { return optionFunc(func(c *config) { c.id = id }) }

// WithStream makes s, an aclrtStream owned by the caller, the DefaultStream.
// The default is the NULL (default) stream.
func WithStream(s device.Stream) Option { return optionFunc(func(c *config) { c.stream = s }) }

// WithoutMapping turns page mapping off: PageSize returns 0 and an
// Allocator on the device reserves plain aclrtMalloc segments.
func WithoutMapping() Option { return optionFunc(func(c *config) { c.noMap = true }) }

// errNoMapping is Mapping's answer under WithoutMapping.
var errNoMapping = errors.New("mapping turned off (WithoutMapping)")

type api struct {
	memoryFuncs
	streamFuncs
	eventFuncs
	deviceFuncs
	path string
	// vmm is nil when the library lacks the virtual memory calls, and
	// vmmErr says which.
	vmm    *vmmFuncs
	vmmErr error

	mu    sync.Mutex
	users int // open Devices; aclFinalize runs when the last one closes
}

var (
	apisMu sync.Mutex
	apis   = map[*dl.Library]*api{}
)

func candidates(opt, home string) []string {
	var c []string
	if opt != "" {
		c = append(c, opt)
	}
	if home != "" {
		c = append(c, filepath.Join(home, "lib64", "libascendcl.so"))
	}
	return append(c, toolkitPath, "libascendcl.so")
}

func load(paths []string) (*api, error) {
	lib, err := dl.Open(paths, device.ErrLibraryNotFound)
	if err != nil {
		return nil, fmt.Errorf("ascend: %w", err)
	}
	apisMu.Lock()
	defer apisMu.Unlock()
	if a, ok := apis[lib]; ok {
		return a, nil
	}
	a := &api{path: lib.Path}
	for _, f := range []interface{ load(*dl.Library) error }{&a.memoryFuncs, &a.streamFuncs, &a.eventFuncs, &a.deviceFuncs} {
		if err := f.load(lib); err != nil {
			return nil, fmt.Errorf("ascend: bind %s: %w", lib.Path, err)
		}
	}
	a.vmm, a.vmmErr = loadVMM(lib)
	apis[lib] = a
	return a, nil
}

// acquire runs aclInit for the first open Device of this library.
func (a *api) acquire() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.users == 0 {
		// aclInit(NULL): no configuration file. Another component of the
		// process may have initialized AscendCL already.
		if rc := a.aclInit(nil); rc != 0 && Error(rc) != ErrorRepeatInitialize {
			return fail("aclInit", rc)
		}
	}
	a.users++
	return nil
}

func (a *api) release() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.users--
	if a.users == 0 {
		if rc := a.aclFinalize(); rc != 0 && Error(rc) != ErrorRepeatFinalize {
			return fail("aclFinalize", rc)
		}
	}
	return nil
}

// Device is one NPU. Create it with New.
type Device struct {
	native.Copies
	api     *api
	id      int
	ctx     uintptr
	name    string
	compute device.Stream
	closed  atomic.Bool

	streams *native.Table[device.Stream, struct{}]
	events  *native.Table[device.Event, *eventState]

	// vmm maps pages (device.Mapper); nil when it cannot, and mapErr says
	// why.
	vmm    *vmm
	mapErr error
}

var _ device.Device = (*Device)(nil)

// New loads AscendCL, initializes it and opens the device.
func New(opts ...Option) (*Device, error) {
	cfg := config{}
	for _, o := range opts {
		if o != nil {
			o.apply(&cfg)
		}
	}
	a, err := load(candidates(cfg.library, os.Getenv(EnvHome)))
	if err != nil {
		return nil, err
	}
	if err := a.acquire(); err != nil {
		return nil, err
	}
	d, err := open(a, cfg)
	if err != nil {
		return nil, errors.Join(err, a.release())
	}
	return d, nil
}

func open(a *api, cfg config) (*Device, error) {
	var n uint32
	if rc := a.aclrtGetDeviceCount(&n); rc != 0 {
		return nil, fmt.Errorf("ascend: %s: %w", a.path, fail("aclrtGetDeviceCount", rc))
	}
	if cfg.id < 0 || cfg.id >= int(n) {
		return nil, fmt.Errorf("ascend: device %d of %d: %w", cfg.id, n, device.ErrInvalidValue)
	}
	// The context aclrtSetDevice creates is current on this thread only;
	// keep the thread until it has been read back.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if rc := a.aclrtSetDevice(int32(cfg.id)); rc != 0 {
		return nil, fmt.Errorf("ascend: device %d: %w", cfg.id, fail("aclrtSetDevice", rc))
	}
	var ctx uintptr
	if rc := a.aclrtGetCurrentContext(&ctx); rc != 0 {
		a.aclrtResetDevice(int32(cfg.id))
		return nil, fmt.Errorf("ascend: device %d: %w", cfg.id, fail("aclrtGetCurrentContext", rc))
	}
	d := &Device{
		api:     a,
		id:      cfg.id,
		ctx:     ctx,
		compute: cfg.stream,
		streams: native.NewTable[device.Stream, struct{}]("ascend", "stream"),
		events:  native.NewTable[device.Event, *eventState]("ascend", "event"),
		name:    fmt.Sprintf("npu:%d", cfg.id),
	}
	// n is also destMax: every destination range is exactly the copy's size.
	d.Copies = native.Copies{Backend: "ascend", Enter: d.enter, Leave: d.leave,
		Async: func(dst, src, n uintptr, kind int32, s uintptr) error {
			return check("aclrtMemcpyAsync", a.aclrtMemcpyAsync(dst, n, src, n, kind, s))
		}}
	switch {
	case cfg.noMap:
		d.mapErr = errNoMapping
	case a.vmm == nil:
		d.mapErr = a.vmmErr
	default:
		// The context aclrtSetDevice made is current on this thread.
		d.vmm, d.mapErr = newVMM(a.vmm, cfg.id)
	}
	if a.aclrtGetSocName != nil {
		if soc := a.aclrtGetSocName(); soc != "" {
			d.name = fmt.Sprintf("%s (npu:%d)", soc, cfg.id)
		}
	}
	return d, nil
}

// Library returns the path of the loaded AscendCL.
func (d *Device) Library() string { return d.api.path }

// Name implements device.Device.
func (d *Device) Name() string { return d.name }

// enter checks that d is open and makes its context current on this
// goroutine's OS thread until leave: AscendCL contexts are per thread and
// goroutines move between threads.
func (d *Device) enter(what string) error {
	if d.closed.Load() {
		return fmt.Errorf("ascend: %s: %w", what, device.ErrClosed)
	}
	runtime.LockOSThread()
	if rc := d.api.aclrtSetCurrentContext(d.ctx); rc != 0 {
		runtime.UnlockOSThread()
		return fmt.Errorf("ascend: %s: %w", what, fail("aclrtSetCurrentContext", rc))
	}
	return nil
}

func (d *Device) leave() { runtime.UnlockOSThread() }

// Close destroys the streams and events made by d, resets the device and,
// for the last open Device, finalizes AscendCL. Memory is not freed.
func (d *Device) Close() error {
	if err := d.enter("close"); err != nil {
		return nil
	}
	defer d.leave()
	if !d.closed.CompareAndSwap(false, true) {
		return nil
	}
	errs := []error{d.streams.DestroyAll(d.api.destroyStream), d.events.DestroyAll(d.api.destroyEvent)}
	if rc := d.api.aclrtResetDevice(int32(d.id)); rc != 0 {
		errs = append(errs, fail("aclrtResetDevice", rc))
	}
	errs = append(errs, d.api.release())
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("ascend: close: %w", err)
	}
	return nil
}

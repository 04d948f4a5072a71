// Package cuda implements device.Device over the CUDA runtime (libcudart),
// loaded at run time through purego: no cgo, so a CGO_ENABLED=0 binary runs
// on any machine and finds the GPU's runtime when it starts.
//
// The library is looked up in this order: WithLibrary, the CHAMELEON_CUDART
// environment variable, then libcudart.so, libcudart.so.13, libcudart.so.12
// on the loader path and the same names in /usr/local/cuda/lib64. The first
// that loads wins; if none does, the error wraps device.ErrLibraryNotFound
// and names every place tried with the loader's reason.
//
// Device implements device.Mapper through the driver API's virtual memory
// management (libcuda, through device/cuda/driver, looked up as
// WithDriverLibrary, CHAMELEON_LIBCUDA, libcuda.so.1, libcuda.so, then the
// directory of CHAMELEON_CUDART and /usr/local/cuda/lib64): pages of the
// driver's minimum granularity, each its own cuMemCreate allocation, mapped
// in the primary context that libcudart uses. Without libcuda or its calls,
// or with WithoutMapping, PageSize is 0 and allocators fall back to
// cudaMalloc segments; Mapping says why.
package cuda

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/device/cuda/driver"
	"github.com/chameleon-go/chameleon/device/internal/native"
	"github.com/chameleon-go/chameleon/internal/dl"
)

// EnvLibrary names the environment variable that points at libcudart.
const EnvLibrary = "CHAMELEON_CUDART"

// defaultPaths are tried after the option and the environment variable.
var defaultPaths = []string{
	"libcudart.so",
	"libcudart.so.13",
	"libcudart.so.12",
	"/usr/local/cuda/lib64/libcudart.so",
	"/usr/local/cuda/lib64/libcudart.so.13",
	"/usr/local/cuda/lib64/libcudart.so.12",
}

// Option configures New.
type Option interface{ apply(*config) }

type config struct {
	library string
	driver  string
	ordinal int
	stream  device.Stream
	noMap   bool
	page    int64 // WithPageSize; 0: DefaultPageSize
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// WithLibrary tries path first, before CHAMELEON_CUDART and the well-known
// names. An empty path is ignored.
func WithLibrary(path string) Option {
	return optionFunc(func(c *config) {
		if path != "" {
			c.library = path
		}
	})
}

// WithDevice selects the GPU by ordinal (default 0).
func WithDevice(ordinal int) Option {
	return optionFunc(func(c *config) { c.ordinal = ordinal })
}

// WithStream makes s, a cudaStream_t owned by the caller (the stream the
// host's kernels run on), the device's DefaultStream. The default is the
// legacy default stream, 0.
func WithStream(s device.Stream) Option {
	return optionFunc(func(c *config) { c.stream = s })
}

// WithDriverLibrary tries path first when looking up libcuda for page
// mapping, before CHAMELEON_LIBCUDA and the well-known names
// (driver.Candidates). An empty path is ignored.
func WithDriverLibrary(path string) Option {
	return optionFunc(func(c *config) {
		if path != "" {
			c.driver = path
		}
	})
}

// WithPageSize makes each mapped page size bytes, one physical allocation
// (cuMemCreate) of a power of two at least the driver's granularity
// (2 MiB). The driver's costs go by mapping, not by byte: on an H200, 1 GiB
// costs 36 ms to map and unmap as 2 MiB pages and 4.3 ms as 16 MiB ones
// (TestRealMappingGranule), so larger pages make moving memory between free
// ranges cheaper, while partly used pages waste more. 0 (the default)
// lets the allocator size them for its limit (SizePages): up to
// DefaultPageSize.
func WithPageSize(size int64) Option { return optionFunc(func(c *config) { c.page = size }) }

// DefaultPageSize is the largest mapped page SizePages chooses: on the
// H200 the timed replays of llama16 and llama7b-8l at 90% and 80% of their
// peaks (limits of 16-22 GiB) ran closest to their plans with it (within
// 8-11% at three of the four, against 36-84% with 2 MiB pages, and no
// forced eviction in STABLE), where 32 and 64 MiB pages began to evict for
// the pages' waste; the decode trace at 50% (2.3 GiB) evicted with 16 MiB
// pages and ran its plan with 2 MiB ones.
const DefaultPageSize = 16 << 20

// WithoutMapping turns page mapping off: PageSize returns 0 and an
// Allocator on the device reserves plain cudaMalloc segments.
func WithoutMapping() Option { return optionFunc(func(c *config) { c.noMap = true }) }

// errNoMapping is Mapping's answer under WithoutMapping.
var errNoMapping = errors.New("mapping turned off (WithoutMapping)")

// api is one loaded runtime: every bound function, grouped by API area.
type api struct {
	memoryFuncs
	streamFuncs
	eventFuncs
	deviceFuncs
	path string
}

var (
	apisMu sync.Mutex
	apis   = map[*dl.Library]*api{}
)

func candidates(opt, env string) []string {
	var c []string
	if opt != "" {
		c = append(c, opt)
	}
	if env != "" {
		c = append(c, env)
	}
	return append(c, defaultPaths...)
}

// load opens the first candidate that loads and binds every symbol.
func load(paths []string) (*api, error) {
	lib, err := dl.Open(paths, device.ErrLibraryNotFound)
	if err != nil {
		return nil, fmt.Errorf("cuda: %w", err)
	}
	apisMu.Lock()
	defer apisMu.Unlock()
	if a, ok := apis[lib]; ok {
		return a, nil
	}
	a := &api{path: lib.Path}
	for _, f := range []interface{ load(*dl.Library) error }{&a.memoryFuncs, &a.streamFuncs, &a.eventFuncs, &a.deviceFuncs} {
		if err := f.load(lib); err != nil {
			return nil, fmt.Errorf("cuda: bind %s: %w", lib.Path, err)
		}
	}
	if a.cudaGetErrorName != nil {
		fn := a.cudaGetErrorName
		libName.Store(&fn)
	}
	apis[lib] = a
	return a, nil
}

// notFoundHint adds to a not-found error from load the environment
// variable that points at libcudart (EnvLibrary): how to set it when it is
// not set, that its path did not load when it is.
func notFoundHint(err error, env string) error {
	if !errors.Is(err, device.ErrLibraryNotFound) {
		return err
	}
	if env == "" {
		return fmt.Errorf("%w; set %s to the path of libcudart (%s=/usr/local/cuda/lib64/libcudart.so.12)", err, EnvLibrary, EnvLibrary)
	}
	return fmt.Errorf("%w; %s=%s did not load either: point it at libcudart", err, EnvLibrary, env)
}

// Device is one GPU. Create it with New.
type Device struct {
	native.Copies
	api     *api
	ordinal int
	name    string
	compute device.Stream
	closed  atomic.Bool

	streams *native.Table[device.Stream, struct{}]
	events  *native.Table[device.Event, struct{}]

	// vmm maps pages (device.Mapper); nil when it cannot, and mapErr says
	// why.
	vmm    *vmm
	mapErr error
	// ctx is the primary context for launches when mapping is off
	// (WithoutMapping) and libcuda loads; with mapping, vmm holds it.
	ctx *driver.Context
}

var _ device.Device = (*Device)(nil)

// New loads the runtime and selects the device.
func New(opts ...Option) (*Device, error) {
	cfg := config{}
	for _, o := range opts {
		if o != nil {
			o.apply(&cfg)
		}
	}
	env := os.Getenv(EnvLibrary)
	a, err := load(candidates(cfg.library, env))
	if err != nil {
		return nil, notFoundHint(err, env)
	}
	var n int32
	if rc := a.cudaGetDeviceCount(&n); rc != 0 {
		return nil, fmt.Errorf("cuda: %s: %w", a.path, fail("cudaGetDeviceCount", rc))
	}
	if cfg.ordinal < 0 || cfg.ordinal >= int(n) {
		return nil, fmt.Errorf("cuda: device %d of %d: %w", cfg.ordinal, n, device.ErrInvalidValue)
	}
	if rc := a.cudaSetDevice(int32(cfg.ordinal)); rc != 0 {
		return nil, fmt.Errorf("cuda: device %d: %w", cfg.ordinal, fail("cudaSetDevice", rc))
	}
	d := &Device{
		api:     a,
		ordinal: cfg.ordinal,
		compute: cfg.stream,
		streams: native.NewTable[device.Stream, struct{}]("cuda", "stream"),
		events:  native.NewTable[device.Event, struct{}]("cuda", "event"),
	}
	d.Copies = native.Copies{Backend: "cuda", Enter: d.enter, Leave: d.leave,
		Async: func(dst, src, n uintptr, kind int32, s uintptr) error {
			return check("cudaMemcpyAsync", a.cudaMemcpyAsync(dst, src, n, kind, s))
		}}
	d.mapErr = errNoMapping
	var paths []string
	if cfg.driver != "" {
		paths = append(paths, cfg.driver)
	}
	paths = append(paths, driver.Candidates(driver.EnvLibcuda, driver.LibcudaNames...)...)
	if !cfg.noMap {
		d.vmm, d.mapErr = newVMM(paths, cfg.ordinal, cfg.page)
		if errors.Is(d.mapErr, device.ErrInvalidValue) {
			return nil, fmt.Errorf("cuda: WithPageSize: %w", d.mapErr)
		}
	} else if drv, err := driver.Load(paths...); err == nil {
		// No mapping, but the primary context still serves kernel
		// launches through the driver API (Context).
		if ctx, err := drv.Primary(cfg.ordinal); err == nil {
			d.ctx = ctx
		}
	}
	if cfg.ordinal != 0 {
		otherGPUs.Store(true)
	}
	d.name = fmt.Sprintf("cuda:%d", cfg.ordinal)
	if n := a.deviceName(cfg.ordinal); n != "" {
		d.name = fmt.Sprintf("%s (cuda:%d)", n, cfg.ordinal)
	}
	return d, nil
}

// Library returns the path of the loaded runtime.
func (d *Device) Library() string { return d.api.path }

// Name implements device.Device.
func (d *Device) Name() string { return d.name }

// enter checks that d is open and, for any GPU but 0, makes it current on
// this goroutine's OS thread until leave. The CUDA runtime keeps the current
// device per thread and goroutines move between threads; device 0 is every
// thread's default, so the common case costs nothing.
func (d *Device) enter(what string) error {
	if d.closed.Load() {
		return fmt.Errorf("cuda: %s: %w", what, device.ErrClosed)
	}
	if !d.switches() {
		return nil
	}
	runtime.LockOSThread()
	if rc := d.api.cudaSetDevice(int32(d.ordinal)); rc != 0 {
		runtime.UnlockOSThread()
		return fmt.Errorf("cuda: %s: device %d: %w", what, d.ordinal, fail("cudaSetDevice", rc))
	}
	return nil
}

func (d *Device) leave() {
	if d.switches() {
		runtime.UnlockOSThread()
	}
}

// otherGPUs is set once the process opens a GPU other than 0: from then
// on every call makes its device current on its OS thread, GPU 0's too (a
// thread that ran GPU 1's calls would otherwise send GPU 0's there). Open
// every device before using any: a call under way on GPU 0 while another
// opens may leave its thread unlocked one time too many.
var otherGPUs atomic.Bool

// switches says whether a call makes d current on its thread first.
func (d *Device) switches() bool { return d.ordinal != 0 || otherGPUs.Load() }

// Close destroys the streams and events made by d. Memory is not freed: the
// allocator and pool that own it free it in their own Close.
func (d *Device) Close() error {
	if err := d.enter("close"); err != nil {
		return nil
	}
	defer d.leave()
	if !d.closed.CompareAndSwap(false, true) {
		return nil
	}
	errs := []error{d.streams.DestroyAll(d.api.destroyStream), d.events.DestroyAll(d.api.destroyEvent)}
	if d.vmm != nil {
		errs = append(errs, d.vmm.ctx.Release())
	}
	if d.ctx != nil {
		errs = append(errs, d.ctx.Release())
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cuda: close: %w", err)
	}
	return nil
}

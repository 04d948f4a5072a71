package nccl

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"unsafe"

	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/internal/dl"
)

// EnvLibrary names the environment variable that points at libnccl.
const EnvLibrary = "CHAMELEON_NCCL"

// envCudart is device/cuda's variable: libnccl often sits next to the
// libcudart it names.
const envCudart = "CHAMELEON_CUDART"

// ErrLibrary reports that libnccl, or a symbol this package needs, could
// not be loaded. Open's errors wrap it, and also device.ErrLibraryNotFound
// when no candidate loaded at all.
var ErrLibrary = errors.New("nccl: library not available")

// Names are the sonames tried, in order, after WithLibrary and
// CHAMELEON_NCCL: first on the loader path, then in each of Dirs.
var Names = []string{"libnccl.so.2", "libnccl.so"}

// Dirs are the install directories searched for Names after the loader
// path (and after the directory of CHAMELEON_CUDART, when set): the CUDA
// toolkit's, NVIDIA's tarball layout and the distribution's multiarch
// directory, where the libnccl2 package puts it.
var Dirs = []string{
	"/usr/local/cuda/lib64",
	"/usr/local/cuda/targets/" + targetArch() + "-linux/lib",
	"/usr/local/nccl/lib",
	"/usr/lib/" + targetArch() + "-linux-gnu",
}

// byValueStructs says whether purego passes a struct argument by value on
// this platform (ncclCommInitRank's ncclUniqueId): Linux on amd64 and
// arm64, the platforms libnccl ships for.
var byValueStructs = runtime.GOOS == "linux" && (runtime.GOARCH == "amd64" || runtime.GOARCH == "arm64")

func targetArch() string {
	if runtime.GOARCH == "arm64" {
		return "aarch64"
	}
	return "x86_64"
}

// Option configures Open.
type Option interface{ apply(*config) }

type config struct{ library string }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// WithLibrary tries path first, before CHAMELEON_NCCL and the well-known
// names. An empty path is ignored.
func WithLibrary(path string) Option {
	return optionFunc(func(c *config) {
		if path != "" {
			c.library = path
		}
	})
}

// candidates lists where Open looks, in order.
func candidates(opt string) []string {
	var c []string
	if opt != "" {
		c = append(c, opt)
	}
	if p := os.Getenv(EnvLibrary); p != "" {
		c = append(c, p)
	}
	c = append(c, Names...)
	var dirs []string
	if p := os.Getenv(envCudart); p != "" {
		dirs = append(dirs, filepath.Dir(p))
	}
	dirs = append(dirs, Dirs...)
	for _, d := range dirs {
		for _, n := range Names {
			c = append(c, filepath.Join(d, n))
		}
	}
	return c
}

// funcs are the bound entry points of one loaded libnccl.
type funcs struct {
	// ncclResult_t ncclGetVersion(int *version);
	getVersion func(v *int32) int32
	// const char* ncclGetErrorString(ncclResult_t result);
	getErrorString func(rc int32) string
	// ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId);
	getUniqueID func(id *UniqueID) int32
	// ncclResult_t ncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist);
	commInitAll func(comms *uintptr, ndev int32, devlist *int32) int32
	// ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank);
	// The 128-byte id goes by value: on the stack (System V amd64, the
	// MEMORY class) or as a pointer to a copy (AAPCS64), which purego
	// lays out for a struct argument.
	commInitRank func(comm *uintptr, nranks int32, id uniqueIDArg, rank int32) int32
	// ncclResult_t ncclCommDestroy(ncclComm_t comm);
	commDestroy func(comm uintptr) int32
	// ncclResult_t ncclCommAbort(ncclComm_t comm);
	commAbort func(comm uintptr) int32
	// ncclResult_t ncclCommCount(const ncclComm_t comm, int* count);
	commCount func(comm uintptr, n *int32) int32
	// ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device);
	commCuDevice func(comm uintptr, dev *int32) int32
	// ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank);
	commUserRank func(comm uintptr, rank *int32) int32
	// ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError);
	commGetAsyncError func(comm uintptr, rc *int32) int32
	// ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
	//     ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
	broadcast func(send, recv, count uintptr, dt DataType, root int32, comm, stream uintptr) int32
	// ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
	//     ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
	allReduce func(send, recv, count uintptr, dt DataType, op RedOp, comm, stream uintptr) int32
	// ncclResult_t ncclGroupStart(); ncclResult_t ncclGroupEnd();
	groupStart, groupEnd func() int32

	// Optional: nil when the library predates them.
	//
	// ncclResult_t ncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank,
	//     int nId, ncclUniqueId* commIds, ncclConfig_t* config); (2.23)
	commInitRankScalable func(comm *uintptr, nranks, rank, nID int32, ids *UniqueID, config unsafe.Pointer) int32
	// const char* ncclGetLastError(ncclComm_t comm); (2.13)
	getLastError func(comm uintptr) string
}

// uniqueIDArg is ncclUniqueId as purego passes a struct by value.
type uniqueIDArg struct{ Internal [UniqueIDBytes]byte }

// Library is one loaded libnccl. Open returns the same Library for the
// same file. Its methods are safe for concurrent use.
type Library struct {
	funcs
	path string
}

var (
	libsMu sync.Mutex
	libs   = map[*dl.Library]*Library{}
)

// Open loads libnccl: WithLibrary's path, else CHAMELEON_NCCL, else Names
// on the loader path and in the directory of CHAMELEON_CUDART and Dirs.
// The first that loads wins. The error wraps ErrLibrary; it names every
// place tried with the loader's reason when none loaded, or the missing
// symbols when the library lacks one this package needs.
func Open(opts ...Option) (*Library, error) {
	var cfg config
	for _, o := range opts {
		if o != nil {
			o.apply(&cfg)
		}
	}
	lib, err := dl.Open(candidates(cfg.library), device.ErrLibraryNotFound)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrLibrary, err)
	}
	libsMu.Lock()
	defer libsMu.Unlock()
	if l, ok := libs[lib]; ok {
		return l, nil
	}
	l := &Library{path: lib.Path}
	f := &l.funcs
	if err := lib.Bind(
		dl.Func{Ptr: &f.getVersion, Name: "ncclGetVersion"},
		dl.Func{Ptr: &f.getErrorString, Name: "ncclGetErrorString"},
		dl.Func{Ptr: &f.getUniqueID, Name: "ncclGetUniqueId"},
		dl.Func{Ptr: &f.commInitAll, Name: "ncclCommInitAll"},
		dl.Func{Ptr: &f.commDestroy, Name: "ncclCommDestroy"},
		dl.Func{Ptr: &f.commAbort, Name: "ncclCommAbort"},
		dl.Func{Ptr: &f.commCount, Name: "ncclCommCount"},
		dl.Func{Ptr: &f.commCuDevice, Name: "ncclCommCuDevice"},
		dl.Func{Ptr: &f.commUserRank, Name: "ncclCommUserRank"},
		dl.Func{Ptr: &f.commGetAsyncError, Name: "ncclCommGetAsyncError"},
		dl.Func{Ptr: &f.broadcast, Name: "ncclBroadcast"},
		dl.Func{Ptr: &f.allReduce, Name: "ncclAllReduce"},
		dl.Func{Ptr: &f.groupStart, Name: "ncclGroupStart"},
		dl.Func{Ptr: &f.groupEnd, Name: "ncclGroupEnd"},
	); err != nil {
		return nil, fmt.Errorf("%w: bind %s: %w", ErrLibrary, lib.Path, err)
	}
	if byValueStructs {
		// Bound apart: purego panics registering a struct argument where it
		// cannot pass one.
		if err := lib.Bind(dl.Func{Ptr: &f.commInitRank, Name: "ncclCommInitRank"}); err != nil {
			return nil, fmt.Errorf("%w: bind %s: %w", ErrLibrary, lib.Path, err)
		}
	}
	// Each optional symbol on its own: Bind registers none of a set when
	// one is missing.
	_ = lib.Bind(dl.Func{Ptr: &f.commInitRankScalable, Name: "ncclCommInitRankScalable"})
	_ = lib.Bind(dl.Func{Ptr: &f.getLastError, Name: "ncclGetLastError"})
	libs[lib] = l
	return l, nil
}

// Path is the file the library was loaded from, as it was found (one of
// the candidates Open tried).
func (l *Library) Path() string { return l.path }

// Version is an NCCL_VERSION_CODE: 2.8.4 is 2804, 2.27.3 is 22703 (the
// encoding changed at 2.9).
type Version int

// Major, Minor and Patch decode the version code.
func (v Version) Major() int {
	if v >= 10000 {
		return int(v) / 10000
	}
	return int(v) / 1000
}

// Minor is the minor release.
func (v Version) Minor() int {
	if v >= 10000 {
		return int(v) % 10000 / 100
	}
	return int(v) % 1000 / 100
}

// Patch is the patch level.
func (v Version) Patch() int { return int(v) % 100 }

// String is "major.minor.patch".
func (v Version) String() string { return fmt.Sprintf("%d.%d.%d", v.Major(), v.Minor(), v.Patch()) }

// Version returns the loaded library's version (ncclGetVersion).
func (l *Library) Version() (Version, error) {
	var v int32
	if err := l.check("ncclGetVersion", l.getVersion(&v), 0); err != nil {
		return 0, err
	}
	return Version(v), nil
}

// Initialiser names the NCCL function InitRank calls with this library:
// ncclCommInitRankScalable (2.23 and later), which takes the unique id by
// pointer, else ncclCommInitRank, to which the id goes by value.
func (l *Library) Initialiser() string {
	if l.commInitRankScalable != nil {
		return "ncclCommInitRankScalable"
	}
	return "ncclCommInitRank"
}

// GroupStart opens a group (ncclGroupStart): collectives called until the
// matching GroupEnd are launched together, which one goroutine driving
// several communicators of one process (InitAll) needs to avoid a
// deadlock. NCCL keeps the group per OS thread, so the caller must hold
// its thread (runtime.LockOSThread) from GroupStart to GroupEnd; Group
// does that.
func (l *Library) GroupStart() error { return l.check("ncclGroupStart", l.groupStart(), 0) }

// GroupEnd closes a group (ncclGroupEnd) and launches its collectives. It
// reports the errors of the calls made in the group.
func (l *Library) GroupEnd() error { return l.check("ncclGroupEnd", l.groupEnd(), 0) }

// Group runs fn between GroupStart and GroupEnd on one locked OS thread.
// The group is closed even when fn fails; fn's error comes first.
func (l *Library) Group(fn func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := l.GroupStart(); err != nil {
		return err
	}
	ferr := fn()
	return errors.Join(ferr, l.GroupEnd())
}

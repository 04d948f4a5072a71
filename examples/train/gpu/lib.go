// Package gpu is the training example's compute on an NVIDIA GPU without
// cgo: cuBLAS (libcublas) for the GEMMs and a few elementwise kernels
// compiled at start with NVRTC (libnvrtc) and launched through the driver
// API (libcuda), all loaded with purego. Memory, streams and copies are the
// Engine's, through device/cuda (libcudart); this package only queues
// compute on the Engine's compute stream.
//
// Libraries are looked up in this order: the environment variable
// (CHAMELEON_NVRTC, CHAMELEON_LIBCUDA, CHAMELEON_CUBLAS), the versioned and
// plain names on the loader path, then the directory of CHAMELEON_CUDART
// and /usr/local/cuda/lib64. Every symbol is resolved with purego.Dlsym
// before it is bound, so a missing library or symbol is an error, never a
// panic.
package gpu

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"unsafe"

	"github.com/ebitengine/purego"
)

// ErrLibrary reports a library or symbol that could not be loaded.
var ErrLibrary = errors.New("gpu: library not available")

// Environment variables that point at the libraries.
const (
	EnvNVRTC   = "CHAMELEON_NVRTC"
	EnvLibcuda = "CHAMELEON_LIBCUDA"
	EnvCublas  = "CHAMELEON_CUBLAS"
	envCudart  = "CHAMELEON_CUDART"
)

// candidates lists where to look for a library: env, names, then the
// names in the directories of the CUDA toolkit.
func candidates(env string, names ...string) []string {
	var c []string
	if p := os.Getenv(env); p != "" {
		c = append(c, p)
	}
	c = append(c, names...)
	var dirs []string
	if p := os.Getenv(envCudart); p != "" {
		dirs = append(dirs, filepath.Dir(p))
	}
	dirs = append(dirs, "/usr/local/cuda/lib64")
	for _, d := range dirs {
		for _, n := range names {
			c = append(c, filepath.Join(d, n))
		}
	}
	return c
}

type library struct {
	h    uintptr
	path string
}

// open returns the first candidate that loads. RTLD_GLOBAL lets
// libcublas find the libcublasLt it depends on when both sit in a
// directory the loader does not search.
func open(paths []string) (*library, error) {
	runtime.LockOSThread() // dlerror is per thread
	defer runtime.UnlockOSThread()
	var tried []string
	for _, p := range paths {
		h, err := purego.Dlopen(p, purego.RTLD_NOW|purego.RTLD_GLOBAL)
		if err == nil {
			return &library{h: h, path: p}, nil
		}
		tried = append(tried, fmt.Sprintf("%s (%v)", p, err))
	}
	return nil, fmt.Errorf("%w: tried %s", ErrLibrary, strings.Join(tried, "; "))
}

// sym returns the address of the first of names the library exports
// (versioned names first where the headers rename a function).
func (l *library) sym(names ...string) (uintptr, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	for _, n := range names {
		if p, err := purego.Dlsym(l.h, n); err == nil && p != 0 {
			return p, nil
		}
	}
	return 0, fmt.Errorf("%w: %s does not export %s", ErrLibrary, l.path, strings.Join(names, " or "))
}

// binding is a Go function variable and the symbol names it may have.
type binding struct {
	fn    any
	names []string
}

func bind(fn any, names ...string) binding { return binding{fn: fn, names: names} }

// bindAll resolves every symbol first and registers none if one is
// missing: purego.RegisterLibFunc would panic instead.
func (l *library) bindAll(bs ...binding) error {
	addrs := make([]uintptr, len(bs))
	var errs []error
	for i, b := range bs {
		p, err := l.sym(b.names...)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		addrs[i] = p
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	for i, b := range bs {
		purego.RegisterFunc(b.fn, addrs[i])
	}
	return nil
}

// cstr is s as a NUL-terminated byte slice; pass &b[0] to C.
func cstr(s string) []byte { return append([]byte(s), 0) }

// gostr copies a NUL-terminated C string.
func gostr(p *byte) string {
	if p == nil {
		return ""
	}
	var n int
	for *(*byte)(unsafe.Add(unsafe.Pointer(p), n)) != 0 {
		n++
	}
	return string(unsafe.Slice(p, n))
}

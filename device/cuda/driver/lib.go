// Package driver binds the parts of the CUDA driver API (libcuda) and of
// NVRTC (libnvrtc) that chameleon uses, through purego without cgo: the
// primary context that libcudart also uses, modules loaded from PTX or
// CUBIN, kernel launches on a given stream, the virtual memory management
// calls behind device/cuda's Mapper, and a kernel that busy-waits on the
// GPU for a given time (Spinner), with which a replay stands in for an op of
// known duration.
//
// Libraries are looked up in this order: the environment variable
// (CHAMELEON_LIBCUDA, CHAMELEON_NVRTC), the versioned and plain names on the
// loader path, then the same names in the directory of CHAMELEON_CUDART and
// in /usr/local/cuda/lib64. Every symbol is resolved before it is bound, so
// a missing library or symbol is an error wrapping ErrLibrary, never a
// panic.
package driver

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/chameleon-go/chameleon/internal/dl"
)

// ErrLibrary reports a library or symbol that could not be loaded.
var ErrLibrary = errors.New("library not available")

// Environment variables that point at the libraries.
const (
	EnvLibcuda = "CHAMELEON_LIBCUDA"
	EnvNVRTC   = "CHAMELEON_NVRTC"
	// EnvCudart is device/cuda's variable: its directory is searched too.
	EnvCudart = "CHAMELEON_CUDART"
	// toolkitDir is where the CUDA toolkit installs its libraries.
	toolkitDir = "/usr/local/cuda/lib64"
)

// Names of the libraries, in the order they are tried.
var (
	LibcudaNames = []string{"libcuda.so.1", "libcuda.so"}
	NVRTCNames   = []string{"libnvrtc.so.13", "libnvrtc.so", "libnvrtc.so.12"}
)

// Candidates lists where to look for a library: the path in the
// environment variable env, the names on the loader path, then the names
// in the directory of CHAMELEON_CUDART and in /usr/local/cuda/lib64.
func Candidates(env string, names ...string) []string {
	var c []string
	if p := os.Getenv(env); p != "" {
		c = append(c, p)
	}
	c = append(c, names...)
	var dirs []string
	if p := os.Getenv(EnvCudart); p != "" {
		dirs = append(dirs, filepath.Dir(p))
	}
	dirs = append(dirs, toolkitDir)
	for _, d := range dirs {
		for _, n := range names {
			c = append(c, filepath.Join(d, n))
		}
	}
	return c
}

// Open returns the first of paths that loads, with its symbols global:
// libcublas finds the libcublasLt it depends on that way when both sit in
// a directory the loader does not search. The error wraps ErrLibrary.
func Open(paths []string) (*dl.Library, error) { return dl.OpenGlobal(paths, ErrLibrary) }

// Bind resolves every symbol first and registers none if one is missing.
// The error wraps ErrLibrary.
func Bind(lib *dl.Library, fs ...dl.Func) error {
	if err := lib.Bind(fs...); err != nil {
		return fmt.Errorf("%w: %w", ErrLibrary, err)
	}
	return nil
}

// Sym returns the address of the first of names the library exports. The
// error wraps ErrLibrary.
func Sym(lib *dl.Library, names ...string) (uintptr, error) {
	p, err := lib.Sym(names...)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrLibrary, err)
	}
	return p, nil
}

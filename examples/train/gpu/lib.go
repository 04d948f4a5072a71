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

	"github.com/chameleon-go/chameleon/internal/dl"
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

// open returns the first candidate that loads, with its symbols global:
// libcublas finds the libcublasLt it depends on that way when both sit in
// a directory the loader does not search.
func open(paths []string) (*dl.Library, error) { return dl.OpenGlobal(paths, ErrLibrary) }

// bind resolves every symbol first and registers none if one is missing
// (purego.RegisterLibFunc would panic instead).
func bind(lib *dl.Library, fs ...dl.Func) error {
	if err := lib.Bind(fs...); err != nil {
		return fmt.Errorf("%w: %w", ErrLibrary, err)
	}
	return nil
}

// sym returns the address of the first of names the library exports.
func sym(lib *dl.Library, names ...string) (uintptr, error) {
	p, err := lib.Sym(names...)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrLibrary, err)
	}
	return p, nil
}

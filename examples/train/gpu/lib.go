// Package gpu is the training example's compute on an NVIDIA GPU without
// cgo: cuBLAS (libcublas) for the GEMMs and a few elementwise kernels
// compiled at start with NVRTC (libnvrtc) and launched through the driver
// API (libcuda), all loaded with purego. The driver API and NVRTC are
// device/cuda/driver's, which the device layer shares; cuBLAS is bound
// here. Memory, streams and copies are the Engine's, through device/cuda
// (libcudart); this package only queues compute on the Engine's compute
// stream.
//
// Libraries are looked up in this order: the environment variable
// (CHAMELEON_NVRTC, CHAMELEON_LIBCUDA, CHAMELEON_CUBLAS), the versioned and
// plain names on the loader path, then the directory of CHAMELEON_CUDART
// and /usr/local/cuda/lib64. Every symbol is resolved with purego.Dlsym
// before it is bound, so a missing library or symbol is an error, never a
// panic.
package gpu

import (
	"github.com/chameleon-go/chameleon/device/cuda/driver"
)

// ErrLibrary reports a library or symbol that could not be loaded.
var ErrLibrary = driver.ErrLibrary

// Environment variables that point at the libraries.
const (
	EnvNVRTC   = driver.EnvNVRTC
	EnvLibcuda = driver.EnvLibcuda
	EnvCublas  = "CHAMELEON_CUBLAS"
)

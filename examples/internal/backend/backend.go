// Package backend opens the device the example commands run on: the host
// backend with pure-Go kernels, or CUDA with cuBLAS and the NVRTC kernels.
package backend

import (
	"errors"
	"fmt"
	"math"
	"runtime"

	"github.com/chameleon-go/chameleon"
	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/device/cuda"
	"github.com/chameleon-go/chameleon/device/host"
	"github.com/chameleon-go/chameleon/examples/train/compute"
	"github.com/chameleon-go/chameleon/examples/train/gpu"
	"github.com/chameleon-go/chameleon/layer"
	"github.com/chameleon-go/chameleon/trace"
)

// Options are what the commands' flags say of the device.
type Options struct {
	Device  string  // "host" or "cuda"
	Workers int     // host: goroutines of the kernels (0: GOMAXPROCS)
	HostBW  float64 // host: a modeled link of this many GB/s each way (0: memory speed)
	TF32    bool    // cuda: cuBLAS may use TF32 tensor cores
	Arch    string  // cuda: NVRTC --gpu-architecture of the elementwise kernels
	// PageSize is the bytes of each mapped page on cuda (0: the device's
	// rule for the limit, device.PageFor).
	PageSize int64
	// Ordinal is the GPU on cuda (cuda.WithDevice, gpu.WithDevice; default
	// 0). The CUDA runtime keeps the current device per OS thread, so a
	// caller that opens a GPU other than 0 does it on a thread it holds
	// (runtime.LockOSThread) and does not give back to other goroutines:
	// Open leaves that GPU current on it.
	Ordinal int
}

// Backend is an opened device with the kernels the models run on it.
type Backend struct {
	Dev device.Device
	// Kernels gives the kernels on the Engine's compute stream.
	Kernels func(compute device.Stream) (compute.Kernels, error)
	// Est prices ops for the planner (nil: the default estimator).
	Est layer.Estimator
	// Free is the device memory free at start, which bounds a
	// reservation; 0: unbounded.
	Free  int64
	Close func() error
}

// Open opens the device o names.
func Open(o Options) (*Backend, error) {
	switch o.Device {
	case "host":
		var hopts []host.Option
		if o.HostBW > 0 {
			hopts = append(hopts, host.WithBandwidth(o.HostBW*1e9, o.HostBW*1e9))
		}
		d, err := host.New(math.MaxInt64/4, hopts...)
		if err != nil {
			return nil, err
		}
		return &Backend{Dev: d, Close: d.Close, Est: HostCostModel(o.Workers),
			Kernels: func(s device.Stream) (compute.Kernels, error) { return compute.NewHost(d, s, o.Workers), nil }}, nil
	case "cuda":
		copts := []cuda.Option{cuda.WithDevice(o.Ordinal)}
		if o.PageSize > 0 {
			copts = append(copts, cuda.WithPageSize(o.PageSize))
		}
		// cuda.New makes the GPU current on this thread, and gpu.New's
		// cuBLAS handle is made on the thread's current GPU: one thread
		// for both.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		d, err := cuda.New(copts...)
		if err != nil {
			return nil, err
		}
		g, err := gpu.New(d.DefaultStream(), gpu.WithTF32(o.TF32), gpu.WithArch(o.Arch), gpu.WithDevice(o.Ordinal))
		if err != nil {
			d.Close()
			return nil, err
		}
		free, _, err := d.MemInfo()
		if err != nil {
			g.Close()
			d.Close()
			return nil, err
		}
		return &Backend{Dev: d, Free: free, Close: func() error { return errors.Join(g.Close(), d.Close()) },
			Kernels: func(s device.Stream) (compute.Kernels, error) {
				if s != d.DefaultStream() {
					return nil, fmt.Errorf("compute stream %#x is not the stream the GPU kernels were made for", uintptr(s))
				}
				return g, nil
			}}, nil
	}
	return nil, fmt.Errorf("--device %q: want host or cuda", o.Device)
}

// HostCostModel prices ops for the planner on the host backend: the H200
// cost model with the throughput of pure-Go kernels, so that a GEMM weighs
// against an elementwise op as it does here. Times are fitted to the
// measured step anyway; only the ratios matter.
func HostCostModel(workers int) layer.Estimator {
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	m := layer.DefaultCostModel()
	m.Device = layer.Device{FLOPS: 2e9 * float64(workers), FLOPS32: 2e9 * float64(workers), Bandwidth: 8e9}
	m.LaunchUS = 2
	return m
}

// EngineOptions are the Engine's options of an example run: the limit,
// the estimator (nil: layer.Default) with its op times fitted to stepMS,
// the step measured without a limit (0: not fitted), the smallest swap
// (0: the default) and the link each way in bytes/s (0: the default).
func EngineOptions(limit int64, est layer.Estimator, stepMS float64, minSwap int64, link float64) []chameleon.Option {
	if est == nil {
		est = layer.Default()
	}
	opts := []chameleon.Option{chameleon.WithMemoryLimit(limit), chameleon.WithEstimator(fitted{base: est, stepMS: stepMS})}
	if minSwap > 0 {
		opts = append(opts, chameleon.WithMinSwapBytes(minSwap))
	}
	if link > 0 {
		opts = append(opts, chameleon.WithLinkBandwidth(link))
	}
	return opts
}

// fitted fits the op times to the step time measured without a limit. The
// profiled step the Engine plans from already runs under the limit, so its
// time includes the stalls of forced swaps; fitting to it would count those
// stalls as compute and the simulator would predict them twice. Fitted to
// the unlimited time, the simulator predicts what a policy adds to a step
// that does not swap.
type fitted struct {
	base   layer.Estimator
	stepMS float64
}

func (e fitted) Estimate(it *trace.Iteration) []float64 {
	if e.stepMS <= 0 {
		return e.base.Estimate(it)
	}
	c := *it
	c.TimeMS = e.stepMS
	return e.base.Estimate(&c)
}

package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/device/cuda"
	"github.com/chameleon-go/chameleon/examples/train/compute"
	"github.com/chameleon-go/chameleon/examples/train/gpu"
)

// limitedMatches runs cfg without a limit and at a third of its peak on
// dev, and checks every logit byte of the limited run against the other.
func limitedMatches(t *testing.T, dev device.Device, kernels Kernels, cfg Config) (free, rep *Report) {
	t.Helper()
	cfg.Limit = cfg.UpperBoundBytes(cfg.Steps)
	free, err := Run(dev, kernels, cfg)
	require.NoError(t, err)
	require.Zero(t, free.Stats.SwapsOut)
	cfg.Limit, cfg.Hints = free.Stats.PeakDeviceBytes/3, true
	require.GreaterOrEqual(t, cfg.WeightBytes(), 2*cfg.Limit)
	rep, err = Run(dev, kernels, cfg)
	require.NoError(t, err)
	requireSameOutputs(t, free, rep)
	assert.LessOrEqual(t, rep.Stats.PeakDeviceBytes, cfg.Limit)
	assert.Positive(t, rep.Stats.KeptEvictions, "frozen weights leave with no copy")
	return free, rep
}

// TestRealCUDAInferKeepsOutputs is TestLimitKeepsOutputs on a GPU: cuBLAS
// and the NVRTC kernels are deterministic, so a run at a third of the peak
// repeats every logit of the unlimited run. It runs only when
// CHAMELEON_CUDART points at libcudart:
//
//	CGO_ENABLED=0 go test -c -o bin/infer.test ./examples/infer
//	CHAMELEON_CUDART=/usr/local/cuda/lib64/libcudart.so.13 ./bin/infer.test -test.run Real -test.v
func TestRealCUDAInferKeepsOutputs(t *testing.T) {
	path := os.Getenv(cuda.EnvLibrary)
	if path == "" {
		t.Skipf("set %s to libcudart to run on a GPU", cuda.EnvLibrary)
	}
	d, err := cuda.New(cuda.WithLibrary(path))
	require.NoError(t, err)
	defer d.Close()
	g, err := gpu.New(d.DefaultStream())
	require.NoError(t, err)
	defer g.Close()
	kernels := func(device.Stream) (compute.Kernels, error) { return g, nil }
	cfg := Config{Model: Model{Layers: 8, Width: 1024, FFN: 4096, Vocab: 4096, Sessions: 4, Prompt: 64}, Steps: 16, Seed: 3, MinSwap: 256 << 10, SyncPlanning: true}
	free, rep := limitedMatches(t, d, kernels, cfg)
	t.Logf("peak %d without a limit, %d under %d; %.3f GB in, %.3f GB out; %.1f tokens/s unlimited, %.1f limited",
		free.Stats.PeakDeviceBytes, rep.Stats.PeakDeviceBytes, rep.Config.Limit, float64(rep.Stats.SwappedInBytes)/1e9,
		float64(rep.Stats.SwappedOutBytes)/1e9, float64(len(free.Tokens))/free.Decode.Seconds(), float64(len(rep.Tokens))/rep.Decode.Seconds())
}

// TestFakeCUDAInfer runs the --device cuda path end to end on this
// machine: device/cuda over the fake libcudart of its tests and package
// gpu over its fake libnvrtc, libcuda and libcublas. Only the wiring is
// checked (purego bindings, copies and events through libcudart, kernel
// parameters), and that the limited run repeats the unlimited run's
// logits. It needs a C compiler.
func TestFakeCUDAInfer(t *testing.T) {
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "cc"
	}
	if _, err := exec.LookPath(cc); err != nil {
		t.Skipf("no C compiler (%s) to build the fake libraries: %v", cc, err)
	}
	srcs := []string{filepath.Join("..", "..", "device", "cuda", "testdata", "fakecudart.c"), filepath.Join("..", "train", "gpu", "testdata", "fakegpu.c")}
	for _, src := range srcs {
		if _, err := os.Stat(src); err != nil {
			t.Skipf("run from the package directory: %v", err)
		}
	}
	dir := t.TempDir()
	build := func(name, src string, libs ...string) string {
		out := filepath.Join(dir, name)
		b, err := exec.Command(cc, append([]string{"-shared", "-fPIC", "-O1", "-o", out, src}, libs...)...).CombinedOutput()
		require.NoError(t, err, "%s", b)
		return out
	}
	cudart := build("libcudart-fake.so", srcs[0])
	fake := build("libfakegpu.so", srcs[1], "-lm")
	for _, env := range []string{gpu.EnvNVRTC, gpu.EnvLibcuda, gpu.EnvCublas} {
		t.Setenv(env, fake)
	}
	d, err := cuda.New(cuda.WithLibrary(cudart))
	require.NoError(t, err)
	defer d.Close()
	g, err := gpu.New(d.DefaultStream())
	require.NoError(t, err)
	defer g.Close()
	kernels := func(device.Stream) (compute.Kernels, error) { return g, nil }
	cfg := small()
	cfg.Steps = 8
	limitedMatches(t, d, kernels, cfg)
}

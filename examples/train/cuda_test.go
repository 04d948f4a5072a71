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

// TestRealCUDALimitKeepsLossBits is TestLimitKeepsLossBits on a GPU: cuBLAS and
// the NVRTC kernels are deterministic, so a run at half the peak repeats
// the unlimited run's losses bit for bit. It runs only when
// CHAMELEON_CUDART points at libcudart:
//
//	CGO_ENABLED=0 go test -c -o traintest ./examples/train
//	CHAMELEON_CUDART=/usr/local/cuda/lib64/libcudart.so.13 ./traintest -test.run Real -test.v
func TestRealCUDALimitKeepsLossBits(t *testing.T) {
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

	cfg := Config{Model: Model{Layers: 8, Width: 512, FFN: 512, In: 64, Out: 16, TeacherHidden: 128, Batch: 8192},
		Steps: 20, LR: DefaultLR(512), Momentum: 0.9, Seed: 3, MinSwap: 1 << 20, SyncPlanning: true}
	cfg.Limit = cfg.UpperBoundBytes()
	free, err := Train(d, kernels, cfg)
	require.NoError(t, err)
	require.Zero(t, free.Stats.SwapsOut)

	cfg.Limit = free.Stats.PeakDeviceBytes / 2
	rep, err := Train(d, kernels, cfg)
	require.NoError(t, err)
	requireSameBits(t, free.Losses(), rep.Losses())
	assert.Positive(t, rep.Stats.SwappedOutBytes)
	assert.LessOrEqual(t, rep.Stats.PeakDeviceBytes, cfg.Limit)
	ls := rep.Losses()
	assert.Less(t, mean(ls[len(ls)-3:]), 0.7*mean(ls[:3]), "the loss must fall: %v", ls)
	t.Logf("peak %d without a limit, %d under %d; swapped %.3f GB out; loss %.4f -> %.4f",
		free.Stats.PeakDeviceBytes, rep.Stats.PeakDeviceBytes, cfg.Limit, float64(rep.Stats.SwappedOutBytes)/1e9, ls[0], ls[len(ls)-1])
}

// TestFakeCUDATrain runs the --device cuda path end to end on this
// machine: device/cuda over the fake libcudart of its tests (host memory,
// synchronous copies) and package gpu over its fake libnvrtc, libcuda and
// libcublas (kernels run on the host at launch). No GPU arithmetic is
// checked here, only the wiring: purego bindings, the Engine's waits and
// copies through libcudart, kernel parameters, and that the limited run
// repeats the unlimited run's losses. It needs a C compiler.
func TestFakeCUDATrain(t *testing.T) {
	cudart := fakeCUDA(t)
	d, err := cuda.New(cuda.WithLibrary(cudart))
	require.NoError(t, err)
	defer d.Close()
	g, err := gpu.New(d.DefaultStream())
	require.NoError(t, err)
	defer g.Close()
	kernels := func(device.Stream) (compute.Kernels, error) { return g, nil }

	cfg := small(t)
	cfg.Steps = 12
	cfg.Limit = cfg.UpperBoundBytes()
	free, err := Train(d, kernels, cfg)
	require.NoError(t, err)
	require.Zero(t, free.Stats.SwapsOut)

	cfg.Limit = free.Stats.PeakDeviceBytes / 2
	rep, err := Train(d, kernels, cfg)
	require.NoError(t, err)
	requireSameBits(t, free.Losses(), rep.Losses())
	assert.Positive(t, rep.Stats.SwappedOutBytes)
	assert.LessOrEqual(t, rep.Stats.PeakDeviceBytes, cfg.Limit)
	ls := rep.Losses()
	assert.Less(t, ls[len(ls)-1], ls[0], "the loss must fall: %v", ls)
}

// fakeCUDA builds the fake libcudart of device/cuda's tests and package
// gpu's fake libnvrtc, libcuda and libcublas, points gpu's environment at
// the latter and returns the former's path. It skips without a C compiler.
func fakeCUDA(t *testing.T) string {
	t.Helper()
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "cc"
	}
	if _, err := exec.LookPath(cc); err != nil {
		t.Skipf("no C compiler (%s) to build the fake libraries: %v", cc, err)
	}
	srcs := []string{filepath.Join("..", "..", "device", "cuda", "testdata", "fakecudart.c"), filepath.Join("gpu", "testdata", "fakegpu.c")}
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
	return cudart
}

// TestFakeCUDARank runs the command's rank path on --device cuda over the
// fake libraries: one rank, the in-process channel (no NCCL), the rank's
// goroutine on a thread of its own with its GPU's context current.
func TestFakeCUDARank(t *testing.T) {
	t.Setenv(cuda.EnvLibrary, fakeCUDA(t))
	res, out := runCommand(t, append(smallArgs(256), "--device", "cuda", "--ranks", "1", "--rank-channel", "local", "--steps", "10", "--verify", "--quiet")...)
	assert.Contains(t, out, "kept as they are (one rank)")
	c := res.check()
	assert.True(t, c.Verified)
	assert.True(t, c.WithinLimit)
	require.NotNil(t, res.Ref)
	requireSameBits(t, res.Ref.Losses(), res.Limited[0].Losses())
	assert.Positive(t, res.Limited[0].Stats.SwappedOutBytes)
}

package main

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/device/cuda"
	"github.com/chameleon-go/chameleon/replay"
)

// writeGzipTrace writes a one-op trace whose tensor and op sizes are given.
func writeGzipTrace(t *testing.T, bytesField, mem string) string {
	t.Helper()
	lines := []string{
		`{"type":"header","format":"optrace/v1","model":"m"}`,
		`{"type":"tensor","id":0,"bytes":` + bytesField + `,"dtype":"float32","shape":[4],"kind":"act","ptr":1}`,
		`{"type":"op","iter":0,"seq":0,"name":"aten::mm","phase":"fwd","in":[],"out":[0],"mem":` + mem + `}`,
		`{"type":"iter_end","iter":0,"ops":1}`,
		`{"type":"footer"}`,
	}
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	_, err := zw.Write([]byte(strings.Join(lines, "\n") + "\n"))
	require.NoError(t, err)
	require.NoError(t, zw.Close())
	path := filepath.Join(t.TempDir(), "sizes.jsonl.gz")
	require.NoError(t, os.WriteFile(path, b.Bytes(), 0o644))
	return path
}

// Impossible sizes end the replay with an error naming the file and line,
// never a panic or the runtime's fatal out of memory.
func TestReplayRefusesImpossibleSizes(t *testing.T) {
	tests := []struct {
		name, bytes, mem string
		args             []string
		want             []string
	}{
		{name: "tensor of MaxInt64 bytes", bytes: "9223372036854775807", mem: "1024", args: []string{"--scale", "1"},
			want: []string{"sizes.jsonl.gz:2", `field "bytes"`}},
		{name: "mem of 1e18", bytes: "1024", mem: "1000000000000000000",
			want: []string{"sizes.jsonl.gz:3", `field "mem"`}},
		{name: "tensor larger than the device", bytes: "4398046511104", mem: "1048576", args: []string{"--scale", "1"},
			want: []string{"tensor 0 (4398046511104 bytes, declared at sizes.jsonl.gz:2)", "larger than the device limit"}},
		{name: "peak larger than the machine", bytes: "1024", mem: "4398046511104", args: []string{"--scale", "1"},
			want: []string{"of the peak of 4398046511104 bytes recorded at", "sizes.jsonl.gz:3", "more than this machine can allocate"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeGzipTrace(t, tt.bytes, tt.mem)
			var out, errb bytes.Buffer
			code := runMain(append([]string{"replay", "--trace", path, "--quiet"}, tt.args...), &out, &errb)
			assert.NotEqual(t, 0, code)
			for _, w := range tt.want {
				assert.Contains(t, errb.String(), w)
			}
		})
	}
}

// timedReplay runs replay --timing on the bundled trace at a large scale
// and decodes its report.
func timedReplay(t *testing.T, extra ...string) (map[string]any, string) {
	t.Helper()
	var out, errb bytes.Buffer
	args := append([]string{"replay", "--trace", bundled, "--timing", "--scale", "1024", "--rounds", "3", "--json"}, extra...)
	require.Equal(t, 0, runMain(args, &out, &errb), errb.String())
	var rep map[string]any
	require.NoError(t, json.Unmarshal(out.Bytes(), &rep))
	return rep, errb.String()
}

// replay --timing on the host backend: every iteration has its measured
// step and the kernels alone, a STABLE one the simulator's step too; a
// progress line per iteration says so on stderr. No time is asserted
// beyond being there.
func TestReplayTiming(t *testing.T) {
	rep, progress := timedReplay(t)
	assert.Equal(t, true, rep["timing"])
	assert.Zero(t, rep["verified_uses"], "no bytes checked by default")
	per := rep["per_iteration"].([]any)
	require.Len(t, per, 9)
	stable := 0
	for i, p := range per {
		x := p.(map[string]any)
		assert.Positive(t, x["measured_ms"], "iteration %d", i)
		assert.Positive(t, x["unlimited_ms"], "iteration %d", i)
		assert.Equal(t, "estimated", x["op_times"])
		if x["stage"] == "STABLE" {
			stable++
			assert.Positive(t, x["simulated_ms"], "iteration %d", i)
		}
	}
	assert.Positive(t, stable)
	st := rep["stable"].(map[string]any)
	assert.Positive(t, st["measured_ms"])
	assert.Positive(t, st["simulated_ms"])
	assert.Equal(t, 9, strings.Count(progress, " measured="), progress)
	assert.Equal(t, 3, strings.Count(progress, " alone: "), progress)
}

// --verify checks the sampled storages' bytes in a timed replay.
func TestReplayTimingVerify(t *testing.T) {
	rep, _ := timedReplay(t, "--verify", "--quiet")
	assert.EqualValues(t, replay.DefaultVerifyEvery, rep["verify_every"])
	assert.Positive(t, rep["verified_uses"])
	assert.Zero(t, rep["failed_uses"])
}

// The timing flags are checked before the trace is read.
func TestReplayTimingFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--verify"}, 2, "--verify samples the bytes a timed replay checks: it needs --timing"},
		{[]string{"--timing", "--kernels", "no-such.kernels.json"}, 1, "--kernels: open no-such.kernels.json"},
	} {
		var out, errb bytes.Buffer
		code := runMain(append([]string{"replay", "--trace", "no-such-trace.jsonl", "--quiet"}, c.args...), &out, &errb)
		assert.Equal(t, c.code, code, errb.String())
		assert.Contains(t, errb.String(), c.want)
	}
}

// TestRealReplayTiming needs a GPU: it runs only when CHAMELEON_CUDART
// points at libcudart (from cmd/chameleon, with the binary of
// CGO_ENABLED=0 go test -c -o ../../bin/chameleon.test ./cmd/chameleon):
//
//	CHAMELEON_CUDART=/usr/local/cuda/lib64/libcudart.so.13 ../../bin/chameleon.test -test.run RealReplayTiming -test.v
//
// The bundled trace at full size, each op the spin kernel on the Engine's
// compute stream: every iteration measured, the STABLE ones simulated,
// the sampled bytes intact. It logs the figures and asserts no time.
func TestRealReplayTiming(t *testing.T) {
	lib := os.Getenv(cuda.EnvLibrary)
	if lib == "" {
		t.Skipf("set %s to libcudart to run on a GPU", cuda.EnvLibrary)
	}
	var out, errb bytes.Buffer
	args := []string{"replay", "--device", "cuda", "--trace", bundled, "--timing", "--verify", "--rounds", "3", "--json"}
	require.Equal(t, 0, runMain(args, &out, &errb), errb.String())
	t.Log(errb.String())
	var rep struct{ replay.Report }
	require.NoError(t, json.Unmarshal(out.Bytes(), &rep))
	assert.EqualValues(t, 1, rep.Scale, "full size by default under --timing")
	assert.Positive(t, rep.VerifiedUses)
	assert.Zero(t, rep.FailedUses, rep.Failures)
	require.NotNil(t, rep.Stable)
	for _, x := range rep.PerIteration {
		assert.Positive(t, x.MeasuredMS)
		assert.Positive(t, x.UnlimitedMS)
		if x.Stage == "STABLE" {
			assert.Positive(t, x.SimulatedMS)
		}
	}
	t.Logf("STABLE: unlimited %.2f ms, measured %.2f ms, simulated %.2f ms, forced evictions %d",
		rep.Stable.UnlimitedMS, rep.Stable.MeasuredMS, rep.Stable.SimulatedMS, rep.Stable.Evictions)
}

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
	"github.com/chameleon-go/chameleon/seq"
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
	checkSwappedBytes(t, rep)
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

// A trace of fewer iterations than a policy needs (the bundled one has 3;
// WARMUP and GEN_POLICY take 5 + 3) is repeated, unless --rounds is given,
// until a policy is planned and a whole round runs under it: the default
// replay shows a plan made and used, and says why it ran 12 iterations.
func TestReplayDefaultRounds(t *testing.T) {
	var out, errb bytes.Buffer
	require.Equal(t, 0, runMain([]string{"replay", "--trace", bundled, "--quiet"}, &out, &errb), errb.String())
	assert.Contains(t, errb.String(), "the trace has 3 iterations; replaying them 4 times so that a policy is planned (--rounds to choose)\n")
	assert.Contains(t, out.String(), ": 12 iterations (the trace's 3, 4 rounds) at scale")
	assert.Regexp(t, `policies planned [1-9]`, out.String())
	assert.Contains(t, out.String(), "GEN_POLICY STABLE STABLE STABLE STABLE\n")

	assert.NotContains(t, out.String(), "no policy ran")

	// --rounds given: as many as it says, and the report says why no
	// policy ran and what to pass.
	out.Reset()
	errb.Reset()
	require.Equal(t, 0, runMain([]string{"replay", "--trace", bundled, "--quiet", "--rounds", "1"}, &out, &errb), errb.String())
	assert.NotContains(t, errb.String(), "replaying them")
	assert.Contains(t, out.String(), ": 3 iterations at scale")
	assert.Contains(t, out.String(), "\nno policy ran: the Engine plans one after --m 5 iterations of one sequence in WARMUP and --n 3 in GEN_POLICY")
	assert.Contains(t, out.String(), "--rounds 4 repeats the trace's 3 enough\n")

	for _, c := range []struct{ n, m, gen, want int }{
		{3, 5, 3, 4}, {1, 5, 3, 9}, {8, 5, 3, 2}, {9, 5, 3, 0}, {20, 5, 3, 0}, {3, 1, 0, 0}, {1, 1, 0, 2}, {0, 5, 3, 0},
	} {
		cfg := seq.DefaultConfig()
		cfg.M, cfg.N = c.m, c.gen
		assert.Equal(t, c.want, roundsToPlan(c.n, cfg), "%d iterations, m %d, n %d", c.n, c.m, c.gen)
	}
}

// Each iteration's swapped_bytes are the bytes it copied out to the host,
// forced evictions included, as the run's are: they sum to the run's, and
// a WARMUP iteration that evicted (no policy yet) has some. TestReplayTiming
// checks the timed replay's the same way.
func TestReplaySwappedBytesPerIteration(t *testing.T) {
	var out, errb bytes.Buffer
	require.Equal(t, 0, runMain([]string{"replay", "--trace", bundled, "--quiet", "--rounds", "1", "--json"}, &out, &errb), errb.String())
	var rep map[string]any
	require.NoError(t, json.Unmarshal(out.Bytes(), &rep))
	checkSwappedBytes(t, rep)
}

// checkSwappedBytes checks a replay's --json report: its iterations'
// swapped_bytes sum to its own, and every iteration that evicted swapped
// some (there must be one).
func checkSwappedBytes(t *testing.T, rep map[string]any) {
	t.Helper()
	var sum, evicted float64
	for _, p := range rep["per_iteration"].([]any) {
		x := p.(map[string]any)
		sum += x["swapped_bytes"].(float64)
		if x["evictions"].(float64) > 0 {
			evicted++
			assert.Positive(t, x["swapped_bytes"], "an iteration that evicted: %v", x)
		}
	}
	assert.Positive(t, evicted, "no iteration evicted: the check needs one")
	assert.Equal(t, rep["swapped_bytes"], sum, "the iterations' swapped bytes against the run's")
}

package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/trace"
)

func profileTrace(t *testing.T) string {
	p, err := filepath.Abs(filepath.Join("..", "..", "testdata", "llama4-small.jsonl.gz"))
	require.NoError(t, err)
	_, err = os.Stat(p)
	require.NoError(t, err, "bundled test trace")
	return p
}

func TestProfileJSON(t *testing.T) {
	var stdout, stderr bytes.Buffer
	path := profileTrace(t)
	code := runMain([]string{"profile", "--trace", path, "--iter", "1", "--groups", "4", "--json"}, &stdout, &stderr)
	require.Equal(t, 0, code, stderr.String())
	var rep map[string]any
	dec := json.NewDecoder(&stdout)
	require.NoError(t, dec.Decode(&rep))
	assert.False(t, dec.More(), "exactly one JSON object")
	for _, k := range []string{"trace", "iter", "ops", "iteration_ms", "peak_bytes_recorded", "peak_bytes_model", "max_op_error_pct", "groups"} {
		assert.Contains(t, rep, k)
	}
	assert.Equal(t, path, rep["trace"], "the trace as given, as every command reports it")
	assert.EqualValues(t, 1, rep["iter"])
	assert.EqualValues(t, 994, rep["ops"])
	rec, mod := rep["peak_bytes_recorded"].(float64), rep["peak_bytes_model"].(float64)
	assert.InEpsilon(t, rec, mod, 0.02, "model peak within 2%")
	assert.Less(t, rep["max_op_error_pct"].(float64), 5.0)

	groups := rep["groups"].([]any)
	perPhase := map[string]int{}
	next := 0.0
	var est, meas float64
	for _, g := range groups {
		g := g.(map[string]any)
		perPhase[g["phase"].(string)]++
		assert.Equal(t, next, g["first_op"], "groups are consecutive")
		assert.Equal(t, g["last_op"].(float64)-g["first_op"].(float64)+1, g["ops"])
		next = g["last_op"].(float64) + 1
		est += g["estimated_ms"].(float64)
		meas += g["measured_ms"].(float64)
		assert.Positive(t, g["peak_bytes"].(float64))
	}
	assert.Equal(t, 994.0, next, "groups cover the iteration")
	assert.LessOrEqual(t, perPhase["fwd"], 4)
	assert.LessOrEqual(t, perPhase["bwd"], 4)
	it := rep["iteration_ms"].(float64)
	assert.InDelta(t, it, est, 1e-6*it, "estimates sum to the iteration time")
	assert.InDelta(t, it, meas, 1e-6*it, "measured shares sum to the iteration time")
}

func TestProfileTable(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := runMain([]string{"profile", "--trace", profileTrace(t)}, &stdout, &stderr)
	require.Equal(t, 0, code, stderr.String())
	assert.Contains(t, stdout.String(), "peak: recorded")
	assert.Contains(t, stdout.String(), "measured ms")
}

func TestProfileErrorsNameTheFlag(t *testing.T) {
	tests := []struct {
		give []string
		want string
	}{
		{give: []string{"profile"}, want: "--trace"},
		{give: []string{"profile", "--trace", "/nonexistent.jsonl.gz"}, want: "--trace"},
		{give: []string{"profile", "--trace", "TRACE", "--iter", "99"}, want: "--iter"},
		{give: []string{"profile", "--trace", "TRACE", "--groups", "0"}, want: "--groups"},
		{give: []string{"profile", "--iter", "x"}, want: "-iter"},
		{give: []string{"profile", "--bogus"}, want: "bogus"},
	}
	for _, tt := range tests {
		args := append([]string(nil), tt.give...)
		for i, a := range args {
			if a == "TRACE" {
				args[i] = profileTrace(t)
			}
		}
		var stdout, stderr bytes.Buffer
		code := runMain(args, &stdout, &stderr)
		assert.NotEqual(t, 0, code, "%v", tt.give)
		assert.Contains(t, stderr.String(), tt.want, "%v", tt.give)
		assert.Empty(t, stdout.String(), "%v", tt.give)
	}
}

// writeKernels writes an optrace-kernels file for iteration k of the
// bundled trace whose kernel time of op i is us(i).
func writeKernels(t *testing.T, k int, us func(i int) float64) string {
	tr, err := trace.ReadFile(profileTrace(t))
	require.NoError(t, err)
	doc := map[string]any{"format": trace.FormatKernels, "model": "llama", "iteration_ms": 1.0, "kernel_ms_total": 1.0}
	var ops []map[string]any
	for i, op := range tr.Iterations[k].Ops {
		ops = append(ops, map[string]any{"seq": i, "name": op.Name, "overload": op.Overload, "kernel_us": us(i)})
	}
	doc["ops"] = ops
	b, err := json.Marshal(doc)
	require.NoError(t, err)
	p := filepath.Join(t.TempDir(), "k.kernels.json")
	require.NoError(t, os.WriteFile(p, b, 0o644))
	return p
}

func TestProfileTimeBaseAndGroups(t *testing.T) {
	run := func(args ...string) (map[string]any, string) {
		var stdout, stderr bytes.Buffer
		code := runMain(append([]string{"profile", "--trace", profileTrace(t), "--json"}, args...), &stdout, &stderr)
		require.Equal(t, 0, code, stderr.String())
		var rep map[string]any
		require.NoError(t, json.Unmarshal(stdout.Bytes(), &rep))
		return rep, stderr.String()
	}
	rep, stderr := run("--groups", "16")
	assert.Equal(t, "estimated", rep["time_base"])
	assert.Contains(t, stderr, "time base: estimated")
	assert.EqualValues(t, 16, rep["groups_asked"])
	// llama4-small has 4 layers: the note says why 16 per phase became 13.
	assert.Equal(t, "13 groups: 6 forward, 6 backward, 1 other (optimizer step); --groups 16 is per forward and backward; "+
		"the forward has 6 discovered layers with its prologue and epilogue, fewer than 16; "+
		"the backward has 6 discovered layers with its prologue and epilogue, fewer than 16", rep["groups_note"])
	assert.Len(t, rep["groups"], 13)

	// Kernel times: group estimates follow them (here: every op 1 us but
	// the ops of the first group, 0), scaled to the iteration.
	rep, _ = run("--boundaries", "100,200")
	assert.Contains(t, rep["groups_note"], "set by --boundaries")
	gs := rep["groups"].([]any)
	assert.EqualValues(t, 100, gs[1].(map[string]any)["first_op"])
	assert.EqualValues(t, 200, gs[2].(map[string]any)["first_op"])
	kf := writeKernels(t, 0, func(i int) float64 { return float64(min(1, i/100)) })
	rep, stderr = run("--boundaries", "100,200", "--kernels", kf)
	assert.Equal(t, "kernels", rep["time_base"])
	assert.Contains(t, stderr, "time base: kernels")
	gs = rep["groups"].([]any)
	assert.Zero(t, gs[0].(map[string]any)["estimated_ms"])
	assert.InDelta(t, rep["iteration_ms"].(float64)*100/894, gs[1].(map[string]any)["estimated_ms"], 1e-6)
}

func TestKernelsFlagErrors(t *testing.T) {
	short := writeKernels(t, 0, func(int) float64 { return 1 })
	b, err := os.ReadFile(short)
	require.NoError(t, err)
	var doc map[string]any
	require.NoError(t, json.Unmarshal(b, &doc))
	doc["ops"] = doc["ops"].([]any)[:10]
	b, _ = json.Marshal(doc)
	require.NoError(t, os.WriteFile(short, b, 0o644))
	for _, tt := range []struct{ cmd, kf, want string }{
		{"profile", short, "10 measured ops, the iteration has 994"},
		{"plan", short, "10 measured ops, the iteration has 994"},
		{"profile", "/nonexistent.kernels.json", "--kernels"},
	} {
		var stdout, stderr bytes.Buffer
		args := []string{tt.cmd, "--trace", profileTrace(t), "--kernels", tt.kf, "--iter", "0"}
		if tt.cmd == "plan" {
			args = append(args, "--limit", "90%")
		}
		code := runMain(args, &stdout, &stderr)
		assert.NotEqual(t, 0, code, "%v", args)
		assert.Contains(t, stderr.String(), tt.want, "%v", args)
	}
}

package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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

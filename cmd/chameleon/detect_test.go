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

const smallTrace = "../../testdata/llama4-small.jsonl.gz"

func TestDetectJSON(t *testing.T) {
	var out, errb bytes.Buffer
	code := runMain([]string{"detect", "--trace", smallTrace, "--json", "--rounds", "3"}, &out, &errb)
	require.Equal(t, 0, code, errb.String())
	var rep map[string]any
	require.NoError(t, json.Unmarshal(out.Bytes(), &rep), "exactly one JSON object")
	assert.Equal(t, smallTrace, rep["trace"])
	its := rep["iterations"].([]any)
	require.Len(t, its, 9)
	first := its[0].(map[string]any)
	assert.Equal(t, 0.0, first["iter"])
	assert.Equal(t, 994.0, first["ops"])
	assert.Equal(t, "WARMUP", first["stage"])
	assert.Equal(t, false, first["changed"])
	for _, k := range []string{"similarity", "length_delta", "memory_delta"} {
		assert.Contains(t, first, k)
	}
	assert.Equal(t, "STABLE", its[8].(map[string]any)["stage"])
	assert.Contains(t, rep, "detect_ns_per_iter")
}

func TestDetectTable(t *testing.T) {
	var out, errb bytes.Buffer
	require.Equal(t, 0, runMain([]string{"detect", "--trace", smallTrace}, &out, &errb), errb.String())
	assert.Contains(t, out.String(), "WARMUP")
	assert.Contains(t, out.String(), "similarity")
}

func TestDetectDebugLog(t *testing.T) {
	t.Setenv("CHAMELEON_DEBUG", "seqchange")
	var out, errb bytes.Buffer
	require.Equal(t, 0, runMain([]string{"detect", "--trace", smallTrace, "--json"}, &out, &errb))
	assert.Contains(t, errb.String(), "msg=seqchange")
	assert.Contains(t, errb.String(), "hash=")
}

func TestDetectErrors(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.jsonl")
	require.NoError(t, os.WriteFile(bad, []byte(`{"type":"header","format":"optrace/v1"}`+"\n"+`{"type":"tensor","id":"x"}`+"\n"), 0o644))
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"detect"}, "--trace is required"},
		{[]string{"detect", "--trace", "nope.jsonl"}, "nope.jsonl"},
		{[]string{"detect", "--trace", bad}, `bad.jsonl:2: field "id"`},
		{[]string{"detect", "--trace", smallTrace, "--m", "0"}, "m=0"},
		{[]string{"nosuch"}, "unknown command"},
	}
	for _, tt := range tests {
		var out, errb bytes.Buffer
		assert.NotEqual(t, 0, runMain(tt.args, &out, &errb))
		assert.Contains(t, errb.String(), tt.want)
	}
}

// The commands read what PyTorch users record: an Execution Trace with the
// Kineto profile of the same step.
func TestPyTorchImportThroughCommands(t *testing.T) {
	et := "../../trace/pytorch/testdata/llama4-small.et.json.gz"
	kin := "../../trace/pytorch/testdata/llama4-small.kineto.json.gz"
	for _, args := range [][]string{
		{"detect", "--trace", et, "--kineto", kin, "--json"},
		{"profile", "--trace", et, "--kineto", kin, "--iter", "0", "--json"},
		{"plan", "--trace", et, "--kineto", kin, "--iter", "0", "--limit", "90%", "--json"},
	} {
		var out, errb bytes.Buffer
		require.Equal(t, 0, runMain(args, &out, &errb), "%v: %s", args, errb.String())
		var rep map[string]any
		require.NoError(t, json.Unmarshal(out.Bytes(), &rep), args[0])
		switch args[0] {
		case "detect":
			assert.Len(t, rep["iterations"], 1)
		case "profile":
			assert.Equal(t, 882.0, rep["ops"])
		case "plan":
			assert.Equal(t, true, rep["feasible"])
			assert.NotEmpty(t, rep["swaps"])
		}
	}
	var out, errb bytes.Buffer
	assert.NotEqual(t, 0, runMain([]string{"detect", "--trace", smallTrace, "--kineto", kin}, &out, &errb))
	assert.NotEmpty(t, errb.String())
}

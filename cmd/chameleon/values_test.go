package main

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Hostile inputs the commands refuse with a message that says what is
// wrong and where, made at run time.

// writeOptrace writes a trace of three one-op iterations over tensor 0 of
// tensorBytes bytes; opExtra and endExtra are added to each op and
// iter_end line (",\"mem\":0"), and an empty tensorBytes declares no
// tensor and lets the ops use none.
func writeOptrace(t *testing.T, name, tensorBytes, opExtra, endExtra string) string {
	t.Helper()
	lines := []string{`{"type":"header","format":"optrace/v1","model":"m"}`}
	out := ""
	if tensorBytes != "" {
		lines = append(lines, `{"type":"tensor","id":0,"bytes":`+tensorBytes+`,"dtype":"float32","shape":[4],"kind":"act"}`)
		out = `,"out":[0]`
	}
	for i := range 3 {
		lines = append(lines,
			fmt.Sprintf(`{"type":"op","iter":%d,"seq":0,"name":"aten::mm","phase":"fwd"%s%s}`, i, out, opExtra),
			fmt.Sprintf(`{"type":"iter_end","iter":%d,"ops":1%s}`, i, endExtra))
	}
	path := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(path, []byte(strings.Join(append(lines, `{"type":"footer"}`), "\n")+"\n"), 0o644))
	return path
}

func runCmd(args ...string) (code int, stdout, stderr string) {
	var out, errb bytes.Buffer
	code = runMain(args, &out, &errb)
	return code, out.String(), errb.String()
}

// A trace that allocates nothing has nothing to plan: plan and replay say
// so naming the file, not "host: capacity 0: device: invalid value" (the
// replay's host device made with a limit of 0 bytes).
func TestNothingToPlan(t *testing.T) {
	zero := writeOptrace(t, "zero.jsonl", "0", `,"mem":0`, `,"peak_bytes":0`)
	none := writeOptrace(t, "none.jsonl", "", "", "")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"plan", "--trace", zero, "--limit", "80%"}, zero + " allocates no bytes (the one tensor its ops use is of 0 bytes): there is nothing to plan"},
		{[]string{"plan", "--trace", zero, "--limit", "1GiB"}, zero + " allocates no bytes"},
		{[]string{"replay", "--trace", zero, "--quiet"}, zero + " allocates no bytes (the one tensor its ops use is of 0 bytes): there is nothing to plan"},
		{[]string{"replay", "--trace", none, "--quiet", "--limit", "1GiB"}, none + " allocates no bytes (its ops use no tensors): there is nothing to plan"},
	} {
		code, _, stderr := runCmd(c.args...)
		assert.Equal(t, 1, code, "%v: %s", c.args, stderr)
		assert.Contains(t, stderr, c.want, "%v", c.args)
		assert.NotContains(t, stderr, "capacity 0", "%v", c.args)
		assert.NotContains(t, stderr, "invalid value", "%v", c.args)
		assert.NotContains(t, stderr, "replaying them", "%v: said before the work", c.args)
	}
}

// A share of a peak of 0 bytes is no limit: the commands say that the
// trace's peak is 0 bytes, not "limit 0 bytes: want a positive limit"; a
// share that comes to 0 bytes at the replay's scale says to lower it.
func TestZeroPeakIsNoLimit(t *testing.T) {
	zeroPeak := writeOptrace(t, "zeropeak.jsonl", "1048576", `,"mem":0`, "")
	noMem := writeOptrace(t, "nomem.jsonl", "1048576", "", "")
	tiny := writeOptrace(t, "tiny.jsonl", "500", `,"mem":500`, "")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"plan", "--trace", zeroPeak, "--limit", "80%"}, "--limit 80%: the peak of iteration 1 of zeropeak.jsonl is 0 bytes (recorded curve), so no share of it is a limit: give the limit in bytes (--limit 12GiB)"},
		{[]string{"plan", "--trace", tiny, "--limit", "0.1%"}, "--limit 0.1% of the peak of 500 bytes of iteration 1 of tiny.jsonl is under one byte"},
		{[]string{"replay", "--trace", zeroPeak, "--quiet"}, "--limit 80%: the peak recorded in " + zeroPeak + " is 0 bytes (every op's mem is 0), so no share of it is a limit: give the limit in bytes (--limit 12GiB)"},
		{[]string{"replay", "--trace", noMem, "--quiet"}, "--limit 80%: " + noMem + " records no allocated bytes (no op has mem), so it has no peak to take a share of"},
		{[]string{"replay", "--trace", tiny, "--quiet"}, "--limit 80% of the peak of 500 bytes recorded in " + tiny + " is 0 bytes at scale 1/1024: lower --scale"},
		{[]string{"replay", "--trace", tiny, "--quiet", "--limit", "100B"}, "--limit 100B is 0 bytes at scale 1/1024: lower --scale"},
	} {
		code, _, stderr := runCmd(c.args...)
		assert.Equal(t, 1, code, "%v: %s", c.args, stderr)
		assert.Contains(t, stderr, c.want, "%v", c.args)
		assert.NotContains(t, stderr, "want a positive limit", "%v", c.args)
		assert.NotContains(t, stderr, "capacity 0", "%v", c.args)
	}
	// A limit in bytes plans.
	code, _, stderr := runCmd("plan", "--trace", zeroPeak, "--limit", "1MiB")
	assert.Equal(t, 0, code, stderr)
}

// A --policy-file the replay could not save at its end is refused before
// the trace is read, and nothing is created.
func TestReplayPolicyFileChecked(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "no-such-dir", "p.json")
	notDir := filepath.Join(dir, "file")
	require.NoError(t, os.WriteFile(notDir, nil, 0o644))
	for _, c := range []struct {
		path, want string
	}{
		{missing, "--policy-file " + missing + ": directory " + filepath.Dir(missing) + " does not exist"},
		{dir, "--policy-file " + dir + ": a directory"},
		{filepath.Join(notDir, "p.json"), "is not a directory"},
	} {
		// The trace does not exist either: the flag is checked first.
		code, _, stderr := runCmd("replay", "--trace", filepath.Join(dir, "no-such-trace.jsonl"), "--quiet", "--policy-file", c.path)
		assert.Equal(t, 2, code, stderr)
		assert.Contains(t, stderr, c.want)
		assert.NotContains(t, stderr, "no-such-trace")
	}
	_, err := os.Stat(filepath.Dir(missing))
	assert.ErrorIs(t, err, os.ErrNotExist, "the check created the directory")
	if os.Geteuid() != 0 { // root writes anywhere
		ro := filepath.Join(dir, "ro")
		require.NoError(t, os.Mkdir(ro, 0o555))
		code, _, stderr := runCmd("replay", "--trace", bundled, "--quiet", "--policy-file", filepath.Join(ro, "p.json"))
		assert.Equal(t, 2, code, stderr)
		assert.Contains(t, stderr, "directory "+ro+" is not writable")
	}
	// A file in a writable directory: loaded if there, saved at the end.
	ok := filepath.Join(dir, "p.json")
	code, _, stderr := runCmd("replay", "--trace", bundled, "--quiet", "--policy-file", ok)
	require.Equal(t, 0, code, stderr)
	_, err = os.Stat(ok)
	assert.NoError(t, err, "saved")
}

// detect reads no kernel times: a --kernels file given to it is refused,
// not passed over (a truncated gzip went by with exit 0).
func TestDetectRefusesKernels(t *testing.T) {
	var zb bytes.Buffer
	zw := gzip.NewWriter(&zb)
	_, err := io.WriteString(zw, `{"format":"optrace-kernels/v1","iteration_ms":1,"ops":[{"seq":0,"name":"aten::mm","kernel_us":1}]}`)
	require.NoError(t, err)
	require.NoError(t, zw.Close())
	cut := filepath.Join(t.TempDir(), "cut.kernels.json.gz")
	require.NoError(t, os.WriteFile(cut, zb.Bytes()[:zb.Len()/2], 0o644))
	et := "../../trace/pytorch/testdata/llama4-small.et.json.gz"
	kin := "../../trace/pytorch/testdata/llama4-small.kineto.json.gz"
	for _, args := range [][]string{
		{"detect", "--trace", smallTrace, "--kernels", cut},
		{"detect", "--trace", et, "--kineto", kin, "--kernels", cut},
	} {
		code, stdout, stderr := runCmd(args...)
		assert.Equal(t, 2, code, "%v: %s", args, stderr)
		assert.Contains(t, stderr, "--kernels "+cut+": detect compares op sequences and reads no kernel times")
		assert.Empty(t, stdout)
	}
	_, _, help := runCmd("detect", "-h")
	assert.Contains(t, help, "refused: detect compares op sequences and reads no kernel times")
	// The commands that use it read it whole: a truncated gzip is an error.
	code, _, stderr := runCmd("profile", "--trace", smallTrace, "--kernels", cut, "--iter", "0")
	assert.Equal(t, 1, code, stderr)
	assert.Contains(t, stderr, "cut.kernels.json.gz")
}

// Times and costs that make nonsense are refused by every command that
// reads the trace, naming the file, the line and the field: profile printed
// "measured_ms -7.3e306".
func TestCommandsRefuseNonsenseValues(t *testing.T) {
	negWall := writeOptrace(t, "negwall.jsonl", "1048576", `,"mem":1048576`, `,"wall_ms":-7.3e306,"uninstrumented_ms":-7.3e306`)
	hugeDur := writeOptrace(t, "hugedur.jsonl", "1048576", `,"mem":1048576,"dur_us":1e308`, "")
	flops := writeOptrace(t, "flops.jsonl", "1048576", `,"mem":1048576,"flops":-1e300`, "")
	dupIter := filepath.Join(t.TempDir(), "dupiter.jsonl")
	b, err := os.ReadFile(writeOptrace(t, "x.jsonl", "1048576", `,"mem":1048576`, ""))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(dupIter, bytes.Replace(b, []byte(`"iter":2`), []byte(`"iter":0`), 2), 0o644))
	for _, c := range []struct {
		path, want string
	}{
		{negWall, `negwall.jsonl:4: field "wall_ms": negative: -7.3e+306 ms`},
		{hugeDur, `hugedur.jsonl:3: field "dur_us": 1e+308 µs, more than an hour`},
		{flops, `flops.jsonl:3: field "flops": negative: -1e+300`},
		{dupIter, `dupiter.jsonl:7: field "iter": iteration 0 after iteration 1 (line 5): indices must increase`},
	} {
		for _, args := range [][]string{
			{"profile", "--trace", c.path, "--iter", "0"},
			{"detect", "--trace", c.path},
			{"plan", "--trace", c.path, "--limit", "80%"},
			{"replay", "--trace", c.path, "--quiet"},
		} {
			code, stdout, stderr := runCmd(args...)
			assert.Equal(t, 1, code, "%v: %s", args, stderr)
			assert.Contains(t, stderr, c.want, "%v", args)
			assert.NotContains(t, stdout, "e+306", "%v", args)
		}
	}
}

// An Execution Trace whose parent links form a cycle is refused by plan,
// naming every node of the cycle.
func TestPlanRefusesParentCycle(t *testing.T) {
	zr, err := gzip.NewReader(bytes.NewReader(readFile(t, "../../trace/pytorch/testdata/llama4-small.et.json.gz")))
	require.NoError(t, err)
	et, err := io.ReadAll(zr)
	require.NoError(t, err)
	// The root (node 1, its own parent) made a child of node 9, whose
	// chain runs 9 -> 8 -> 3 -> 2 -> 1.
	root := []byte(`"id": 1, "name": "[pytorch|profiler|execution_trace|process]", "ctrl_deps": 1,`)
	require.Equal(t, 1, bytes.Count(et, root))
	et = bytes.Replace(et, root, []byte(`"id": 1, "name": "[pytorch|profiler|execution_trace|process]", "ctrl_deps": 9,`), 1)
	path := filepath.Join(t.TempDir(), "cycle.et.json")
	require.NoError(t, os.WriteFile(path, et, 0o644))
	code, _, stderr := runCmd("plan", "--trace", path, "--kineto", "../../trace/pytorch/testdata/llama4-small.kineto.json.gz", "--iter", "0", "--limit", "90%")
	assert.Equal(t, 1, code, stderr)
	assert.Contains(t, stderr, `cycle.et.json: node 1: field "ctrl_deps": parent links form a cycle of 5 nodes: 1 -> 9 -> 8 -> 3 -> 2 -> 1`)
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return b
}

package main

import (
	"bytes"
	"encoding/json"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The matrix over testdata on the host backend, one row, in each output
// form: the row is there and its figures parse.
func TestMatrixHost(t *testing.T) {
	base := []string{"matrix", "--traces", "../../testdata", "--rounds", "3", "--scale", "1024"}
	tests := []struct {
		name  string
		args  []string
		check func(t *testing.T, out string)
	}{
		{name: "text", args: []string{"--only", "llama4-small@90%"}, check: func(t *testing.T, out string) {
			assert.Contains(t, out, "timed replays on host, scale 1/1024, 3 rounds")
			var row []string
			for _, l := range strings.Split(out, "\n") {
				if f := strings.Fields(l); len(f) > 2 && f[0] == "llama4-small" && f[1] == "90%" {
					require.Nil(t, row, "one row:\n%s", out)
					row = f
				}
			}
			require.NotNil(t, row, "no llama4-small 90%% row:\n%s", out)
			require.GreaterOrEqual(t, len(row), len(matrixHeader), "%q", row)
			checkMatrixCells(t, row[2:13])
			assert.NotContains(t, out, "skipped")
		}},
		{name: "markdown", args: []string{"--only", "llama4-small@90%", "--markdown"}, check: func(t *testing.T, out string) {
			lines := strings.Split(out, "\n")
			require.GreaterOrEqual(t, len(lines), 3, out)
			assert.Equal(t, "| "+strings.Join(matrixHeader, " | ")+" |", lines[0])
			assert.Equal(t, "|"+strings.Repeat("---|", len(matrixHeader)), lines[1])
			cells := strings.Split(strings.Trim(lines[2], "| "), " | ")
			require.Len(t, cells, len(matrixHeader), lines[2])
			assert.Equal(t, []string{"llama4-small", "90%"}, cells[:2])
			checkMatrixCells(t, cells[2:13])
		}},
		{name: "json, a trace testdata lacks skipped", args: []string{"--only", "llama4-small@90%|mixtral8-eager-bf16@80%", "--json"}, check: func(t *testing.T, out string) {
			var rep map[string]any
			require.NoError(t, json.Unmarshal([]byte(out), &rep))
			assert.Equal(t, "matrix", rep["command"])
			assert.Equal(t, []any{"mixtral8-eager-bf16"}, rep["skipped"])
			var m matrixReport
			require.NoError(t, json.Unmarshal([]byte(out), &m))
			require.Len(t, m.Rows, 1)
			r := m.Rows[0]
			assert.Equal(t, "llama4-small@90%", r.Name)
			assert.Equal(t, "../../testdata/llama4-small.jsonl.gz", r.File)
			assert.Empty(t, r.Kernels)
			assert.Equal(t, int64(1024), r.Scale)
			assert.Empty(t, r.Error)
			require.Positive(t, r.StableIterations)
			assert.Positive(t, r.MeasuredMS)
			assert.Positive(t, r.SimulatedMS)
			assert.Positive(t, r.UnlimitedMS)
			assert.Positive(t, r.PlannedSwaps)
			assert.NotNil(t, r.VsSimulatedPct)
			assert.Equal(t, matrixVerdict(r), r.Verdict)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			require.Equal(t, 0, runMain(append(base, tt.args...), &out, &errb), errb.String())
			assert.Regexp(t, `(?m)^matrix \[1/1\] llama4-small@90% \(`, errb.String())
			tt.check(t, out.String())
		})
	}
}

// checkMatrixCells checks the figures of a row with STABLE iterations:
// stable, unlimited, measured, simulated, the two percentages, evictions,
// on-demand, placed, swaps, recomputes.
func checkMatrixCells(t *testing.T, c []string) {
	t.Helper()
	n, err := strconv.Atoi(c[0])
	require.NoError(t, err, "stable %q", c[0])
	assert.Positive(t, n)
	for _, ms := range c[1:4] {
		v, err := strconv.ParseFloat(ms, 64)
		if assert.NoError(t, err, "ms %q", ms) {
			assert.Positive(t, v)
		}
	}
	for _, p := range c[4:6] {
		_, err := strconv.ParseFloat(strings.TrimSuffix(p, "%"), 64)
		assert.NoError(t, err, "percent %q", p)
		assert.True(t, strings.HasSuffix(p, "%"), p)
	}
	for _, k := range []string{c[6], c[7], c[9], c[10]} {
		_, err := strconv.ParseInt(k, 10, 64)
		assert.NoError(t, err, "count %q", k)
	}
	assert.Regexp(t, `^\d+/`+strconv.Itoa(n)+`$`, c[8])
}

// The verdict: ok, or each reason a row fails it for.
func TestMatrixVerdict(t *testing.T) {
	good := matrixRow{StableIterations: 4, PlacedIterations: 4, MeasuredMS: 102, SimulatedMS: 100, PlannedSwaps: 400}
	tests := []struct {
		name string
		edit func(r *matrixRow)
		want string
	}{
		{name: "ok", edit: func(*matrixRow) {}, want: "ok"},
		{name: "faster than simulated, within 5%", edit: func(r *matrixRow) { r.MeasuredMS = 95.5 }, want: "ok"},
		{name: "failed", edit: func(r *matrixRow) { r.Error = "timed out after 2m30s" }, want: "failed: timed out after 2m30s"},
		{name: "no STABLE", edit: func(r *matrixRow) { *r = matrixRow{} }, want: "no STABLE iteration"},
		{name: "an eviction", edit: func(r *matrixRow) { r.Evictions = 1 }, want: "1 forced eviction"},
		{name: "evictions", edit: func(r *matrixRow) { r.Evictions = 3 }, want: "3 forced evictions"},
		{name: "on demand", edit: func(r *matrixRow) { r.OnDemandSwapIns = 2 }, want: "2 on-demand swap-ins"},
		{name: "on demand, dynamic, under 5%", edit: func(r *matrixRow) { r.Dynamic, r.OnDemandSwapIns = true, 20 }, want: "ok"},
		{name: "on demand, dynamic, over 5%", edit: func(r *matrixRow) { r.Dynamic, r.OnDemandSwapIns = true, 21 },
			want: "21 on-demand swap-ins > 5% of 400 planned swaps"},
		{name: "on demand, dynamic, no swap planned", edit: func(r *matrixRow) { r.Dynamic, r.OnDemandSwapIns, r.PlannedSwaps = true, 1, 0 },
			want: "1 on-demand swap-in > 5% of 0 planned swaps"},
		{name: "not placed", edit: func(r *matrixRow) { r.PlacedIterations = 3 }, want: "placed 3/4"},
		{name: "slower than simulated", edit: func(r *matrixRow) { r.MeasuredMS = 107.24 }, want: "measured +7.2% of simulated"},
		{name: "faster than simulated", edit: func(r *matrixRow) { r.MeasuredMS = 90 }, want: "measured -10.0% of simulated"},
		{name: "no simulated step", edit: func(r *matrixRow) { r.SimulatedMS = 0 }, want: "no simulated or measured step"},
		{name: "each iteration as simulated, medians apart", edit: func(r *matrixRow) { r.MeasuredMS, r.VsSimulatedPct = 120, new(1.5) }, want: "ok"},
		{name: "each iteration slower than simulated", edit: func(r *matrixRow) { r.VsSimulatedPct = new(-8.25) }, want: "measured -8.2% of simulated"},
		{name: "every reason", edit: func(r *matrixRow) { r.Evictions, r.OnDemandSwapIns, r.PlacedIterations, r.MeasuredMS = 2, 1, 0, 120 },
			want: "2 forced evictions, 1 on-demand swap-in, placed 0/4, measured +20.0% of simulated"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := good
			tt.edit(&r)
			assert.Equal(t, tt.want, matrixVerdict(r))
		})
	}
}

// fill compares each STABLE iteration with its own simulated and unlimited
// steps: two kinds of step that alternate, each run as simulated, are not
// 20% off their simulation because their medians fall on different kinds.
func TestMatrixFillPerIteration(t *testing.T) {
	type it struct {
		Stage       string  `json:"stage"`
		Unlimited   float64 `json:"unlimited_ms"`
		Measured    float64 `json:"measured_ms"`
		Simulated   float64 `json:"simulated_ms"`
		Placed      int     `json:"placed"`
		PlannedSwap int64   `json:"planned_swaps"`
	}
	per := []it{{"WARMUP", 80, 200, 0, 0, 0}, {"STABLE", 80, 101, 100, 5, 10}, {"STABLE", 100, 141, 140, 5, 10}, {"STABLE", 80, 99, 100, 5, 10},
		{"STABLE", 100, 143, 140, 5, 10}, {"STABLE", 100, 140, 140, 5, 10}}
	out, err := json.Marshal(map[string]any{"trace": "t", "stable": map[string]any{"iterations": 5, "unlimited_ms": 100, "measured_ms": 140, "simulated_ms": 100},
		"per_iteration": per})
	require.NoError(t, err)
	var r matrixRow
	require.NoError(t, r.fill(out))
	require.NotNil(t, r.VsSimulatedPct)
	assert.Equal(t, 0.7, *r.VsSimulatedPct) // 101/100, 141/140, 99/100, 143/140, 140/140: the median is 141/140
	require.NotNil(t, r.VsUnlimitedPct)
	assert.Equal(t, 40.0, *r.VsUnlimitedPct) // 1.2625, 1.41, 1.2375, 1.43, 1.4
	assert.Equal(t, 5, r.PlacedIterations)
	assert.Equal(t, int64(50), r.PlannedSwaps)
	r.Dynamic = true
	assert.Equal(t, "ok", matrixVerdict(r), "the medians alone are 40% apart")
}

// The rows: every trace's limits and its checkpointing peak, found in the
// folders given, each replay's arguments the matrix's.
func TestMatrixRows(t *testing.T) {
	seen := map[string]bool{}
	for _, tr := range matrixTraces {
		assert.False(t, seen[tr.name], "%s twice", tr.name)
		seen[tr.name] = true
		if tr.ckpt != "" {
			assert.NoError(t, checkLimit(tr.ckpt), tr.name)
		}
	}
	tests := []struct {
		name, device, only string
		scale              int64
		want               [][]string // each row: name, then its replay's arguments
		skipped            []string
	}{
		{name: "host, kernels beside the trace", device: "host", only: `^gpt2-24l@`, scale: 4096, want: [][]string{
			{"gpt2-24l@90%", "--timing", "--json", "--device", "host", "--trace", "../../testdata/gpt2-24l.jsonl.gz", "--limit", "90%", "--rounds", "4",
				"--kernels", "../../testdata/gpt2-24l.kernels.json.gz", "--scale", "4096"},
			{"gpt2-24l@80%", "--timing", "--json", "--device", "host", "--trace", "../../testdata/gpt2-24l.jsonl.gz", "--limit", "80%", "--rounds", "4",
				"--kernels", "../../testdata/gpt2-24l.kernels.json.gz", "--scale", "4096"},
			{"gpt2-24l@ckpt", "--timing", "--json", "--device", "host", "--trace", "../../testdata/gpt2-24l.jsonl.gz", "--limit", "7.08GiB", "--rounds", "4",
				"--kernels", "../../testdata/gpt2-24l.kernels.json.gz", "--scale", "4096"},
		}},
		{name: "cuda, full size, no kernels, no ckpt peak", device: "cuda", only: `llama4-small`, want: [][]string{
			{"llama4-small@90%", "--timing", "--json", "--device", "cuda", "--trace", "../../testdata/llama4-small.jsonl.gz", "--limit", "90%", "--rounds", "4"},
			{"llama4-small@80%", "--timing", "--json", "--device", "cuda", "--trace", "../../testdata/llama4-small.jsonl.gz", "--limit", "80%", "--rounds", "4"},
		}},
		{name: "absent traces skipped", device: "host", only: `llama16-bf16@ckpt|llama7b|@ckpt`, scale: 4096, skipped: []string{"llama16-bf16", "llama7b-8l-bf16", "llama7b-8l-decode"},
			want: [][]string{{"gpt2-24l@ckpt"}, {"gpt2-xl-24l@ckpt"}, {"qwen2-12l@ckpt"}, {"qwen2-7b-8l@ckpt"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := matrixConfig{device: tt.device, dirs: []string{"../../no-such-folder", "../../testdata"}, limits: []string{"90%", "80%", "ckpt"},
				rounds: 4, scale: tt.scale, only: regexp.MustCompile(tt.only)}
			rows, skipped := matrixRows(cfg)
			assert.Equal(t, tt.skipped, skipped)
			require.Len(t, rows, len(tt.want))
			for i, r := range rows {
				assert.Equal(t, tt.want[i][0], r.Name)
				if len(tt.want[i]) > 1 {
					assert.Equal(t, tt.want[i][1:], r.replayArgs(cfg), r.Name)
				}
			}
		})
	}
}

// A row past its --timeout stops and is a row with its error; the matrix
// exits 0 unless --strict.
func TestMatrixTimeout(t *testing.T) {
	for _, strict := range []bool{false, true} {
		args := []string{"matrix", "--traces", "../../testdata", "--only", "llama4-small@90%", "--rounds", "3", "--scale", "1024", "--timeout", "1ms", "--json"}
		want := 0
		if strict {
			args, want = append(args, "--strict"), 1
		}
		var out, errb bytes.Buffer
		require.Equal(t, want, runMain(args, &out, &errb), errb.String())
		var m matrixReport
		require.NoError(t, json.Unmarshal(out.Bytes(), &m))
		require.Len(t, m.Rows, 1)
		assert.Equal(t, "timed out after 1ms", m.Rows[0].Error)
		assert.Equal(t, "failed: timed out after 1ms", m.Rows[0].Verdict)
		if strict {
			assert.Contains(t, errb.String(), "--strict: 1 of 1 rows not ok")
		}
	}
}

// -h prints the usage and exits 0; every bad command line exits 2 before
// any replay runs.
func TestMatrixBadFlags(t *testing.T) {
	var out, errb bytes.Buffer
	require.Equal(t, 0, runMain([]string{"matrix", "-h"}, &out, &errb))
	assert.Contains(t, errb.String(), "usage: chameleon matrix")
	for _, f := range []string{"-device", "-traces", "-rounds", "-scale", "-only", "-limits", "-timeout", "-json", "-markdown", "-strict"} {
		assert.Regexp(t, `\n  `+f+`\b`, errb.String(), f)
	}
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--bogus"}, "flag provided but not defined: -bogus"},
		{[]string{"extra"}, `unexpected argument "extra"`},
		{[]string{"--device", "tpu"}, `--device "tpu"`},
		{[]string{"--rounds", "0"}, "--rounds 0"},
		{[]string{"--rounds", "x"}, "invalid value"},
		{[]string{"--scale", "0"}, "--scale 0"},
		{[]string{"--scale", "-4"}, "--scale -4"},
		{[]string{"--timeout", "0s"}, "--timeout 0s"},
		{[]string{"--timeout", "150"}, "invalid value"},
		{[]string{"--only", "("}, "--only"},
		{[]string{"--only", "no-such-trace"}, "selects no row"},
		{[]string{"--limits", "90"}, "did you mean 90%?"},
		{[]string{"--limits", "90%,ckpt,120%"}, "above 100%"},
		{[]string{"--limits", " , "}, "--limits"},
		{[]string{"--traces", ","}, "--traces"},
		{[]string{"--json", "--markdown"}, "pick one"},
	}
	for _, tt := range tests {
		out.Reset()
		errb.Reset()
		args := append([]string{"matrix", "--traces", "../../testdata"}, tt.args...)
		assert.Equal(t, 2, runMain(args, &out, &errb), "%v: %s", tt.args, errb.String())
		assert.Contains(t, errb.String(), tt.want, "%v", tt.args)
		assert.NotRegexp(t, `(?m)^matrix \[\d`, errb.String(), "%v: a row ran", tt.args)
		assert.Empty(t, out.String(), "%v", tt.args)
	}
	// Every selected trace missing is a failure of the work, not of the
	// command line.
	out.Reset()
	errb.Reset()
	assert.Equal(t, 1, runMain([]string{"matrix", "--traces", t.TempDir(), "--only", "llama16-bf16@80%"}, &out, &errb))
	assert.Contains(t, errb.String(), "none of the traces selected (llama16-bf16)")
}

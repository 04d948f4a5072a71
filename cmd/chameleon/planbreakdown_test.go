package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// plan lists its largest swaps and the peak by tensor kind before and
// after the plan, in the text and in --json, and --perfetto carries a
// memory counter track.
func TestPlanLargestSwapsAndBreakdown(t *testing.T) {
	var out, errb bytes.Buffer
	require.Equal(t, 0, runMain([]string{"plan", "--trace", bundled, "--limit", "80%"}, &out, &errb), errb.String())
	text := out.String()
	assert.Regexp(t, `largest swaps \(10 of \d+, by bytes\):`, text)
	assert.Contains(t, text, "model.embed_tokens", "a swap named by its module")
	assert.Regexp(t, `peak before: \d+\.\d\d GiB at op \d+: params [\d.]+ GiB, optimizer state [\d.]+ GiB, activations [\d.]+ GiB, gradients [\d.]+ GiB, inputs [\d.]+ GiB, other`, text)
	assert.Contains(t, text, "peak after:  ")
	assert.Regexp(t, `copied in a step, by kind:  params [\d.]+ GiB, optimizer state [\d.]+ GiB, activations [\d.]+ GiB, gradients [\d.]+ GiB, inputs [\d.]+ GiB`, text)
	assert.Contains(t, text, "copied out a step, by kind: params ")
	assert.Regexp(t, `waits for copies, by kind: params [\d.]+ ms, optimizer state [\d.]+ ms, activations [\d.]+ ms, gradients [\d.]+ ms, inputs [\d.]+ ms`, text)
	assert.Regexp(t, `waits for copies: [\d.]+ ms: [\d.]+ ms for copies out to end before their memory counts free, [\d.]+ ms for copies back, [\d.]+ ms for the last step's copies out where the step takes their memory; [\d.]+ ms of it with none of the copies waited for on the link`, text)

	dir := t.TempDir()
	pf := filepath.Join(dir, "tl.json")
	out.Reset()
	require.Equal(t, 0, runMain([]string{"plan", "--trace", bundled, "--limit", "80%", "--json", "--perfetto", pf}, &out, &errb), errb.String())
	var rep struct {
		PeakBefore    int64       `json:"peak_bytes_before"`
		PeakAfter     int64       `json:"peak_bytes_after"`
		Swaps         []any       `json:"swaps"`
		LargestSwaps  []largeSwap `json:"largest_swaps"`
		PeakBreakdown struct {
			Before, After peakBreakdown
		} `json:"peak_breakdown"`
		BytesIn  int64         `json:"bytes_h2d"`
		BytesOut int64         `json:"bytes_d2h"`
		Released int64         `json:"bytes_released"`
		Traffic  trafficByKind `json:"traffic_by_kind"`
		BaseMS   float64       `json:"iteration_ms_base"`
		SimMS    float64       `json:"iteration_ms_simulated"`
		RecMS    float64       `json:"recompute_ms"`
		Waits    waits         `json:"waits_ms"`
		ByKind   kindMS        `json:"waits_by_kind_ms"`
		Queued   *float64      `json:"waits_queued_ms"`
		Groups   int           `json:"groups"`
		PlanOver int           `json:"plan_groups"`
	}
	require.NoError(t, json.Unmarshal(out.Bytes(), &rep))
	// The plan kept counted its prefetches over the logical layers or
	// over each of them halved (the bundled trace's forward and backward
	// have more than 32 ops each).
	assert.Contains(t, []int{rep.Groups, 2*rep.Groups - 1}, rep.PlanOver)
	if rep.PlanOver != rep.Groups {
		assert.Contains(t, text, fmt.Sprintf("prefetches counted over %d logical layers (the %d halved", rep.PlanOver, rep.Groups))
	}
	require.Len(t, rep.LargestSwaps, min(10, len(rep.Swaps)))
	for i, s := range rep.LargestSwaps {
		assert.Positive(t, s.Bytes)
		assert.NotEmpty(t, s.Kind)
		assert.NotEmpty(t, s.OpName, "%+v", s)
		assert.True(t, s.ProducerOp >= 0 || s.FirstUseOp >= 0, "%+v", s)
		if i > 0 {
			assert.LessOrEqual(t, s.Bytes, rep.LargestSwaps[i-1].Bytes, "largest first")
		}
	}
	for name, b := range map[string]peakBreakdown{"before": rep.PeakBreakdown.Before, "after": rep.PeakBreakdown.After} {
		assert.Equal(t, b.Bytes, b.Params+b.OptState+b.Activations+b.Gradients+b.Inputs+b.Other, name)
		assert.Positive(t, b.Params, name)
		assert.Positive(t, b.Activations, name)
	}
	assert.Positive(t, rep.BytesIn)
	assert.Equal(t, rep.BytesIn, rep.Traffic.In.sum(), "every byte copied in has a kind")
	assert.Equal(t, rep.BytesOut, rep.Traffic.Out.sum(), "every byte copied out has a kind")
	assert.Equal(t, rep.BytesIn-rep.BytesOut, rep.Released, "what comes in and does not go out leaves with no copy")
	// The step is its ops, its recomputes and its waits; here it waits
	// for copies back.
	w := rep.Waits
	assert.GreaterOrEqual(t, w.CopiesOut, 0.0)
	assert.GreaterOrEqual(t, w.StepStart, 0.0)
	assert.Positive(t, w.CopiesBack)
	assert.InDelta(t, rep.SimMS, rep.BaseMS+rep.RecMS+w.StepStart+w.CopiesOut+w.CopiesBack, 1e-6)
	assert.InDelta(t, w.StepStart+w.CopiesOut+w.CopiesBack, rep.ByKind.sum(), 1e-6, "every wait is for a copy of some kind")
	require.NotNil(t, rep.Queued)
	assert.InDelta(t, (w.StepStart+w.CopiesOut+w.CopiesBack)/2, *rep.Queued, (w.StepStart+w.CopiesOut+w.CopiesBack)/2+1e-9, "queued is a part of the waits")
	assert.Equal(t, rep.PeakBefore, rep.PeakBreakdown.Before.Bytes)
	assert.Equal(t, rep.PeakAfter, rep.PeakBreakdown.After.Bytes)
	assert.Less(t, rep.PeakBreakdown.After.Activations+rep.PeakBreakdown.After.Params,
		rep.PeakBreakdown.Before.Activations+rep.PeakBreakdown.Before.Params, "the plan moved some off")

	data, err := os.ReadFile(pf)
	require.NoError(t, err)
	var tl struct {
		TraceEvents []struct {
			Name string         `json:"name"`
			Ph   string         `json:"ph"`
			TS   float64        `json:"ts"`
			Args map[string]any `json:"args"`
		} `json:"traceEvents"`
	}
	require.NoError(t, json.Unmarshal(data, &tl))
	var counters int
	last := -1.0
	for _, e := range tl.TraceEvents {
		if e.Ph != "C" {
			continue
		}
		counters++
		assert.True(t, strings.HasPrefix(e.Name, "device memory"), e.Name)
		assert.Contains(t, e.Args, "before")
		assert.Contains(t, e.Args, "after")
		assert.GreaterOrEqual(t, e.TS, last, "in time order")
		last = e.TS
	}
	assert.Greater(t, counters, 100, "a counter sample per op")
}

// --plot-x time draws the plot over the estimated op times, for a plan
// and for a limit no plan meets; a bad axis, or one without --plot, is
// refused before the trace is read.
func TestPlotTimeAxis(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		limit string
		code  int
	}{{"80%", 0}, {"50%", 1}} {
		svg := filepath.Join(dir, "mem"+strings.TrimSuffix(c.limit, "%")+".svg")
		var out, errb bytes.Buffer
		require.Equal(t, c.code, runMain([]string{"plan", "--trace", bundled, "--limit", c.limit, "--plot", svg, "--plot-x", "time"}, &out, &errb), errb.String())
		data, err := os.ReadFile(svg)
		require.NoError(t, err)
		assert.Contains(t, string(data), "time, ms (op times: estimated, without the plan)", c.limit)
		assert.NotContains(t, string(data), ">op<", c.limit)
	}
	for _, args := range [][]string{
		{"--plot-x", "ms", "--plot", filepath.Join(dir, "x.svg")},
		{"--plot-x", "time"},
	} {
		var out, errb bytes.Buffer
		assert.Equal(t, 2, runMain(append([]string{"plan", "--trace", bundled, "--limit", "80%"}, args...), &out, &errb), "%v", args)
		assert.Contains(t, errb.String(), "--plot-x", "%v", args)
		assert.NotContains(t, errb.String(), "reading ", "%v", args)
	}
}

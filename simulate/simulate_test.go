package simulate

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/chameleon-go/chameleon/trace"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestNoSwaps(t *testing.T) {
	r, err := Run(Input{OpTimes: []float64{1, 2, 3}, Curve: []int64{5, 7, 6}, Link: H200()})
	require.NoError(t, err)
	assert.InDelta(t, 6, r.IterationUS, 1e-9)
	assert.Equal(t, int64(7), r.Peak)
	assert.Equal(t, 1, r.PeakOp)
	assert.Zero(t, r.StallUS)
}

func TestSwapTimingAndMemory(t *testing.T) {
	// 55 MB at 55 GB/s is 1000 us each way, alone.
	sw := Swap{Tensor: 7, Bytes: 55e6, Out: 0, Free: 2, In: 3, Use: 4}
	tests := []struct {
		name      string
		times     []float64
		wantStall float64
	}{
		{"hidden", []float64{100, 1000, 100, 1000, 100}, 0},
		// The copy out ends at 1100; op 2 would start at 200.
		{"free waits", []float64{100, 100, 100, 2000, 100}, 900},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := Run(Input{OpTimes: tt.times, Curve: []int64{60e6, 60e6, 60e6, 60e6, 60e6}, Swaps: []Swap{sw}, Link: H200()})
			require.NoError(t, err)
			assert.InDelta(t, tt.wantStall, r.StallUS, 1e-6)
			assert.InDelta(t, tt.wantStall, r.WaitOutUS, 1e-6, "op 2 waits for the copy out")
			assert.Zero(t, r.WaitStartUS+r.WaitInUS)
			assert.Equal(t, []int64{60e6, 60e6, 5e6, 60e6, 60e6}, []int64{r.Ops[0].Mem, r.Ops[1].Mem, r.Ops[2].Mem, r.Ops[3].Mem, r.Ops[4].Mem})
			assert.Equal(t, int64(55e6), r.BytesD2H)
			assert.Equal(t, int64(55e6), r.BytesH2D)
		})
	}
}

func TestUseWaits(t *testing.T) {
	sw := Swap{Bytes: 55e6, Out: 0, Free: 1, In: 2, Use: 3}
	r, err := Run(Input{OpTimes: []float64{2000, 100, 100, 100}, Swaps: []Swap{sw}, Link: H200()})
	require.NoError(t, err)
	// Out: 2000..3000; op 1 waits until 3000; op 2 at 3100..3200 issues
	// the copy back, 3100..4100, which op 3 waits for.
	assert.InDelta(t, 3000, r.Ops[1].Start, 1e-6)
	assert.InDelta(t, 4100, r.Ops[3].Start, 1e-6)
	assert.InDelta(t, 4200, r.IterationUS, 1e-6)
	// The parts of the waits: op 1 for the copy out (1000 us), op 3 for
	// the copy back (900 us).
	assert.InDelta(t, 1000, r.WaitOutUS, 1e-6)
	assert.InDelta(t, 900, r.WaitInUS, 1e-6)
	assert.Zero(t, r.WaitStartUS)
	assert.InDelta(t, r.StallUS, r.WaitOutUS+r.WaitInUS, 1e-6)
	assert.InDelta(t, 1900, r.SwapWaitUS[0], 1e-6, "both waits are for the one swap's copies")
	assert.Zero(t, r.WaitQueuedUS, "each copy started when the op began to wait for it")
}

// Where an op waits for two copies, each swap is charged the time until
// its own copy ends, after the other's where that ends first; the charges
// sum to the stall.
func TestSwapWaitsSplitBySwap(t *testing.T) {
	a := Swap{Bytes: 55e6, Out: 0, Free: 1, In: 3, Use: 4}
	b := Swap{Bytes: 110e6, Out: 0, Free: 1, In: 3, Use: 4}
	r, err := Run(Input{OpTimes: []float64{2000, 100, 100, 100, 100}, Swaps: []Swap{a, b}, Link: H200()})
	require.NoError(t, err)
	require.Len(t, r.SwapWaitUS, 2)
	// Op 1 waits for both copies out (1000 and 2000 us, one after the
	// other from 2000), op 4 for both copies back (issued at op 3).
	assert.InDelta(t, 3000, r.Ops[1].Stall, 1e-6)
	assert.InDelta(t, r.StallUS, r.SwapWaitUS[0]+r.SwapWaitUS[1], 1e-6)
	assert.InDelta(t, r.WaitOutUS+r.WaitInUS, r.StallUS, 1e-6)
	assert.Positive(t, r.SwapWaitUS[0])
	assert.Greater(t, r.SwapWaitUS[1], r.SwapWaitUS[0], "the larger copy ends last and is charged the longer wait")
}

// An op that waits for a copy out still queued behind a larger copy the
// engine began first waits, for that stretch, with its copy off the link.
func TestWaitQueuedBehindAnotherCopy(t *testing.T) {
	x := Swap{Bytes: 110e6, Out: 0, Free: 4, In: 4, Use: 5} // 2000 us each way
	y := Swap{Bytes: 55e6, Out: 1, Free: 2, In: 3, Use: 5}  // 1000 us
	r, err := Run(Input{OpTimes: []float64{100, 100, 100, 100, 100, 100}, Swaps: []Swap{x, y}, Link: H200()})
	require.NoError(t, err)
	// X's copy out runs 100..2100; Y's, issued at 200 and needed by op 2,
	// starts when X's ends: op 2 waits 200..3100, 1900 us of it queued.
	// Y's copy back runs 3200..4200 and X's, issued at 3300, 4200..6200:
	// op 5 waits 3400..6200 for both, and one of them is always on the
	// link, so none of that wait is queued.
	assert.InDelta(t, 2100, r.Out[1].Start, 1e-6)
	assert.InDelta(t, 2900, r.Ops[2].Stall, 1e-6)
	assert.InDelta(t, 4200, r.In[0].Start, 1e-6)
	assert.InDelta(t, 2800, r.Ops[5].Stall, 1e-6)
	assert.InDelta(t, 1900, r.WaitQueuedUS, 1e-6)
	assert.InDelta(t, 5700, r.StallUS, 1e-6)
}

func TestCongestion(t *testing.T) {
	// A link at 1 GB/s alone, half that each way while both are busy.
	l := Link{D2H: 1e9, H2D: 1e9, D2HShared: 0.5e9, H2DShared: 0.5e9}
	sw := []Swap{
		{Tensor: 1, Bytes: 1000, Out: 0, Free: 1, In: 1, Use: 3},
		{Tensor: 2, Bytes: 1000, Out: 1, Free: 2, In: 2, Use: 3},
	}
	// Op times: op0 0..1, tensor1 out 1..2 (1000 B at 1 GB/s = 1 us),
	// op1 waits until 2, ends 3; tensor1 back issued at 2 (alone 2..3).
	// tensor2 out 3..; tensor1's in is done at 3: alone as well.
	r, err := Run(Input{OpTimes: []float64{1, 1, 1, 1}, Swaps: sw, Link: l})
	require.NoError(t, err)
	assert.InDelta(t, 3, r.In[0].End, 1e-9)
	// Now overlap: tensor2 out and a long in at once.
	sw = []Swap{
		{Tensor: 1, Bytes: 2000, Out: 0, Free: 1, In: 2, Use: 4},
		{Tensor: 2, Bytes: 1000, Out: 2, Free: 3, In: 3, Use: 4},
	}
	r, err = Run(Input{OpTimes: []float64{1, 2, 1, 1, 1}, Swaps: sw, Link: l})
	require.NoError(t, err)
	// t1 out 1..3 (op1 waits? op1 starts 1 -> waits until 3), op1 3..5,
	// op2 5..6 issues t1 in at 5; t2 out starts 6: both busy at half rate.
	// t1 in: 5..6 alone (1000 B), then 1000 B at 0.5 GB/s: 6..8.
	// t2 out: 1000 B at 0.5 GB/s from 6 to 8.
	assert.InDelta(t, 8, r.In[0].End, 1e-9)
	assert.InDelta(t, 8, r.Out[1].End, 1e-9)
}

func TestInvalid(t *testing.T) {
	for _, s := range []Swap{
		{Bytes: 1, Out: 2, Free: 1, In: 3, Use: 4},
		{Bytes: 1, Out: 0, Free: 3, In: 2, Use: 4},
		{Bytes: 1, Out: 0, Free: 1, In: 2, Use: 9},
	} {
		_, err := Run(Input{OpTimes: make([]float64, 5), Swaps: []Swap{s}, Link: H200()})
		assert.ErrorIs(t, err, ErrInvalid, "%+v", s)
	}
}

func TestChromeTrace(t *testing.T) {
	sw := []Swap{{Tensor: 7, Bytes: 55e6, Out: 0, Free: 2, In: 3, Use: 4}}
	r, err := Run(Input{OpTimes: []float64{100, 100, 100, 100, 100}, Swaps: sw, Link: H200()})
	require.NoError(t, err)
	var buf bytes.Buffer
	require.NoError(t, r.WriteChromeTrace(&buf, []string{"aten::mm"}, sw))
	var doc struct {
		TraceEvents []struct {
			Name string  `json:"name"`
			Ph   string  `json:"ph"`
			TID  int     `json:"tid"`
			Dur  float64 `json:"dur"`
		} `json:"traceEvents"`
	}
	require.NoError(t, json.Unmarshal(buf.Bytes(), &doc))
	tids := map[int]int{}
	for _, e := range doc.TraceEvents {
		if e.Ph == "X" {
			tids[e.TID]++
		}
	}
	assert.Equal(t, map[int]int{1: 7, 2: 1, 3: 1}, tids) // 5 ops + 2 stalls
	assert.Equal(t, "aten::mm", doc.TraceEvents[4].Name)
}

func TestWrappingSwap(t *testing.T) {
	// Optimizer state used by op 4 only: out after op 4, back for op 4 of
	// the next iteration. 55 MB is 1000 us each way.
	sw := Swap{Tensor: 9, Bytes: 55e6, Out: 4, Free: 5, In: 1, Use: 4}
	require.True(t, sw.Wraps())
	require.NoError(t, sw.Validate(5))
	curve := []int64{60e6, 60e6, 60e6, 60e6, 60e6}
	tests := []struct {
		name      string
		times     []float64
		wantStall float64
	}{
		// In steady state the copy out, issued after op 4, runs 1000 us
		// into the next iteration, whose op 0 waits for it: 1000 us. Then
		// the copy back, issued at op 1's start, is hidden behind op 1.
		{"hidden", []float64{100, 1000, 100, 100, 100}, 1000},
		// Op 0 waits 1000 us; the copy back is issued at op 1's start
		// (1100 us) and op 4 would start at 1400: 700 us more.
		{"late", []float64{100, 100, 100, 100, 100}, 1700},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := Run(Input{OpTimes: tt.times, Curve: curve, Swaps: []Swap{sw}, Link: H200()})
			require.NoError(t, err)
			assert.InDelta(t, tt.wantStall, r.StallUS, 1e-6)
			assert.InDelta(t, 1000, r.WaitStartUS, 1e-6, "op 0 waits for the last step's copy out")
			assert.InDelta(t, tt.wantStall-1000, r.WaitInUS, 1e-6)
			assert.Zero(t, r.WaitOutUS)
			// On the host at the start, back from op 1 on; Free = 5: its
			// copy out ends after the iteration.
			assert.Equal(t, []int64{5e6, 60e6, 60e6, 60e6, 60e6}, []int64{r.Ops[0].Mem, r.Ops[1].Mem, r.Ops[2].Mem, r.Ops[3].Mem, r.Ops[4].Mem})
			assert.Equal(t, int64(55e6), r.BytesD2H)
			assert.Equal(t, int64(55e6), r.BytesH2D)
		})
	}
	// Free inside the iteration: out again over [Free, n).
	sw2 := Swap{Tensor: 9, Bytes: 55e6, Out: 1, Free: 3, In: 0, Use: 0}
	r, err := Run(Input{OpTimes: []float64{2000, 100, 1000, 100, 100}, Curve: curve, Swaps: []Swap{sw2}, Link: H200()})
	require.NoError(t, err)
	assert.Equal(t, []int64{60e6, 60e6, 60e6, 5e6, 5e6}, []int64{r.Ops[0].Mem, r.Ops[1].Mem, r.Ops[2].Mem, r.Ops[3].Mem, r.Ops[4].Mem})
	for _, bad := range []Swap{
		{Bytes: 1, Out: 4, Free: 6, In: 1, Use: 4}, // freed in the next iteration, not before its copy back
		{Bytes: 1, Out: 4, Free: 9, In: 3, Use: 4}, // freed in the next iteration after its copy back
		{Bytes: 1, Out: 4, Free: 5, In: 3, Use: 2}, // in after use
		{Bytes: 1, Out: 4, Free: 4, In: 1, Use: 2}, // free not after out
	} {
		assert.ErrorIs(t, bad.Validate(5), ErrInvalid, "%+v", bad)
	}
}

// FuzzRun: any set of valid swaps, wrapping or not, simulates without
// error, no op starts before the previous one ends, and each op's memory is
// the curve minus the bytes its swaps hold on the host.
func FuzzRun(f *testing.F) {
	f.Add([]byte{5, 1, 2, 3, 4, 9, 9, 9, 9})
	f.Add([]byte{8, 7, 0, 3, 6, 2, 1, 0, 7, 5, 5})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 2 {
			return
		}
		n := 2 + int(data[0])%14
		data = data[1:]
		times := make([]float64, n)
		curve := make([]int64, n)
		for x := range times {
			times[x] = float64(50 + 37*x%200)
			curve[x] = 1 << 30
		}
		var swaps []Swap
		for len(data) >= 4 && len(swaps) < 8 {
			s := Swap{Tensor: 1, Bytes: int64(data[0]) << 20,
				Out: int(data[1]) % n, Free: int(data[2]) % (2 * n), In: int(data[3]) % n}
			s.Use = s.In + int(data[0])%3
			if data[0]&4 != 0 {
				// A write-back, after an op before Out or, from the
				// previous iteration, after Use.
				s.Early, s.CopyAfter = true, int(data[2]+data[3])%n
			}
			data = data[4:]
			if s.Validate(n) == nil {
				swaps = append(swaps, s)
			}
		}
		r, err := Run(Input{OpTimes: times, Curve: curve, Swaps: swaps, Link: H200()})
		if err != nil {
			t.Fatalf("valid swaps %+v: %v", swaps, err)
		}
		for x := 1; x < n; x++ {
			if r.Ops[x].Start < r.Ops[x-1].End-1e-9 {
				t.Fatalf("op %d starts at %g before op %d ends at %g", x, r.Ops[x].Start, x-1, r.Ops[x-1].End)
			}
		}
		for x := range n {
			want := curve[x]
			for k, s := range swaps {
				for _, sp := range s.FreeSpans(r.Freed[k], n) {
					if x >= sp[0] && x < sp[1] {
						want -= s.Bytes
					}
				}
			}
			if r.Ops[x].Mem != want {
				t.Fatalf("op %d: memory %d, want %d (swaps %+v)", x, r.Ops[x].Mem, want, swaps)
			}
		}
	})
}

// TestIssuePlanReproducesSchedule: streams that run copies in issue order
// reproduce the simulated schedule when the copies are issued by Issue,
// and fall behind when they are issued at Out and In.
func TestIssuePlanReproducesSchedule(t *testing.T) {
	swaps := []Swap{
		{Tensor: 3, Bytes: 55e6, Out: 0, Free: 9, In: 9, Use: 10},
		{Tensor: 1, Bytes: 55e6, Out: 1, Free: 8, In: 8, Use: 10},
		{Tensor: 2, Bytes: 55e6, Out: 2, Free: 3, In: 4, Use: 5},
	}
	times := []float64{100, 100, 100, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 100}
	edf, err := Run(Input{OpTimes: times, Swaps: swaps, Link: H200()})
	require.NoError(t, err)
	fifo, err := Run(Input{OpTimes: times, Swaps: swaps, Link: H200(), Issue: Issue(swaps, nil)})
	require.NoError(t, err)
	planned, err := Run(Input{OpTimes: times, Swaps: swaps, Link: H200(), Issue: Issue(swaps, edf)})
	require.NoError(t, err)
	assert.InDelta(t, edf.IterationUS, planned.IterationUS, 1e-6, "issued as simulated")
	assert.Greater(t, fifo.IterationUS, edf.IterationUS+500, "issued at Out: A's copy delays B's")
}

// TestIssuePlanWrapsAfterUrgentCopies: a copy out that wraps the
// iteration (needed only by the next one) is issued where the simulated
// engine started it, behind the copies the step needed sooner; issued at
// its Out, it sat on the in-order stream ahead of them.
func TestIssuePlanWrapsAfterUrgentCopies(t *testing.T) {
	swaps := []Swap{
		{Tensor: 1, Bytes: 55e6, Out: 0, Free: 6, In: 6, Use: 7},
		{Tensor: 2, Bytes: 55e6, Out: 1, Free: 8, In: 0, Use: 0}, // wraps
		{Tensor: 3, Bytes: 55e6, Out: 2, Free: 3, In: 4, Use: 5},
	}
	times := []float64{100, 100, 100, 1000, 1000, 1000, 1000, 100}
	edf, err := Run(Input{OpTimes: times, Swaps: swaps, Link: H200()})
	require.NoError(t, err)
	require.Less(t, edf.Out[2].Start, edf.Out[1].Start, "the engine serves the urgent copy first")
	ip := Issue(swaps, edf)
	assert.Greater(t, ip.OutOp[1], swaps[1].Out, "the wrapping copy is issued after its Out")
	assert.Less(t, ip.OutOp[1], swaps[1].Free, "and before the op that reuses its memory")
	planned, err := Run(Input{OpTimes: times, Swaps: swaps, Link: H200(), Issue: ip})
	require.NoError(t, err)
	assert.InDelta(t, edf.IterationUS, planned.IterationUS, 1e-6, "issued as simulated")
	atOut, err := Run(Input{OpTimes: times, Swaps: swaps, Link: H200(), Issue: Issue(swaps, nil)})
	require.NoError(t, err)
	assert.Greater(t, atOut.IterationUS, edf.IterationUS+500, "issued at Out: the wrapping copy delays the urgent one")
}

// TestRecompute: a recompute runs its producer's time on the compute stream
// before the op that needs it, and frees its bytes from the op after its
// drop to that op.
func TestRecompute(t *testing.T) {
	in := Input{OpTimes: []float64{10, 20, 10, 10, 10}, Curve: []int64{100, 200, 200, 200, 100}, Link: H200(),
		Recomputes: []Recompute{{Tensor: 1, Bytes: 50, Op: 1, Drop: 1, Before: 4}}}
	r, err := Run(in)
	require.NoError(t, err)
	assert.Equal(t, 60.0, r.BaseUS)
	assert.Equal(t, 80.0, r.IterationUS)
	assert.Equal(t, 20.0, r.RecomputeUS)
	assert.Equal(t, 50.0, r.Ops[3].End)
	assert.Equal(t, 70.0, r.Ops[4].Start, "op 4 waits for the recompute")
	assert.Equal(t, []Span{{Start: 50, End: 70}}, r.Recomputed)
	var buf bytes.Buffer
	require.NoError(t, r.WriteChromeTrace(&buf, []string{"a", "aten::mul", "b", "c", "d"}, nil, in.Recomputes...))
	assert.Contains(t, buf.String(), `"name":"recompute aten::mul","ph":"X","ts":50,"dur":20,"pid":1,"tid":1`)
	got := []int64{}
	for _, o := range r.Ops {
		got = append(got, o.Mem)
	}
	assert.Equal(t, []int64{100, 200, 150, 150, 100}, got)
	assert.InDelta(t, 33.33, r.OverheadPct(), 0.01)

	for _, bad := range []Recompute{{Op: 2, Drop: 1, Before: 4}, {Op: 1, Drop: 2, Before: 3}, {Op: 1, Drop: 1, Before: 5}, {Bytes: -1, Op: 0, Drop: 0, Before: 2}} {
		in.Recomputes = []Recompute{bad}
		_, err := Run(in)
		assert.ErrorIs(t, err, ErrInvalid, "%+v", bad)
	}
}

// A swap whose host copy is current copies nothing out: its memory is
// free from the op after Out with no wait, the D2H engine stays idle, and
// only the copy back crosses the link.
func TestNoCopyOut(t *testing.T) {
	// The same swap as "free waits" above, which stalls op 2 for 900 us
	// on its copy out.
	sw := Swap{Tensor: 7, Bytes: 55e6, Out: 0, Free: 1, In: 3, Use: 4, NoCopyOut: true}
	times := []float64{100, 100, 100, 2000, 100}
	r, err := Run(Input{OpTimes: times, Curve: []int64{60e6, 60e6, 60e6, 60e6, 60e6}, Swaps: []Swap{sw}, Link: H200()})
	require.NoError(t, err)
	assert.Zero(t, r.StallUS)
	assert.Zero(t, r.BytesD2H)
	assert.Zero(t, r.BusyD2H)
	assert.Equal(t, int64(55e6), r.BytesH2D)
	assert.Equal(t, []int64{60e6, 5e6, 5e6, 60e6, 60e6}, []int64{r.Ops[0].Mem, r.Ops[1].Mem, r.Ops[2].Mem, r.Ops[3].Mem, r.Ops[4].Mem})
	assert.Equal(t, 1, r.Freed[0])

	// Dynamic free: from the op after Out.
	sw.Free = -1
	r, err = Run(Input{OpTimes: times, Curve: []int64{60e6, 60e6, 60e6, 60e6, 60e6}, Swaps: []Swap{sw}, Link: H200()})
	require.NoError(t, err)
	assert.Equal(t, 1, r.Freed[0])

	// Wrapping the iteration: free over [0, In) and from the op after Out.
	w := Swap{Tensor: 8, Bytes: 55e6, Out: 1, Free: 2, In: 0, Use: 1, NoCopyOut: true}
	r, err = Run(Input{OpTimes: times, Curve: []int64{60e6, 60e6, 60e6, 60e6, 60e6}, Swaps: []Swap{w}, Link: H200()})
	require.NoError(t, err)
	assert.Zero(t, r.BytesD2H)
	assert.Equal(t, []int64{60e6, 60e6, 5e6, 5e6, 5e6}, []int64{r.Ops[0].Mem, r.Ops[1].Mem, r.Ops[2].Mem, r.Ops[3].Mem, r.Ops[4].Mem})
}

// "d2h": false marks a swap with no copy out; absent or true, a swap that
// copies out, as before the field existed.
func TestSwapJSON(t *testing.T) {
	b, err := json.Marshal(Swap{Tensor: 3, Bytes: 10, Out: 1, Free: 2, In: 3, Use: 4, NoCopyOut: true})
	require.NoError(t, err)
	assert.JSONEq(t, `{"tensor":3,"bytes":10,"out_after_op":1,"freed_at_op":2,"in_issue_op":3,"in_before_op":4,"d2h":false}`, string(b))
	b, err = json.Marshal(Swap{Tensor: 3, Bytes: 10, Out: 1, Free: 2, In: 3, Use: 4})
	require.NoError(t, err)
	assert.NotContains(t, string(b), "d2h")
	for doc, want := range map[string]bool{
		`{"tensor":3,"bytes":10,"out_after_op":1,"freed_at_op":2,"in_issue_op":3,"in_before_op":4}`:             false,
		`{"tensor":3,"bytes":10,"out_after_op":1,"freed_at_op":2,"in_issue_op":3,"in_before_op":4,"d2h":true}`:  false,
		`{"tensor":3,"bytes":10,"out_after_op":1,"freed_at_op":2,"in_issue_op":3,"in_before_op":4,"d2h":false}`: true,
	} {
		var s Swap
		require.NoError(t, json.Unmarshal([]byte(doc), &s), doc)
		assert.Equal(t, Swap{Tensor: 3, Bytes: 10, Out: 1, Free: 2, In: 3, Use: 4, NoCopyOut: want}, s, doc)
	}
	var s Swap
	assert.Error(t, json.Unmarshal([]byte(`{"tensor":"x"}`), &s))
}

// FuzzSwapJSON: whatever decodes encodes back to the same swap.
func FuzzSwapJSON(f *testing.F) {
	f.Add([]byte(`{"tensor":3,"bytes":10,"out_after_op":1,"freed_at_op":2,"in_issue_op":3,"in_before_op":4,"d2h":false}`))
	f.Add([]byte(`{"tensor":3,"d2h":true}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var s Swap
		if json.Unmarshal(b, &s) != nil {
			return
		}
		out, err := json.Marshal(s)
		require.NoError(t, err)
		var back Swap
		require.NoError(t, json.Unmarshal(out, &back))
		assert.Equal(t, s, back)
	})
}

// TestWrapFreedInNextIteration: a swap that wraps, freed in the next
// iteration (Free past the end), keeps its memory over that iteration's
// first ops, whose first op no longer waits for its copy out: the op it
// is freed at does, and only while the copy runs.
func TestWrapFreedInNextIteration(t *testing.T) {
	// 55 MB: 1000 us each way. Out after op 4 (5000 us), its copy running
	// to 1000 us into the next iteration; back at op 3 for op 4.
	curve := []int64{60e6, 60e6, 60e6, 60e6, 60e6}
	times := []float64{1000, 1000, 1000, 1000, 1000}
	mem := func(r *Result) []int64 {
		out := make([]int64, len(r.Ops))
		for x, o := range r.Ops {
			out[x] = o.Mem
		}
		return out
	}
	sw := Swap{Tensor: 9, Bytes: 55e6, Out: 4, Free: 5, In: 3, Use: 4}
	r, err := Run(Input{OpTimes: times, Curve: curve, Swaps: []Swap{sw}, Link: H200()})
	require.NoError(t, err)
	assert.InDelta(t, 1000, r.WaitStartUS, 1e-6, "freed at op 0, which waits for the copy")
	assert.Equal(t, []int64{5e6, 5e6, 5e6, 60e6, 60e6}, mem(r))

	// Freed at op 2 of the next iteration (Free = 5+2): ops 0 and 1 keep
	// its memory, and the copy is done by op 2.
	sw.Free = 7
	require.NoError(t, sw.Validate(5))
	assert.Equal(t, [][2]int{{2, 3}}, sw.FreeSpans(sw.Free, 5))
	r, err = Run(Input{OpTimes: times, Curve: curve, Swaps: []Swap{sw}, Link: H200()})
	require.NoError(t, err)
	assert.Zero(t, r.StallUS)
	assert.Equal(t, 7, r.Freed[0])
	assert.Equal(t, []int64{60e6, 60e6, 5e6, 60e6, 60e6}, mem(r))
	assert.InDelta(t, 5000, r.IterationUS, 1e-6)
	// The copy out runs from 5000 to 6000 us: in steady state, over the
	// next iteration's first op.
	d2h, h2d := r.LinkBusy(0, 1000)
	assert.InDelta(t, 1000, d2h, 1e-6)
	assert.Zero(t, h2d)
	d2h, h2d = r.LinkBusy(3000, 4000)
	assert.Zero(t, d2h)
	assert.InDelta(t, 1000, h2d, 1e-6, "the copy back, issued at op 3")
	d2h, h2d = r.LinkBusy(500, r.IterationUS)
	assert.InDelta(t, 500, d2h, 1e-6)
	assert.InDelta(t, 1000, h2d, 1e-6)
	d2h, h2d = r.LinkBusy(0, r.IterationUS)
	assert.InDelta(t, r.BusyD2H, d2h, 1e-6)
	assert.InDelta(t, r.BusyH2D, h2d, 1e-6)
	parts := r.PartsBusy([]trace.Part{{Name: trace.PartForward, First: 0, Last: 1}, {Name: trace.PartBackward, First: 2, Last: 4}})
	assert.Equal(t, []PartBusy{{Part: trace.PartForward, MS: 2, D2H: 0.5}, {Part: trace.PartBackward, MS: 3, H2D: 1.0 / 3}}, parts)
	assert.Nil(t, r.PartsBusy([]trace.Part{{Name: trace.PartForward, First: 0, Last: 5}}), "past the last op")

	// Freed at op 1, which starts at 100 us: it waits for the copy, to
	// 1000 us, counted as a wait for the last step's copies out.
	sw.Free = 6
	times[0] = 100
	r, err = Run(Input{OpTimes: times, Curve: curve, Swaps: []Swap{sw}, Link: H200()})
	require.NoError(t, err)
	assert.InDelta(t, 900, r.WaitStartUS, 1e-6)
	assert.InDelta(t, 900, r.StallUS, 1e-6)
	assert.InDelta(t, 900, r.Ops[1].Stall, 1e-6)
	assert.Zero(t, r.Ops[0].Stall)
	// The wait, from 100 to 1000 us, ends at op 1's start: in the part
	// before it where op 1 begins the next, and split where a stretch
	// cuts it.
	assert.InDelta(t, 900, r.Waited(0, r.IterationUS), 1e-6)
	assert.InDelta(t, 400, r.Waited(600, 2000), 1e-6)
	assert.Zero(t, r.Waited(1000, r.IterationUS))
	parts = r.PartsBusy([]trace.Part{{Name: trace.PartForward, First: 0, Last: 0}, {Name: trace.PartBackward, First: 1, Last: 4}})
	require.Len(t, parts, 2)
	assert.InDelta(t, 0.9, parts[0].WaitMS, 1e-9, "waited before op 1: in the forward")
	assert.Zero(t, parts[1].WaitMS)
	assert.InDelta(t, 1.0, parts[0].MS, 1e-9)
}

// TestWriteBack: a swap whose copy out is a write-back (Early) copies
// after the tensor's last write, while it is still read; at Out nothing
// is left to copy, and the op that reuses its memory does not wait.
func TestWriteBack(t *testing.T) {
	curve := []int64{60e6, 60e6, 60e6, 60e6, 60e6, 60e6}
	times := []float64{1000, 1000, 1000, 1000, 1000, 1000}
	// Written by op 0, read by ops 1 and 2, out after op 2, its memory
	// free from op 3, back at op 4 for op 5.
	sw := Swap{Tensor: 3, Bytes: 55e6, Out: 2, Free: 3, In: 4, Use: 5}
	r, err := Run(Input{OpTimes: times, Curve: curve, Swaps: []Swap{sw}, Link: H200()})
	require.NoError(t, err)
	assert.InDelta(t, 1000, r.WaitOutUS, 1e-6, "op 3 waits for the copy out")

	sw.Early, sw.CopyAfter = true, 0
	require.NoError(t, sw.Validate(6))
	r, err = Run(Input{OpTimes: times, Curve: curve, Swaps: []Swap{sw}, Link: H200()})
	require.NoError(t, err)
	assert.Zero(t, r.StallUS)
	assert.InDelta(t, 1000, r.Out[0].Start, 1e-6, "copied after op 0")
	assert.Equal(t, int64(55e6), r.BytesD2H)
	assert.Equal(t, int64(5e6), r.Ops[3].Mem)
	ip := Issue([]Swap{sw}, r)
	assert.Equal(t, 0, ip.OutOp[0])

	// Written in the previous iteration, after op 5: its copy ran then,
	// 1000 us into this one, before op 3 frees its memory.
	sw.CopyAfter = 5
	require.NoError(t, sw.Validate(6))
	require.True(t, sw.EarlyWraps())
	r, err = Run(Input{OpTimes: times, Curve: curve, Swaps: []Swap{sw}, Link: H200()})
	require.NoError(t, err)
	assert.Zero(t, r.StallUS)
	assert.Equal(t, int64(55e6), r.BytesD2H)
	ip = Issue([]Swap{sw}, r)
	assert.Equal(t, 5, ip.OutOp[0])

	for _, bad := range []Swap{
		{Bytes: 1, Out: 2, Free: 3, In: 4, Use: 5, Early: true, CopyAfter: 2},                  // at Out
		{Bytes: 1, Out: 2, Free: 3, In: 4, Use: 5, Early: true, CopyAfter: 3},                  // inside the gap
		{Bytes: 1, Out: 2, Free: 3, In: 4, Use: 5, Early: true, CopyAfter: 0, NoCopyOut: true}, // nothing to copy
		{Bytes: 1, Out: 4, Free: 5, In: 1, Use: 2, Early: true, CopyAfter: 1},                  // wraps: before its use
		{Bytes: 1, Out: 2, Free: 3, In: 4, Use: 5, Early: true, CopyAfter: 6},                  // past the end
	} {
		assert.ErrorIs(t, bad.Validate(6), ErrInvalid, "%+v", bad)
	}
	b, err := json.Marshal(sw)
	require.NoError(t, err)
	assert.Contains(t, string(b), `"copy_out_after_op":5`)
	var back Swap
	require.NoError(t, json.Unmarshal(b, &back))
	assert.Equal(t, sw, back)
	b, err = json.Marshal(Swap{Out: 1, Free: 2, In: 3, Use: 4})
	require.NoError(t, err)
	assert.NotContains(t, string(b), "copy_out_after_op")
}

package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/memory"
	"github.com/chameleon-go/chameleon/mre"
	"github.com/chameleon-go/chameleon/simulate"
	"github.com/chameleon-go/chameleon/trace"
)

var update = flag.Bool("update", false, "rewrite docs/plan.md from the public traces")

const (
	bundled   = "../../testdata/llama4-small.jsonl.gz"
	publicDir = "../../../shared/traces"
)

var publicTraces = []string{
	"llama16-bf16.jsonl.gz",
	"llama16-bf16-dynseq.jsonl.gz",
	"llama16-fp16-scaler.jsonl.gz",
	"llama16-bf16-ckpt.jsonl.gz",
	"mixtral8-eager-bf16.jsonl.gz",
	"llama7b-8l-bf16.jsonl.gz",
	"llama16-lora.jsonl.gz",
	"llama4-small.jsonl.gz",
}

// checkRecorded checks a report against the trace itself, not the planner:
// the recorded curve minus each swap's bytes over [freed_at_op, in_issue_op)
// stays under the limit, and no op strictly between out_after_op and
// in_before_op touches the tensor, while those two ops do (or a recompute
// reads it just after out_after_op or just before in_before_op+1).
func checkRecorded(t *testing.T, it *trace.Iteration, rep *planReport) {
	t.Helper()
	bySeq := make(map[int]int, len(it.Ops))
	for x, op := range it.Ops {
		bySeq[op.Seq] = x
	}
	mem := make([]int64, len(it.Ops))
	for x, op := range it.Ops {
		mem[x] = op.Mem
	}
	touches := func(op *trace.Op, id trace.TensorID) bool {
		for _, v := range op.In {
			if v == id {
				return true
			}
		}
		for _, v := range op.Out {
			if v == id {
				return true
			}
		}
		return false
	}
	n := len(it.Ops)
	bySeq[it.Ops[n-1].Seq+1] = n // the end, where a wrapping swap's copy out may finish
	last := it.Ops[n-1].Seq
	for _, s := range rep.Swaps {
		i, f, k, j := bySeq[s.Out], bySeq[s.Free], bySeq[s.In], bySeq[s.Use]
		if s.Free > last+1 {
			f = n + s.Free - (last + 1) // freed in the next iteration
		}
		if s.Early {
			// A write-back: after the tensor's last write before Out.
			a, ok := bySeq[s.CopyAfter]
			require.True(t, ok, "%+v", s)
			require.True(t, mre.Writes(it, a, s.Tensor), "%+v: copied out after an op that does not write it", s)
		}
		if s.Wraps() {
			// Out after the last use, back before the first use of the next
			// iteration: absent over [0, k) and [f, n) (or [f-n, k) when
			// freed in the next iteration), untouched outside [j, i].
			require.True(t, k <= j && j <= i && i < f && (f <= n || f-n < k), "%+v", s)
			require.True(t, touches(&it.Ops[i], s.Tensor) && touches(&it.Ops[j], s.Tensor), "%+v", s)
			require.True(t, it.Tensors[s.Tensor].Kind.Persistent(), "%+v", s)
			for o := 0; o < n; o++ {
				if o < j || o > i {
					require.False(t, touches(&it.Ops[o], s.Tensor), "op %d uses %+v", o, s)
				}
				if f > n && o >= f-n && o < k || f <= n && (o < k || o >= f) {
					mem[o] -= s.Bytes
				}
			}
			continue
		}
		require.True(t, i < f && f < k && k <= j, "%+v", s)
		// A gap that a recompute reads the tensor in is swapped in pieces
		// around the read: back by the op before the recompute's, out
		// again after it.
		require.True(t, touches(&it.Ops[i], s.Tensor) || recomputeReads(it, rep, bySeq, s.Tensor, i), "%+v", s)
		require.True(t, touches(&it.Ops[j], s.Tensor) || recomputeReads(it, rep, bySeq, s.Tensor, j+1), "%+v", s)
		require.NotEqual(t, trace.KindInput, it.Tensors[s.Tensor].Kind, "inputs are the host's")
		for o := i + 1; o < j; o++ {
			require.False(t, touches(&it.Ops[o], s.Tensor), "op %d uses %+v", o, s)
		}
		for o := f; o < k; o++ {
			mem[o] -= s.Bytes
		}
	}
	checkRecomputes(t, it, rep, bySeq, touches, mem)
	for o, v := range mem {
		require.LessOrEqual(t, v, rep.LimitBytes, "seq %d over the limit", it.Ops[o].Seq)
	}
}

// recomputeReads reports whether a recompute of the report made before op
// x (an index into it.Ops) reads the tensor: its producer or a remade
// input's producer takes it as an input.
func recomputeReads(it *trace.Iteration, rep *planReport, bySeq map[int]int, id trace.TensorID, x int) bool {
	for _, rc := range rep.Recomputes {
		if bySeq[rc.Before] != x {
			continue
		}
		if slices.Contains(it.Ops[bySeq[rc.Op]].In, id) {
			return true
		}
		for _, m := range rc.Remade {
			if slices.Contains(it.Ops[bySeq[m.Op]].In, id) {
				return true
			}
		}
	}
	return false
}

// checkRecomputes checks each recompute against the trace: the producer
// makes the tensor, which no op touches between its drop and the op that
// needs it; each input of the producer is on the device at the recompute
// (persistent, or used around it, or held for it), not swapped out then,
// and not dropped then unless recomputed earlier before the same op. It
// takes the dropped bytes off mem and puts the held inputs' bytes on.
func checkRecomputes(t *testing.T, it *trace.Iteration, rep *planReport, bySeq map[int]int, touches func(*trace.Op, trace.TensorID) bool, mem []int64) {
	t.Helper()
	first, last := map[trace.TensorID]int{}, map[trace.TensorID]int{}
	for x := range it.Ops {
		for _, ids := range [][]trace.TensorID{it.Ops[x].In, it.Ops[x].Out} {
			for _, id := range ids {
				if _, ok := first[id]; !ok {
					first[id] = x
				}
				last[id] = x
			}
		}
	}
	m := memory.Build(it, memory.LiveOutFromTrace(&trace.Trace{Iterations: []*trace.Iteration{it}}, 0))
	held := map[trace.TensorID]int{} // kept input -> the last recompute it is held for
	for _, rc := range rep.Recomputes {
		for _, k := range rc.Kept {
			held[k.Tensor] = max(held[k.Tensor], bySeq[rc.Before])
		}
	}
	for _, rc := range rep.Recomputes {
		p, i, j := bySeq[rc.Op], bySeq[rc.Drop], bySeq[rc.Before]
		require.True(t, p <= i && i+1 < j, "%+v", rc)
		require.Contains(t, it.Ops[p].Out, rc.Tensor, "the producer makes it: %+v", rc)
		require.True(t, touches(&it.Ops[i], rc.Tensor), "%+v", rc)
		require.True(t, touches(&it.Ops[j], rc.Tensor) || recomputeReads(it, rep, bySeq, rc.Tensor, j),
			"neither the op nor a recompute before it needs %+v", rc)
		for o := i + 1; o < j; o++ {
			require.False(t, touches(&it.Ops[o], rc.Tensor), "op %d uses dropped %+v", o, rc)
			mem[o] -= rc.Bytes
		}
		// What must be on the device at the recompute: the producer's
		// inputs, but for a remade one, its own producer's inputs, and so
		// on down a chain, each remade input made before what reads it.
		var need []trace.TensorID
		var expand func(op int, before int)
		expand = func(op int, before int) {
			for _, id := range it.Ops[op].In {
				x := slices.IndexFunc(rc.Remade, func(m simulate.Remade) bool { return m.Tensor == id })
				if x < 0 {
					need = append(need, id)
					continue
				}
				require.Less(t, x, before, "remade input %d of %+v made after what reads it", id, rc)
				q := bySeq[rc.Remade[x].Op]
				require.Less(t, q, op, "%+v", rc)
				require.Contains(t, it.Ops[q].Out, id, "the remade input's producer makes it: %+v", rc)
				expand(q, x)
			}
		}
		expand(p, len(rc.Remade))
		for _, id := range need {
			tn := it.Tensors[id]
			if !tn.Kind.Persistent() {
				require.LessOrEqual(t, first[id], j, "input %d of %+v made after it", id, rc)
				// Freed where the memory model (checked against the recorded
				// curve) says the host let it go, or held for this.
				require.True(t, m.Lifetime(id).Free >= j || held[id] >= j, "input %d of %+v gone at the recompute", id, rc)
			}
			for _, s := range rep.Swaps {
				if s.Tensor != id {
					continue
				}
				f, k := bySeq[s.Free], bySeq[s.In]
				away := (j >= f && j < k) || (s.Wraps() && (j < k || j >= f))
				require.False(t, away, "input %d of %+v swapped out at the recompute: %+v", id, rc, s)
			}
			for _, o := range rep.Recomputes {
				if o.Tensor != id {
					continue
				}
				oi, oj := bySeq[o.Drop], bySeq[o.Before]
				if j > oi && j < oj {
					t.Fatalf("input %d of %+v dropped at the recompute by %+v", id, rc, o)
				}
				if oj == j {
					require.Less(t, bySeq[o.Op], p, "a chain runs in producer order")
				}
			}
		}
	}
	for id, to := range held {
		// Held from where the host let it go.
		for o := m.Lifetime(id).Free; o < to; o++ {
			mem[o] += m.Lifetime(id).Bytes
		}
	}
}

type row struct {
	trace, limit                   string
	overhead, bound, swapAll, gbSw float64
	planned                        float64 // the tier met, % of the limit
	exact                          float64 // overhead planned for the limit alone
	hybrid                         *planReport
	laid                           *planReport // the default: swap and recompute, laid out (-update only)
	feasible                       bool
	shortfall                      int64
}

// checkPlan checks a feasible report: against the trace itself, the limit,
// the executor's issue order and, when pass is true, the quality of a plan
// for its own limit: no worse than swap-all where swap-all meets it, and
// within 1.25x of the physical lower bound.
func checkPlan(t *testing.T, it *trace.Iteration, rep *planReport, name string, quality bool) {
	t.Helper()
	checkRecorded(t, it, rep)
	assert.LessOrEqual(t, rep.PeakBytesAfter, rep.PlannedBytes, name)
	assert.GreaterOrEqual(t, rep.BytesIn, rep.TrafficBoundBytes, "%s: copied in less than any plan must", name)
	// The executor's in-order copy streams, issuing as the plan's
	// simulation started the copies, run the same schedule.
	tol := 1e-3
	if slices.ContainsFunc([]string{"45%", "35%", "30%"}, func(p string) bool { return strings.Contains(name, "@"+p) }) {
		tol = 0.02 // deep cuts queue more copies behind each other
		if len(rep.Recomputes) > 0 {
			// The link-bound hybrid plans (llama16-fp16-scaler: 157.9 ms
			// simulated, 164.1 ms in issue order) queue the forward's copies
			// out behind each other: issue order costs up to 4%.
			tol = 0.045
		}
	}
	assert.InEpsilon(t, rep.IterationMSSim, rep.IterationMSExec, tol, name)
	assert.LessOrEqual(t, rep.PeakBytesExec, rep.PlannedBytes, name)
	if len(rep.Recomputes) > 0 {
		// The swap-only bound does not hold; the bound with recompute
		// does, for plans inside the iteration.
		if rb := rep.OverheadPctBoundRecompute; rb != nil && !forward(it) {
			assert.GreaterOrEqual(t, rep.OverheadPct, *rb-1e-6, "%s: beat the bound with recompute", name)
		}
		return
	}
	assert.GreaterOrEqual(t, rep.IterationMSSim, rep.StreamingBoundMSPlanned-1e-6, "%s: beat the streaming bound", name)
	if forward(it) || slices.ContainsFunc(rep.policy.Swaps, func(s simulate.Swap) bool { return s.NoCopyOut && !it.Tensors[s.Tensor].Frozen }) {
		// Weights stream across the step boundary, or tensors brought back
		// by such a swap leave again with no copy: the bound of plans
		// inside the iteration (which counts frozen bytes alone as leaving
		// with no copy) does not hold.
		return
	}
	assert.GreaterOrEqual(t, rep.OverheadPct, rep.OverheadPctBoundPlanned-1e-6, "%s: beat the lower bound", name)
	assert.GreaterOrEqual(t, rep.OverheadPctBoundPlanned, rep.OverheadPctBound-1e-6, "%s: a lower tier has a lower bound", name)
	if !quality {
		return
	}
	if rep.Baselines.SwapAll.PeakBytes <= rep.PlannedBytes {
		assert.LessOrEqual(t, rep.OverheadPct, rep.Baselines.SwapAll.OverheadPct+1e-9, "%s: worse than swap-all", name)
	}
	if rep.OverheadPctBound > 1 {
		// The bound lets every idle byte of a weight no op writes leave
		// at any op with no copy out; plans that release such weights
		// (bytes_released) reach it less closely.
		ratio := 1.25
		if rep.BytesReleased > 0 {
			ratio = 1.3
		}
		assert.LessOrEqual(t, rep.OverheadPct, ratio*rep.OverheadPctBound, "%s: more than %.2fx the lower bound", name, ratio)
	}
}

// forward reports an iteration of forward ops alone (inference).
func forward(it *trace.Iteration) bool {
	return !slices.ContainsFunc(it.Ops, func(op trace.Op) bool { return op.Phase != trace.PhaseForward })
}

func TestPlanTraces(t *testing.T) {
	t.Parallel() // the package's longest, with TestRecomputeTargets: pure plans, side by side
	files := []string{bundled}
	for _, f := range publicTraces {
		p := filepath.Join(publicDir, f)
		if _, err := os.Stat(p); err == nil && f != filepath.Base(bundled) && (!raceEnabled || len(files) < 2) {
			files = append(files, p)
		}
	}
	if len(files) == 1 {
		t.Log("public traces absent: only the bundled one")
	}
	var rows []row
	for _, path := range files {
		tr, err := trace.ReadFile(path)
		require.NoError(t, err)
		pcts := []string{"90%", "80%", "70%", "60%", "45%"}
		if filepath.Base(path) == "llama16-bf16.jsonl.gz" {
			pcts = append(pcts, "35%", "30%") // below checkpointing's peak
		}
		for _, pct := range pcts {
			name := filepath.Base(path) + "@" + pct
			// What the Engine plans swap-only (laid out in pages, planned
			// lower until the layout fits), and a plan for the byte count
			// alone, which the planner's quality is judged by.
			cfg := planConfig{iter: 1, limit: pct, minBytes: mre.DefaultMinBytes, prefetch: mre.DefaultPrefetchLayers}
			rep, err := planTrace(tr, cfg)
			if err != nil {
				require.ErrorIs(t, err, mre.ErrInfeasible, name)
				require.False(t, rep.Feasible)
				require.NotNil(t, rep.Shortfall)
				assert.Contains(t, err.Error(), "over the limit", name)
			}
			cfg.noLayout = true
			exact, xerr := planTrace(tr, cfg)
			assert.Equal(t, err == nil, xerr == nil, "%s: a limit the tiers meet is met alone", name)
			r := row{trace: filepath.Base(path), limit: pct, bound: rep.OverheadPctBound, swapAll: rep.Baselines.SwapAll.OverheadPct, feasible: rep.Feasible}
			// Swap and recompute together, for the byte count alone.
			cfg.recompute = true
			hyb, herr := planTrace(tr, cfg)
			if herr == nil {
				checkPlan(t, tr.Iterations[hyb.Iter], hyb, name+" hybrid", false)
				assert.LessOrEqual(t, hyb.PeakBytesAfter, hyb.LimitBytes, name)
				if exact != nil && exact.Feasible {
					assert.LessOrEqual(t, hyb.OverheadPct, exact.OverheadPct+0.05, "%s: swap and recompute lose to swaps alone", name)
				}
				r.hybrid = hyb
				if *update || checkPlanDoc {
					cfg.noLayout = false
					if r.laid, err = planTrace(tr, cfg); err != nil {
						r.laid = nil
					}
					cfg.noLayout = true
				}
			} else {
				require.ErrorIs(t, herr, mre.ErrInfeasible, name)
				assert.False(t, rep.Feasible, "%s: swaps alone meet a limit swap and recompute do not", name)
			}
			if rep.Feasible {
				it := tr.Iterations[rep.Iter]
				checkPlan(t, it, rep, name, false)
				checkPlan(t, it, exact, name+" alone", true)
				assert.Equal(t, exact.PlannedBytes, exact.LimitBytes)
				if pct == "90%" && (r.trace == "llama16-bf16.jsonl.gz" || r.trace == "llama7b-8l-bf16.jsonl.gz") {
					assert.Less(t, exact.OverheadPct, 2.0, "%s: GPU-bound trace at 90%% of peak", name)
				}
				r.overhead, r.gbSw, r.exact = rep.OverheadPct, float64(rep.BytesOut)/1e9, exact.OverheadPct
				r.planned = 100 * float64(rep.PlannedBytes) / float64(rep.LimitBytes)
			} else {
				r.shortfall = rep.Shortfall.Bytes
			}
			rows = append(rows, r)
		}
	}
	switch {
	case *update:
		require.Greater(t, len(files), 2, "-update needs the public traces, without -race")
		require.NoError(t, os.WriteFile("../../docs/plan.md", []byte(planDoc(rows)), 0o644))
	case checkPlanDoc && len(files) > 2:
		// The long step: docs/plan.md states what the head plans.
		doc, err := os.ReadFile("../../docs/plan.md")
		require.NoError(t, err)
		require.Equal(t, string(doc), planDoc(rows), "docs/plan.md is not what the head plans: go test ./cmd/chameleon/ -run TestPlanTraces -update")
	}
}

func planDoc(rows []row) string {
	var b strings.Builder
	b.WriteString(planDocHead)
	b.WriteString("| trace | limit | planned for | overhead | overhead, limit alone | bound | swap-all overhead | GB swapped (each way) | feasible |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		if !r.feasible {
			fmt.Fprintf(&b, "| %s | %s | - | - | - | %.1f%% | %.1f%% | - | no: %.2f GiB short |\n", r.trace, r.limit, r.bound, r.swapAll, float64(r.shortfall)/(1<<30))
			continue
		}
		fmt.Fprintf(&b, "| %s | %s | %.0f%% | %.1f%% | %.1f%% | %.1f%% | %.1f%% | %.2f | yes |\n", r.trace, r.limit, r.planned, r.overhead, r.exact, r.bound, r.swapAll, r.gbSw)
	}
	b.WriteString(planDocHybrid)
	b.WriteString("| trace | limit | swaps alone | swap + recompute | bound with recompute | recompute ms | GB recomputed | GB swapped (each way) | the default: laid out (planned for) |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		alone := "infeasible"
		if r.feasible {
			alone = fmt.Sprintf("%.1f%%", r.exact)
		}
		if h := r.hybrid; h != nil {
			bound := "-"
			if h.OverheadPctBoundRecompute != nil {
				bound = fmt.Sprintf("%.1f%%", *h.OverheadPctBoundRecompute)
			}
			laid := "-"
			if l := r.laid; l != nil && l.Layout != nil {
				laid = fmt.Sprintf("%.1f%% (%.0f%%)", l.OverheadPct, 100*float64(l.PlannedBytes)/float64(l.LimitBytes))
				if !l.Layout.Fits {
					laid += ", does not fit"
				}
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %.1f%% | %s | %.2f | %.2f | %.2f | %s |\n", r.trace, r.limit, alone, h.OverheadPct, bound, h.RecomputeMS, float64(h.BytesRecomputed)/1e9, float64(h.BytesOut)/1e9, laid)
		} else {
			fmt.Fprintf(&b, "| %s | %s | %s | infeasible | - | - | - | - | - |\n", r.trace, r.limit, alone)
		}
	}
	b.WriteString(planDocTail)
	return b.String()
}

// TestRecomputeTargets holds the default plans (swap and recompute
// together, laid out in CUDA's pages and planned again until the layout
// fits) to their simulated overheads at activation checkpointing's own peak
// and at deeper cuts, and each plan for the byte count alone
// (--layout=false) to the planner's quality there. The figures are
// deterministic simulations; each bound is the figure the planner reaches
// (docs/plan.md) plus a point or two. Checkpointing measured on the H200:
// llama16 +26%, llama7b-8l +23%, GPT-2 +27% to +31%, Qwen2 12 layers +49%
// to +67%, Qwen2-7B's shape +21% to +24%, GPT-2 XL's width +43% to +47%.
func TestRecomputeTargets(t *testing.T) {
	t.Parallel()
	if raceEnabled {
		t.Skip("the public traces are slow under the race detector")
	}
	for _, c := range []struct {
		trace, limit string
		max, bytes   float64 // laid out (the default); for the byte count alone
	}{
		{"llama16-bf16.jsonl.gz", "45%", 18.5, 14.5},
		// The optimizer state that leaves after one step's optimizer still
		// crosses the link in the next step's forward.
		{"llama16-bf16.jsonl.gz", "35%", 49.5, 47},
		// Its layout does not fit at 61%: the plan that needs the fewest
		// pages over the limit is kept.
		{"llama7b-8l-bf16.jsonl.gz", "61%", 18, 8.5},
		{"llama16-lora.jsonl.gz", "45%", 5.5, 5.5},
		// Link-bound: its copies out in the forward.
		{"llama16-fp16-scaler.jsonl.gz", "45%", 59, 52},
		// Models recorded on the H200 like the public traces, kept in
		// testdata (testdata/README.md), at their own checkpointing peaks.
		// GPT-2's dropout is not recomputable and its layer norms have
		// three outputs.
		{"../../testdata/gpt2-24l.jsonl.gz", "7.08GiB", 24.5, 23.5},
		{"../../testdata/qwen2-12l.jsonl.gz", "5.56GiB", 14, 13.5},
		{"../../testdata/qwen2-7b-8l.jsonl.gz", "16.39GiB", 3.5, 3.5},
		// Its packing wastes the most: planned for 89% of the limit.
		{"../../testdata/gpt2-xl-24l.jsonl.gz", "7.36GiB", 42, 20},
	} {
		path := filepath.Join(publicDir, c.trace)
		if strings.HasPrefix(c.trace, "../") {
			path = c.trace
		}
		if _, err := os.Stat(path); err != nil {
			t.Logf("%s absent", path)
			continue
		}
		tr, err := trace.ReadFile(path)
		require.NoError(t, err)
		name := filepath.Base(c.trace) + "@" + c.limit
		cfg := planConfig{iter: 1, limit: c.limit, minBytes: mre.DefaultMinBytes, prefetch: mre.DefaultPrefetchLayers, recompute: true}
		rep, err := planTrace(tr, cfg)
		require.NoError(t, err, name)
		checkPlan(t, tr.Iterations[rep.Iter], rep, name+" hybrid", false)
		assert.LessOrEqual(t, rep.PeakBytesAfter, rep.LimitBytes, name)
		assert.LessOrEqual(t, rep.OverheadPct, c.max, name)
		assert.NotEmpty(t, rep.Recomputes, name)
		require.NotNil(t, rep.Layout, name)
		cfg.noLayout = true
		bytes, err := planTrace(tr, cfg)
		require.NoError(t, err, name)
		assert.LessOrEqual(t, bytes.OverheadPct, c.bytes, name)
		assert.Equal(t, bytes.LimitBytes, bytes.PlannedBytes, name)
		t.Logf("%s: %.1f%% laid out (planned for %.1f%% of the limit, layout fits: %v), %.1f%% for the byte count alone (%.2f ms of recompute, %.2f GB swapped)",
			name, rep.OverheadPct, 100*float64(rep.PlannedBytes)/float64(rep.LimitBytes), rep.Layout.Fits, bytes.OverheadPct, rep.RecomputeMS, float64(rep.BytesOut)/1e9)
	}
}

// TestPlanRecomputeOutputs: --plot marks the recompute spans apart from
// the swaps, and --perfetto puts each recompute on the compute track, just
// before the op it is made for.
func TestPlanRecomputeOutputs(t *testing.T) {
	path := filepath.Join(publicDir, "llama7b-8l-bf16.jsonl.gz")
	if _, err := os.Stat(path); err != nil {
		t.Skipf("%s absent", path)
	}
	dir := t.TempDir()
	svg, pf := filepath.Join(dir, "mem.svg"), filepath.Join(dir, "tl.json")
	var out, errb bytes.Buffer
	code := runMain([]string{"plan", "--trace", path, "--limit", "61%", "--recompute", "--tiers", "100", "--json", "--plot", svg, "--perfetto", pf}, &out, &errb)
	require.Equal(t, 0, code, errb.String())
	var rep struct {
		Recomputes []simulate.Recompute `json:"recomputes"`
		Swaps      []simulate.Swap      `json:"swaps"`
		MS         float64              `json:"iteration_ms_simulated"`
		D2H        float64              `json:"link_util_d2h"`
		H2D        float64              `json:"link_util_h2d"`
		Parts      []simulate.PartBusy  `json:"link_util_by_part"`
		Waits      struct {
			StepStart  float64 `json:"step_start"`
			CopiesOut  float64 `json:"copies_out"`
			CopiesBack float64 `json:"copies_back"`
		} `json:"waits_ms"`
	}
	require.NoError(t, json.Unmarshal(out.Bytes(), &rep))
	require.NotEmpty(t, rep.Recomputes)
	plot, err := os.ReadFile(svg)
	require.NoError(t, err)
	assert.Contains(t, string(plot), "recompute: dropped")
	assert.Contains(t, string(plot), "swap: memory free")
	assert.Contains(t, string(plot), "copies back (h2d)", "the link panel")

	// The parts of the step (the fused optimizer step whole, after the
	// backward) cover it, and the link's busy time over them is its busy
	// time over the step.
	var parts []string
	var ms, d2h, h2d, wait float64
	for _, p := range rep.Parts {
		parts = append(parts, p.Part)
		ms, d2h, h2d, wait = ms+p.MS, d2h+p.MS*p.D2H, h2d+p.MS*p.H2D, wait+p.WaitMS
		assert.InDelta(t, 0.5, p.D2H, 0.5+1e-9, p.Part)
		assert.InDelta(t, 0.5, p.H2D, 0.5+1e-9, p.Part)
		assert.InDelta(t, p.MS/2, p.WaitMS, p.MS/2+1e-9, p.Part)
	}
	assert.Equal(t, []string{"forward", "backward", "after the backward"}, parts)
	assert.Positive(t, wait, "the plan waits for copies somewhere")
	assert.InDelta(t, rep.Waits.StepStart+rep.Waits.CopiesOut+rep.Waits.CopiesBack, wait, 1e-6, "the waits by part are the step's")
	assert.InDelta(t, rep.MS, ms, 1e-6)
	assert.InDelta(t, rep.D2H*rep.MS, d2h, 1e-6)
	assert.InDelta(t, rep.H2D*rep.MS, h2d, 1e-6)
	data, err := os.ReadFile(pf)
	require.NoError(t, err)
	var tl struct {
		TraceEvents []struct {
			Name string         `json:"name"`
			Ph   string         `json:"ph"`
			TS   float64        `json:"ts"`
			Dur  float64        `json:"dur"`
			TID  int            `json:"tid"`
			Args map[string]any `json:"args"`
		} `json:"traceEvents"`
	}
	require.NoError(t, json.Unmarshal(data, &tl))
	opStart := map[int]float64{}
	for _, e := range tl.TraceEvents {
		if e.Ph == "X" && e.TID == 1 && !strings.HasPrefix(e.Name, "recompute ") && e.Name != "stall" {
			opStart[int(e.Args["op"].(float64))] = e.TS
		}
	}
	n := 0
	for _, e := range tl.TraceEvents {
		if !strings.HasPrefix(e.Name, "recompute ") {
			continue
		}
		n++
		assert.Equal(t, 1, e.TID, "on the compute track")
		assert.Positive(t, e.Dur)
		before := int(e.Args["before_op"].(float64))
		assert.LessOrEqual(t, e.TS+e.Dur, opStart[before]+1e-6, "%s ends before op %d starts", e.Name, before)
	}
	assert.Equal(t, len(rep.Recomputes), n, "one slice per recompute")
}

func TestPlanJSON(t *testing.T) {
	dir := t.TempDir()
	svg, png, pf := filepath.Join(dir, "mem.svg"), filepath.Join(dir, "mem.png"), filepath.Join(dir, "tl.json")
	var out, errb bytes.Buffer
	code := runMain([]string{"plan", "--trace", bundled, "--limit", "90%", "--json", "--plot", svg, "--perfetto", pf}, &out, &errb)
	require.Equal(t, 0, code, errb.String())
	var got map[string]any
	dec := json.NewDecoder(&out)
	require.NoError(t, dec.Decode(&got))
	assert.False(t, dec.More(), "exactly one object")
	for _, k := range []string{"trace", "iter", "ops", "limit_bytes", "peak_bytes_before", "peak_bytes_after", "iteration_ms_base",
		"iteration_ms_simulated", "overhead_pct", "overhead_pct_bound", "feasible", "swaps", "baselines"} {
		assert.Contains(t, got, k)
	}
	assert.Equal(t, true, got["feasible"])
	swaps := got["swaps"].([]any)
	require.NotEmpty(t, swaps)
	for _, k := range []string{"tensor", "bytes", "out_after_op", "freed_at_op", "in_issue_op", "in_before_op"} {
		assert.Contains(t, swaps[0].(map[string]any), k)
	}
	sa := got["baselines"].(map[string]any)["swap_all"].(map[string]any)
	for _, k := range []string{"peak_bytes", "iteration_ms", "overhead_pct"} {
		assert.Contains(t, sa, k)
	}
	for _, p := range []string{svg, pf} {
		st, err := os.Stat(p)
		require.NoError(t, err)
		assert.Positive(t, st.Size())
	}
	data, err := os.ReadFile(pf)
	require.NoError(t, err)
	assert.True(t, json.Valid(data))

	out.Reset()
	code = runMain([]string{"plan", "--trace", bundled, "--limit", "1.2GiB", "--plot", png}, &out, &errb)
	require.Equal(t, 0, code, errb.String())
	assert.Contains(t, out.String(), "overhead")
	_, err = os.Stat(png)
	assert.NoError(t, err)
}

// A limit no plan meets: exit 1 in text and in --json, the lowest limit a
// plan meets in GiB and as a share of the peak (and a plan is made there),
// "by swapping and recomputing" with recomputes, the JSON object with the
// error, and --plot drawn from the curve while --perfetto says it wrote
// nothing.
func TestPlanInfeasible(t *testing.T) {
	var out, errb bytes.Buffer
	code := runMain([]string{"plan", "--trace", bundled, "--limit", "10%", "--recompute=false"}, &out, &errb)
	assert.Equal(t, 1, code)
	assert.Contains(t, errb.String(), "cannot be met by swapping: ")
	assert.Contains(t, errb.String(), "at op")
	assert.Regexp(t, `the lowest feasible limit is \d+\.\d\d GiB \(7\d\.\d% of the peak\): --limit 7\d%`, errb.String())
	assert.Contains(t, out.String(), "lowest feasible limit: ", "the report says it too")

	dir := t.TempDir()
	png, tl := filepath.Join(dir, "mem.png"), filepath.Join(dir, "tl.json")
	out.Reset()
	errb.Reset()
	code = runMain([]string{"plan", "--trace", bundled, "--limit", "10%", "--json", "--plot", png, "--perfetto", tl}, &out, &errb)
	require.Equal(t, 1, code, errb.String())
	assert.Contains(t, errb.String(), "cannot be met by swapping and recomputing")
	var got struct {
		Command     string
		Feasible    bool
		Shortfall   struct{ Op, Bytes int64 }
		LimitBytes  int64   `json:"limit_bytes"`
		PeakBytes   int64   `json:"peak_bytes_before"`
		Error       string  `json:"error"`
		LowestBytes int64   `json:"lowest_feasible_limit_bytes"`
		LowestPct   float64 `json:"lowest_feasible_limit_pct"`
	}
	require.NoError(t, json.Unmarshal(out.Bytes(), &got), out.String())
	assert.Equal(t, "plan", got.Command)
	assert.False(t, got.Feasible)
	assert.Positive(t, got.Shortfall.Bytes)
	assert.Contains(t, got.Error, "cannot be met by swapping and recomputing")
	assert.Contains(t, got.Error, "lowest feasible limit")
	assert.Equal(t, got.LimitBytes+got.Shortfall.Bytes, got.LowestBytes, "the limit plus the shortfall of swaps alone")
	assert.InDelta(t, 100*float64(got.LowestBytes)/float64(got.PeakBytes), got.LowestPct, 0.01)
	st, err := os.Stat(png)
	require.NoError(t, err, "--plot draws the curve and the limits")
	assert.Positive(t, st.Size())
	assert.Contains(t, errb.String(), "wrote "+png)
	assert.Contains(t, errb.String(), "--perfetto: no file written")
	_, err = os.Stat(tl)
	assert.True(t, os.IsNotExist(err), "no timeline without a plan")

	// At the lowest feasible limit a plan is made; just under it, none.
	for _, c := range []struct {
		limit int64
		code  int
	}{{got.LowestBytes, 0}, {got.LowestBytes - 1<<20, 1}} {
		out.Reset()
		errb.Reset()
		code := runMain([]string{"plan", "--trace", bundled, "--limit", fmt.Sprintf("%dB", c.limit), "--layout=false"}, &out, &errb)
		assert.Equal(t, c.code, code, "--limit %dB: %s", c.limit, errb.String())
	}
}

// --bandwidth takes bytes per second with a unit, or a bare number of at
// least 1e6; it refuses a bare 55 (55 B/s) and a rate in bits.
func TestParseBandwidth(t *testing.T) {
	for in, want := range map[string]float64{
		"55GB/s": 55e9, "55G": 55e9, "55e9": 55e9, "55 GB/s": 55e9, "55GBps": 55e9, "55GB": 55e9,
		"12.5GB/s": 12.5e9, "1MB/s": 1e6, "1e6": 1e6, "2GiB/s": 2 << 30, "500M": 500e6, "500MB/s": 500e6,
	} {
		bw, err := parseBandwidth(in)
		if assert.NoError(t, err, in) {
			assert.Equal(t, want, bw, in)
		}
	}
	for in, msg := range map[string]string{
		"55":       "did you mean 55GB/s (55e9)?",
		"999999":   "under the floor of 1MB/s",
		"55KB/s":   "under the floor of 1MB/s",
		"400Gb/s":  "bits per second",
		"0GB/s":    "positive",
		"-1GB/s":   "positive",
		"fast":     "bytes per second with a unit",
		"55GHz":    "bytes per second with a unit",
		"":         "bytes per second with a unit",
		"Inf GB/s": "bytes per second with a unit",
	} {
		_, err := parseBandwidth(in)
		if assert.Error(t, err, in) {
			assert.Contains(t, err.Error(), msg, in)
		}
	}
	// The help says which unit is expected.
	var out, errb bytes.Buffer
	require.Equal(t, 0, runMain([]string{"plan", "-h"}, &out, &errb))
	assert.Contains(t, errb.String(), "bytes per second with a unit: 55GB/s, 55G or 55e9")
}

const planDocHead = `# Swap plans on the public traces

Generated by ` + "`go test ./cmd/chameleon/ -run TestPlanTraces -update`" + ` (and checked against the
head at every commit by CI's long step, which fails when a figure here drifts) on the one planning path
the Engine plans with (` + "`plan.Make`" + `, its defaults): iteration 1 of each trace, limits as a share of
the iteration's recorded peak (max op.mem), the recorded curve kept under the limit, op times from
the default estimator (` + "`layer.Default`" + `: the H200 cost model, scaled to the uninstrumented iteration
time; docs/estimation.md), 32 uniform logical layers per phase, the measured H200 link (55 GB/s each
way alone, 48 + 51 GB/s both at once). Every feasible plan is checked against the recorded curve
(op.mem minus each swapped tensor's bytes over [freed_at_op, in_issue_op)) and the rule that no op
between a swap's two uses touches the tensor.

- planned for: the limit the plan was made for. The planning path lays the plan's blocks out in
  device memory (` + "`plan.Layout`" + `: greedy by size into CUDA's pages for the limit, 2-16 MiB) and, while
  the pages they touch exceed the limit, plans again two ways and keeps the faster plan that fits:
  for less at each op by the bytes its blocks then hold above the limit (the "planned for" column
  does not show this), and lower at every op by the excess, then halfway between a limit that fits
  and one that does not; the Engine serves every block at its offset. Swaps alone
  here (` + "`--recompute=false`" + `); the default plans swap and recompute together (the second table).
- overhead: simulated iteration time over the op times alone, for that plan. The simulated copy
  engines serve, among the copies issued, the one whose op waits first;
  a CUDA stream runs copies in issue order, so the Engine issues each copy when, and in the order,
  the simulation started it (` + "`simulate.Issue`" + `). The test replays every feasible plan that way on
  in-order streams: same iteration time within 0.1% down to 60% of the peak and within 2% at 45%
  (llama16-fp16-scaler at 45%: 290.4 ms in issue order against 285.9 ms), peak under the limit.
- overhead, limit alone: the same plan made for the byte count alone (` + "`--layout=false`" + `), which the
  planner's quality is judged by; the test holds it within 1.25x of the bound wherever the bound
  exceeds 1%.
- bound: the physical lower bound of any swap-only plan at the limit (` + "`mre.LowerBound`" + `): the bytes
  over the limit at op t must have left at 55 GB/s by the start of t and come back before the
  last op.
- swap-all: the save_on_cpu policy (every saved forward activation out after its last forward use,
  back at its first backward use, issued there: no prefetch) on the same simulator; it does not
  necessarily reach the limit.

`
const planDocHybrid = `
## Swap and recompute together

` + "`chameleon plan --layout=false`" + ` (the byte count alone; the last column is the default, laid out, with
the share of the limit it was planned for): each saved activation may also be dropped and made again by
running its producer before its next use, where the op may run again (` + "`mre.Recomputable`" + `: no
random numbers, no writes into an input, one output). The producer's inputs stay on the device
until then; an input the trace frees earlier is made again first by its own producer where that
can run there (remade), up to four producers deep (GPT-2's tanh from the pointwise ops of its
GELU, back to the matrix product's output), else held for it (counted), and an input that is
itself dropped is recomputed first, before the same op (a chain). Remaking deep saves what
holding costs for more time, so the whole search runs once with the deep remakes and once
without, and the faster policy is kept. Recomputes run on the simulated
compute stream and delay everything after them; the overhead includes their time. The planner
tries recompute budgets from none (the swap-only plan) to every useful recompute, cheapest per
byte first, plans swaps for what each leaves and keeps the fastest; the test checks every plan
against the recorded curve with the held inputs counted and every input on the device at its
recompute. A tensor a recompute reads inside a swap's gap is swapped in pieces around the read:
back by the op before the recompute's, out again after it (before, such a gap was not swapped at
all). The recomputes are ranked by time per byte saved, a byte counting once per op it relieves
over the limit (the paper's reduction points), lazily re-ranked as others are taken; one ranking
serves every budget (each takes a prefix), every budget gets one plan-simulate round and the three
fastest all of them, and a budget whose recompute time alone exceeds the best iteration so far is
not planned. That ranking takes the tensors made early in the forward as readily as the late
ones, but only the early ones have the link to themselves before the curve reaches the limit; a
second ranking leaves to swaps those whose copy out, queued in the order they are dropped, would
be done before the first op over the limit in their gap; it is screened at the budget where the
first was fastest and the two beside it, then every prefix within two recomputes of the fastest
of all, and the fastest of these gets every round too.
Ranked over the whole need, the recomputes take the long gaps, which swaps hide for
free, as readily as the short ones swaps cannot; so three more rankings run over the need less
what the link could have copied out before each op and back after it (at 60%, 80% and 100% of the
link's rate), each taking every useful recompute of its order, and they join the budgets in the
screen. Where the best policy still waits for copies (more than 0.5% of the compute time), up to
four rounds recompute more of what is on the device at the longest wait, cheapest per byte, as
many bytes as the link moves in the wait, while that makes the iteration faster; they start from
the best policy and from the first ranking's best. Swaps across the iteration boundary (optimizer state) have their copies back timed as
one engine queues them, latest use first, as well as each alone; the faster plan is kept. The
simulator runs them in steady state: a copy out still running when the step ends holds the D2H
engine at the start of the next step, whose first op waits for it, since it reuses that memory
(before, the copies were taken as done by the next step's start: llama16 at 35% was 22.9% then
and 50.8% right after, the difference the optimizer state's copies out of one step, about 1.8
GiB, running ahead of the next step's forward; 45.8% now, with the swaps around recompute reads
and the deep remakes).

Last, the copies that still make compute wait are moved where the simulated memory has room
(` + "`mre.Retime`" + `): a swap whose memory an op waited to count free, its copy out queued behind
others, frees it later, at the first op that starts after the copy ends; one whose use waited for
its copy back has it issued earlier by the wait; and where freeing later does not fit, copies back
that hold memory there and would still end well before their use (twice their copy time) are
issued later to make the room. Each move holds its bytes over the ops it spans and is taken only
while the memory after each of them stays within the limit; a pass is kept only when it simulates
faster, for up to 32 passes. The selection times each copy on the stall-free timeline, and the
swaps across the step's end without the others on the engine, so where copies crowd, ops wait
that memory would let run: with the optimizer step in the backward (` + "`--hoist`" + `), the state each
piece writes queues on the link out while the backward's memory has room. The planning path moves
them once the layout is known, under the limit the plan was made for and under the whole limit,
and keeps a moved plan only when its blocks still fit and it runs faster: moved, blocks live
longer and fit pages worse (` + "`--layout=false`" + ` moves them in the plan itself). A swap across the
step's end whose copy out runs past it, which the next step's first op would wait for, is freed in
the next step instead, at the first op that starts once the copy is done, where the memory of the
ops before has room: its place is kept over those ops, and the step's first ops run while the last
writes of the step before cross out (` + "`freed_at_op`" + ` past the last op).

Then the copies out of tensors an op wrote earlier are issued as write-backs at that write
(` + "`mre.WriteBackAt`" + `; ` + "`copy_out_after_op`" + ` in ` + "`plan --json`" + `; ` + "`mre.WithoutWriteBack`" + ` turns
it off): the copy runs while the tensor stays on the device and is read on, and where it leaves,
nothing is left to copy, so its memory is free from the next op. A weight the optimizer writes in
the backward (` + "`--hoist`" + `) is copied out there, in the step before, rather than after its read in
the next forward, where the activations crowd the link out and its memory could count free only
once its copy ended. Four sets are tried, each with its copies then moved as above: every swap that
can, those whose memory waited for their copy out, those written in the step before, those written
in the step; the fastest is kept when it is faster. The executor issues the write-back after the
write (a pinned host copy it keeps current until an op writes the tensor) and releases the device
memory at the swap's out op, the compute stream waiting there for a copy still running.

bound with recompute: ` + "`mre.RecomputeBound`" + ` (` + "`overhead_pct_bound_recompute`" + ` in ` + "`plan --json`" + `), the least
overhead of any plan of swaps and recomputes in this model: a plan that starts op t D late has
moved at most the link's rate times (start of t + D) off by then, besides what lives from the step
before and no op has used yet, which may have left in the step before after its last use there
(at most the link's rate times what was left of that step after the cut, plus what was released
before the cut, the least over cuts: ` + "`mre.EntryIdle`" + `; with the optimizer step in the backward,
` + "`--hoist`" + `, optimizer state read mid-backward leaves that way), and the rest of the excess at t
must be dropped, by recomputes that run after t, at no less than the cheapest alive over t cost,
taken by time per byte (the last in part); the plan adds at least the least over D of D plus that,
at every t. The copies back bound it too: what recomputes do not drop at t is off the device by
swaps, whose copies back start after t, one after the other at the link's rate in, each before its
tensor's next read; leaving off the tensors read last, the plan is still late by the bytes read
before op u less the time to u, and the least over the recomputes' share of the larger of that and
their cost counts (it binds where weights, gradients and optimizer state, which no recompute makes,
are all read in an optimizer step's few ops). Every plan in the table, and the best keep / swap / recompute choice on small graphs
found by brute force, is checked against it. Peers on the H200 (measured): activation checkpointing brings llama16 to 45% of its
peak (8.29 GiB) for +26% and llama7b-8l to 61% (15.43 GiB) for +23%; torch.compile with an
activation budget of 0.2, llama16 to 8.68 GiB at 126 ms (+7% over its own 118 ms).

`

const planDocTail = `
## Reading it

- Swap and recompute together are the frontier: llama16-bf16 at 80% of its peak costs 1.4%
  instead of 30.0% with swaps alone, at 60% 6.5% instead of 151.9%, at 45% (checkpointing's own
  peak, +26% measured) 13.4%, at 35% 45.8%; llama16-lora at 45% 4.2%. llama7b-8l at 60% costs 8.1%
  (at 61%, checkpointing's peak, ` + "`chameleon plan --recompute --tiers 100 --limit 61%`" + ` gives 7.5%;
  checkpointing +23%). What sets the cost at 45% on llama16 is the loss: at
  ` + "`_log_softmax_backward_data`" + ` the curve is 10.1 GiB over the 8.29 GiB limit, of which the loss's own
  2.9 GiB of logits are in use. The forward before it lasts about 41 ms of kernel time, in which the
  link carries at most about 2.2 GB out, so at least 8 GiB there must be dropped and made again; the
  recompute candidates alive there hold 8.7 GiB, and the cheapest 8 GiB of them (casts, products,
  SiLU, the loss gradient, then matrix products) cost about 13 ms of kernel time. The residual
  stream and attention's outputs (no recompute can make them: several outputs, or a chain back
  to them) go by the link. The bound with recompute puts that in one figure: no plan in this
  model does better than 12.5% there (12.2% with the measured kernel times, against 13.13%
  planned with them). The planner is 0.9 points above it; the bound takes the cheapest
  recomputes at each op on its own, splits shared held inputs and takes the last one in part, so
  part of that gap no plan can close. The 10% of the target needs recompute cheaper per byte than
  one op at a time gives (fused chains, several outputs).
  fp16-scaler at 45% is 50.6% (bound 13.5%, which counts no copy back): its copies out in the
  forward are link-bound. At 30% no plan is
  found.
- Models the planner was not tuned on, recorded on the H200 the same way and kept in
  testdata/ (testdata/README.md), planned at their own checkpointing peaks: GPT-2 (24 layers,
  dropout 0.1) at 7.08 GiB costs 22.2% (bound 22.2%; with its measured kernel times 15.0%, bound
  14.5%), where checkpointing measured +27% to +31%; Qwen2 (12 layers) at 5.56 GiB costs 12.2%
  (bound 11.2%), where checkpointing measured +49% to +67%. Two more, of larger layers, at
  theirs: Qwen2-7B's layer shape (8 layers) at 16.39 GiB 2.2% (bound 1.8%; checkpointing +21% to
  +24%), GPT-2 XL's width (24 layers) at 7.36 GiB 18.9% (bound 17.7%; with its kernel times
  14.7%; checkpointing +43% to +47%). GPT-2 cost 224.6% while a tensor a
  recompute reads could not be swapped around the read, and 45.7% while inputs were remade one
  producer deep. These are plans: the executor does not
  yet run every plan as simulated (docs/train.md).
- The layout costs what its packing wastes. A plan whose bytes fit the limit needs, as blocks at
  fixed offsets in pages, 3-11% more on these traces (pages shared by blocks of different lives,
  holes only a smaller block can take), so the default plans a little below the limit: in the
  last column, llama16-bf16 at 45% is planned for about 90% of its limit. The tiers this replaces
  planned for 90%, 95% and 100% of every limit whatever the packing needed, and still left the
  allocator to find places for the blocks (27.3% and 77.8% at 90% and 80% of llama16's peak).
- Deeper cuts are link-bound: each GB costs ~18 ms per direction, and the forward before the
  peak is too short to push the excess out. Planned for the limit alone, the plans stay within
  1.00-1.10x of the bound wherever it exceeds 1% (the test checks 1.25x); what is left is the
  bound's optimism (it ignores when a tensor is produced, queueing and the congestion of both
  directions at once).
- The logical layers are 32 per phase of equal op counts (` + "`plan.Uniform`" + `, the paper's): the
  planner counts prefetch distances in them, and the model's own layers (` + "`--grouping discovered`" + `,
  8 per phase on llama7b-8l) make a 2-layer prefetch hold a quarter of the model: llama7b-8l at
  60% costs 125% over them against 105% over 32 groups; elsewhere the two are within 0.3 points.
- Candidates are activations and, over their gaps inside the iteration, parameters and
  optimizer state (a weight is idle from its layer's forward to its backward). That is what
  makes llama16-bf16-ckpt plannable at all: at the loss backward (op 1263) the tensors in use
  (3.0 GB of logits and their gradients), the parameters and the optimizer state are ~92.6% of
  its 8.29 GiB peak, leaving only ~0.6 GB of idle activations; with the weights movable, 90%
  costs 0.0% and 80% 3.7% (planned for the limit alone). Below 80% the optimizer state, idle
  from one step's optimizer to the next (a gap across the iteration boundary), is what is left.
- Swap versus the measured recompute: activation checkpointing brings llama16 from 18.43 GiB
  at 116 ms to 8.29 GiB at ~150 ms (+26%), a 55% cut. Swapping alone beats that only for shallow
  cuts: 90% of peak is free and 80% costs less than recompute's 26% on llama7b-8l, but on
  llama16 80% already costs about as much as recompute, and 70%/60% cost 85-150% for far less
  than recompute's 55% cut (bound 85%/146%: no swap-only plan can do better on this link).
  Deep cuts need recompute of the cheap ops and swaps of the expensive ones together.
- The bound and the overheads move with the op times (the forward's share of the iteration
  decides how much can leave before the peak): with op-count times (` + "`--estimator opcount`" + `)
  llama16 at 80%, planned for the limit alone, is 26.0% against a bound of 25.6%.

## Read-only swaps and weight streaming

A swap whose tensor's host copy is current when it leaves copies nothing out (` + "`\"d2h\": false`" + `
in ` + "`plan --json`" + `): its device memory is free from the end of its last use before the gap and
only the copy back crosses the link. The host copy is current for a frozen parameter (the trace's
` + "`\"frozen\": true`" + `: LoRA base weights, every weight at inference) and for any tensor no op wrote
(a non-view op listing it among its outputs) since an earlier swap of the same iteration brought it
back, a swap across the iteration boundary counting as bringing it back at the start. The planner
times such a swap's span from the end of its use and scores its size twice (it frees its bytes for
half the link time); the bound above lets idle bytes of weights no op writes leave with no copy.
On llama16-lora (iteration 1, the Engine's tiers) bytes copied out per step drop from 4.45 to 3.19 GiB
at 80% of the peak (176.0 -> 151.4 ms simulated), from 5.88 to 4.62 GiB at 70% (231.9 -> 207.4 ms)
and from 9.45 to 9.05 GiB at 45%, against the same iteration with its weights taken as writable.

A forward-only iteration (inference: no backward, no optimizer) holds over the limit weights it uses
once a step, so its plan streams them: each goes out after its last use and comes back for the next
step's first use. Which weights: the fewest bytes that meet the limit with every weight counted as if
it came back at its use (two greedy orders, by score and smallest first, each with a prefetch buffer
of 0, 1/2, 1 and 2 of the largest weights; the fastest simulated is kept). When each comes back: in
order of use, the latest op that leaves the copies queued before it time to end by their uses, but
never earlier than memory allows (what the weights in flight and in use hold at each op); so the
prefetch distance is the bytes the link brings in before the layer starts, bounded by the memory free
to hold them, down to one op, and a coarse grouping (the 8 identical decode blocks of llama7b-8l, or one
group) cannot make a stream infeasible. ` + "`streaming_bound_ms`" + ` bounds a step run over and over: at
least peak minus limit bytes come in each step at the link's rate. On llama7b-8l-decode (H200 link,
55 GB/s, the Engine's tiers), a decode step (iteration 5, 10.3 ms of compute) at 50% of its peak
simulates at 51.9 ms against a bound of 44.9 ms at the limit (1.15x; 49.4 ms at the 90% tier), 2.56 GiB
in and nothing out per step; at 60%, 45.2 ms against 36.0 ms at the limit (1.26x, most of it the tier:
41.3 ms at 90% of the limit, 1.09x), 2.28 GiB in. The prefill (iteration 0, 58.7 ms of compute) at 50%
simulates at 62.8 ms (1.07x of its compute-bound bound), 2.93 GiB in; at 60% 61.1 ms. Before, the decode
steps had no plan (the copies back, timed on the stall-free timeline, all fell at op 0) and the
prefill at 50% cost 88.8 ms, copying 3.33 GiB out and in.
`

// --host-budget: the plan's pinned host memory is reported, a plan within
// the budget is made, and one over it is refused with the budget named.
func TestPlanHostBudget(t *testing.T) {
	var out, errb bytes.Buffer
	require.Equal(t, 0, runMain([]string{"plan", "--trace", bundled, "--limit", "80%", "--json"}, &out, &errb), errb.String())
	var free struct {
		HostPeak   int64 `json:"host_peak_bytes"`
		HostBudget int64 `json:"host_budget_bytes"`
	}
	require.NoError(t, json.Unmarshal(out.Bytes(), &free))
	require.Positive(t, free.HostPeak)
	require.Zero(t, free.HostBudget)

	out.Reset()
	errb.Reset()
	budget := fmt.Sprintf("%dB", 2*free.HostPeak)
	require.Equal(t, 0, runMain([]string{"plan", "--trace", bundled, "--limit", "80%", "--host-budget", budget}, &out, &errb), errb.String())
	assert.Contains(t, out.String(), "pinned host memory: the swaps hold ")
	assert.Contains(t, out.String(), " of a --host-budget of ")

	out.Reset()
	errb.Reset()
	budget = fmt.Sprintf("%dB", free.HostPeak/4)
	require.Equal(t, 1, runMain([]string{"plan", "--trace", bundled, "--limit", "80%", "--host-budget", budget}, &out, &errb))
	assert.Contains(t, errb.String(), "the host budget binds before the device limit")
	require.Equal(t, 2, runMain([]string{"plan", "--trace", bundled, "--limit", "80%", "--host-budget", "-1GiB"}, &out, &errb))
}

// TestWriteParts: the link by part of the step, alone (plan) and with the
// simulation's beside what ran (replay --timeline); a simulation of other
// parts is left out.
func TestWriteParts(t *testing.T) {
	ran := []simulate.PartBusy{{Part: trace.PartForward, MS: 7, D2H: 0.81, H2D: 0.02, WaitMS: 0.5}, {Part: trace.PartBackward, MS: 11.69, H2D: 0.64, WaitMS: 2.25}}
	sim := []simulate.PartBusy{{Part: trace.PartForward, MS: 6.4, D2H: 0.88}, {Part: trace.PartBackward, MS: 11.14, H2D: 0.51, WaitMS: 1.5}}
	var b strings.Builder
	writeParts(&b, ran, nil)
	assert.Equal(t, "forward 7.00 ms, waiting 0.50 ms: d2h 81%, h2d 2%; backward 11.69 ms, waiting 2.25 ms: d2h 0%, h2d 64%", b.String())
	b.Reset()
	writeParts(&b, ran, sim)
	assert.Equal(t, "forward 7.00 ms (6.40), waiting 0.50 ms (0.00): d2h 81% (88%), h2d 2% (0%); backward 11.69 ms (11.14), waiting 2.25 ms (1.50): d2h 0% (0%), h2d 64% (51%)", b.String())
	b.Reset()
	writeParts(&b, ran, sim[:1])
	assert.NotContains(t, b.String(), "(")
}

package layer

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/trace"
)

var updateDoc = flag.Bool("update", false, "rewrite docs/estimation.md from the measured errors")

// publicTraces are the recorded traces the estimation table covers.
var publicTraces = []string{
	"llama16-bf16", "llama7b-8l-bf16", "mixtral8-eager-bf16", "llama16-bf16-ckpt",
	"llama16-bf16-dynseq", "llama16-fp16-scaler", "llama4-small",
}

// truthFor returns the per-op truth of iteration it (summing to its
// TimeMS) and what it is. GPU-bound traces with a kernel file use the
// kernel times; mixtral, host-bound, uses its measured per-op durations
// whole (in a launch-bound step an op occupies the timeline for its launch
// as much as for its kernel, which dur_us includes and kernel_us does not);
// the rest use dur_us minus the sync floor.
func truthFor(dir, name string, it *trace.Iteration) ([]float64, string) {
	k, _ := trace.ReadKernelsFile(filepath.Join(dir, name+".kernels.json.gz"))
	target := it.TimeMS * 1000
	if k != nil && gpuBound(k, it) {
		if kt := kernelsFor(k, it); kt != nil {
			return scaleTo(kt, target), "kernel_us"
		}
	}
	if k != nil {
		return scaleTo(rawDur(it), target), "dur_us (host-bound)"
	}
	return scaleTo(durTruth(it), target), "dur_us - floor"
}

// gpuBound reports whether the kernels cover most of the step: 80% of the
// profiled iteration or of the recorded step, whichever is shorter (the
// profiler's own overhead lengthens a step with many small ops).
func gpuBound(k *trace.Kernels, it *trace.Iteration) bool {
	ref := k.IterationMS
	if it.TimeMS > 0 && it.TimeMS < ref {
		ref = it.TimeMS
	}
	return k.KernelMSTotal >= 0.8*ref
}

// profileFor picks the detailed profile the learned estimators may use for
// iteration k: another iteration of the same trace with the same op count
// (nearest first), its dur_us less the sync floor.
func profileFor(tr *trace.Trace, k int) *trace.Iteration {
	n := len(tr.Iterations[k].Ops)
	for d := 1; d < len(tr.Iterations); d++ {
		for _, j := range []int{k + d, k - d} {
			if j >= 0 && j < len(tr.Iterations) && len(tr.Iterations[j].Ops) == n {
				return tr.Iterations[j]
			}
		}
	}
	for j := range tr.Iterations {
		if j != k {
			return tr.Iterations[j]
		}
	}
	return tr.Iterations[k]
}

type errRow struct {
	trace, truth, grouping string
	n, groups              int
	mean, max              [3]float64 // OpCount, Tokens, CostModel
}

// measure computes the error table for one trace over all its iterations:
// mean is the mean over iterations of the mean group error, max the worst
// group of any iteration.
func measure(t testing.TB, dir, name string) []errRow {
	tr := loadTrace(t, filepath.Join(dir, name+".jsonl.gz"))
	var rows []errRow
	ns := []int{4, 8, 16, 32, 64}
	idx := map[[2]int]int{}
	cost := Default()
	for k, it := range tr.Iterations {
		truth, what := truthFor(dir, name, it)
		prof := profileFor(tr, k)
		tok := LearnTokens(prof, durTruth(prof))
		est := [3][]float64{OpCount{}.Estimate(it), tok.Estimate(it), cost.Estimate(it)}
		for gi, grouping := range []string{"uniform", "layers"} {
			for _, n := range ns {
				gs := Uniform(it.Ops, n)
				if gi == 1 {
					gs = Layers(it.Ops, n)
				}
				key := [2]int{gi, n}
				r, ok := idx[key]
				if !ok {
					r = len(rows)
					idx[key] = r
					rows = append(rows, errRow{trace: name, truth: what, grouping: grouping, n: n, groups: len(gs)})
				}
				for e := range est {
					m, x := groupErr(gs, est[e], truth)
					rows[r].mean[e] += m / float64(len(tr.Iterations))
					rows[r].max[e] = max(rows[r].max[e], x)
				}
			}
		}
	}
	return rows
}

func TestEstimationTable(t *testing.T) {
	dir := tracesDir()
	if dir == "" {
		t.Skip("no ../shared/traces")
	}
	var all []errRow
	// llama16-lora's layers are not discovered (its adapters break the
	// block's k-grams: TestDiscoverMatchesModulePaths leaves it out), so
	// its "layers" rows are uniform cuts.
	for _, name := range append(slices.Clone(publicTraces), "llama16-lora") {
		if _, err := os.Stat(filepath.Join(dir, name+".jsonl.gz")); err != nil {
			continue
		}
		all = append(all, measure(t, dir, name)...)
	}
	// Bounds on the default estimator against kernel truth: what was
	// measured, plus a margin. Uniform cuts through layers leave a few big
	// ops in small groups, which is where the cost model errs most.
	bounds := map[string]float64{
		"llama16-bf16/layers": 0.02, "llama16-bf16/uniform": 0.02, "llama16-bf16/uniform/32": 0.06,
		"llama7b-8l-bf16/layers": 0.04, "llama7b-8l-bf16/uniform": 0.035,
		"llama7b-8l-bf16/uniform/16": 0.06, "llama7b-8l-bf16/uniform/32": 0.09,
	}
	checked := 0
	for _, r := range all {
		if r.truth != "kernel_us" || r.n > 32 {
			continue
		}
		limit, ok := bounds[fmt.Sprintf("%s/%s/%d", r.trace, r.grouping, r.n)]
		if !ok {
			limit, ok = bounds[r.trace+"/"+r.grouping]
		}
		if !ok {
			continue
		}
		checked++
		assert.Less(t, r.mean[2], limit, "%s %s N=%d: mean group error", r.trace, r.grouping, r.n)
		// The default must beat the paper's op-count split everywhere here.
		assert.Less(t, r.mean[2], r.mean[0], "%s %s N=%d: cost model vs op count", r.trace, r.grouping, r.n)
	}
	assert.Equal(t, 16, checked, "kernel-truth rows checked")
	// docs/estimation.md is what this test prints: written with -update,
	// checked against it otherwise.
	cells, _ := carryTable(t, dir)
	doc := renderDoc(all, cells)
	path := repoFile(t, "docs/estimation.md")
	if *updateDoc {
		require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
		require.NoError(t, os.WriteFile(path, []byte(doc), 0o644))
	} else {
		have, err := os.ReadFile(path)
		require.NoError(t, err)
		require.Equal(t, doc, string(have), "docs/estimation.md is not what the head measures: go test ./layer -run TestEstimationTable -update")
	}
	for _, r := range all {
		t.Logf("%-20s %-7s N=%-2d g=%-3d opcount %5.1f%%/%5.1f%% tokens %5.1f%%/%5.1f%% cost %5.1f%%/%5.1f%%", r.trace, r.grouping, r.n, r.groups,
			100*r.mean[0], 100*r.max[0], 100*r.mean[1], 100*r.max[1], 100*r.mean[2], 100*r.max[2])
	}
}

// renderDoc is docs/estimation.md for the rows and the carry-over cells.
func renderDoc(rows []errRow, cells []carryCell) string {
	var b strings.Builder
	b.WriteString(docHead)
	b.WriteString("| trace | truth | grouping | N | groups | OpCount mean / max | learned tokens mean / max | cost model (default) mean / max |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %s | %s | %d | %d | %.1f%% / %.1f%% | %.1f%% / %.1f%% | %.1f%% / %.1f%% |\n",
			r.trace, r.truth, r.grouping, r.n, r.groups, 100*r.mean[0], 100*r.max[0], 100*r.mean[1], 100*r.max[1], 100*r.mean[2], 100*r.max[2])
	}
	writeCarry(&b, cells)
	b.WriteString(docTail)
	return b.String()
}

const docHead = `# Group time estimation: measured error

Generated by ` + "`go test ./layer -run TestEstimationTable -update`" + ` from the traces in
../shared/traces. Each row is one trace, all its iterations: "mean" is the mean over
iterations of the mean relative error of the groups' times, "max" the worst group of any
iteration. Groups: "uniform" is the paper's cut (N groups of equal op counts in forward and in
backward, the optimizer one group); "layers" cuts only at discovered layer boundaries
(layer.Layers), so N above the layer count gives one group per layer plus prologue and
epilogue.

Estimators (all scaled to the iteration's measured time):
- OpCount: the paper, T_iter / N_ops per op.
- learned tokens: mean time per op token learned from another iteration of the same trace
  (its dur_us less the sync floor), applied to this one.
- cost model (layer.Default): roofline per op from the tensors' shapes and sizes (GEMM and
  attention FLOPs, bytes of the storages read and written), H200 constants, one efficiency per
  op kind (matmul, attention, attention backward, optimizer, elementwise, strided layout
  copies, reductions, gathers, scatters) and phase, bounded to [0.02, 1], and a launch floor:
  layer.Fit on the kernel times of llama16-bf16 (llama16-bf16.kernels.json.gz), nothing per
  op name. For llama16-bf16 itself the rows are in sample; every other trace is out of
  sample. In a host-bound step (modeled kernels under 70% of the step) every op adds the
  host's dispatch time, five times as long for an op that launches a kernel as for a view.

Truth per trace:
- kernel_us (llama16-bf16, llama16-lora, llama7b-8l-bf16): each op's GPU kernel time from the
  kernels file, scaled to the iteration time. These runs are GPU-bound (kernel time 112 of
  116 ms, 117 of 123 ms and 196 of 197 ms), so the kernel timeline is the real one. This is the truth the under-2% goal is
  measured against.
- dur_us (host-bound), mixtral8-eager-bf16: its kernels cover 43 of 288 ms, so kernel time is
  not its timeline; in a launch-bound step each op holds the timeline for its launch and host
  work as much as for its kernel. The per-op dur_us (which includes launch, kernel and a sync)
  scaled to the iteration time is the closest measurement, and it is a weak one: the sync it
  adds is not in the real step.
- dur_us - floor (the other traces): dur_us less the median duration of kernel-less ops (the
  launch-and-sync floor, ~15-20 us), scaled. This is a poor proxy: on llama16-bf16, where both
  exist, this truth itself is 25% (mean group error) away from the kernel truth at N = 4-16,
  so errors in these rows mostly measure the proxy, not the estimator.

`

const docTail = `
## Where it fails, and why

- Kernel truth: with discovered layers the default stays at 1.2-1.4% mean on llama16-bf16
  (in sample) and about 3% on llama16-lora and llama7b-8l-bf16 (out of sample). Fitted on any
  one profiled trace, the model stays within 10% on every GPU-bound trace with discovered
  layers (worst: fitted on llama16-lora, 7% on llama7b-8l). The uniform cut at N = 32 splits
  layers into groups of 30-40 ops, where the spread of efficiencies inside one kind (a
  forward mul.Tensor at 57% of the bandwidth beside a pow at 100%) is not averaged away:
  5-10% mean, and 16% on llama7b-8l when fitted on mixtral8, whose small expert kernels reach
  other shares (attention at 68% against 100% at llama7b-8l's head dim 128 and sequence 4096).
- What a fit on one model cannot know: attention efficiency grows with head dim and sequence
  (llama16 at 64/2048: 93% of the non-causal FLOP count; llama7b-8l at 128/4096: over 100%,
  because a causal kernel skips half of it); a kind a trace does not run, or runs only in
  launch-bound slivers, keeps a prior (gather 0.4, scatter 0.1, optimizer 0.38).
- The max column is dominated by the smallest groups: the epilogue of backward (embedding
  backward, 2 ops), the prologue, the optimizer step. Their absolute error is a few hundred
  microseconds.
- mixtral8-eager-bf16 is host-bound: no estimator built from device costs can know how long
  the host takes per op (a cuBLAS call with a new expert shape spends ~300 us on the host,
  index_put with accumulate sorts and syncs). The host-time spreading beats op-count
  spreading there, narrowly with discovered layers; learned tokens do best (17-23%) because
  they learn the host cost per op token from the same trace.
- The dur_us-floor rows (ckpt, dynseq, fp16-scaler, llama4-small) should be read with the
  proxy's own 25% error in mind; the per-token estimator, learned from the same proxy on a
  neighbouring iteration, is favoured by it.
- Not done: calibration from dur_us when no kernel file exists, fp16 GEMM efficiencies from a
  fp16 profile, and a host-time model per op kind for launch-bound steps.

## Measured times (the Engine)

The Engine does not plan on estimates where it can measure: it times its own
iterations with the device's timing events (` + "`" + `device.Device.NewTimingEvent` + "`" + ` and
` + "`" + `Elapsed` + "`" + `: CUDA events with timing, ` + "`" + `aclrtCreateEventWithFlag(ACL_EVENT_TIME_LINE)` + "`" + ` and
` + "`" + `aclrtEventElapsedTime` + "`" + ` on Ascend, the streams' modeled clock on the host backend).

- What is measured. In the profiled iteration, an event on the compute stream at Begin and
  after every op. The groups are known only at plan time, so each op's time is read (the end
  of its work less the end of the previous op's), and the planning path sums them per logical
  layer (` + "`" + `plan.WithMeasured` + "`" + `): each layer takes its measured time, and the estimator only
  splits it among the layer's ops in proportion to its own estimates. The time the compute
  stream waits for a copy (a swapped tensor coming back, memory freed behind a copy out, as the
  allocator reports through ` + "`" + `Allocator.OnStreamWait` + "`" + `) or runs a recompute is bracketed by a
  pair of events and left out: it is the swaps' cost, which the plan counts itself. Plans made
  so say ` + "`" + `plan.Result.Measured` + "`" + `; ` + "`" + `Stats.MeasuredPlans` + "`" + ` counts them.
- The link. Every timed iteration also brackets each of the executor's copies with a pair of
  events on its copy stream: per direction, alone, or with the other direction busy (a copy at
  least half of whose time overlapped one the other way). Once a direction has moved 16 MiB in
  4 copies, the next plan models its measured rate (a missing alone or shared rate is derived
  from the other by the configured link's ratio); ` + "`" + `Engine.Link` + "`" + ` reports the figures, the
  congestion factor (shared over alone: the slowdown of a copy when the second transfer in
  flight runs the other way; the executor has at most one copy per direction in flight) and
  the link the next plan models. ` + "`" + `WithLinkBandwidth` + "`" + ` fixes the link: the measurement is then
  reported, not used.
- In STABLE. The first iteration under a new policy, then every ` + "`" + `WithTimingEvery` + "`" + ` (default
  10) iterations, an event at each layer's end plus the same brackets; the events are read at
  a later Begin once they are complete (Query), never blocking the host. A layer whose compute
  time differs from the one its policy was planned with by more than ` + "`" + `WithDriftThreshold` + "`" + `
  (default 15%, and more than 20 µs) in two samples in a row makes the Engine profile the
  next iteration and plan again (` + "`" + `Stats.DriftReplans` + "`" + `). ` + "`" + `Engine.GroupTimes` + "`" + ` gives each
  layer's planned, simulated (the policy's simulated timeline, stalls included) and sampled
  times (compute, and everything on the compute stream).
- Once more under the first policy. A sequence's first profile is taken with no policy in
  force, while the executor forces evictions to stay under the limit; their copies share the
  device's memory bandwidth with the kernels, which run slower than they will under a policy
  (on the H200, examples/train's TF32 backward layers profiled 4-5% over what they then took
  in STABLE). So a policy planned on measured times from an iteration that forced evictions is
  planned again once, from the profile of the iteration after the first it ran without forcing
  any: the times its own swaps and recomputes leave the kernels (` + "`Stats.Refined`" + `, counted in
  ` + "`Stats.Replans`" + ` too; once per sequence).
- The cost. Profiled iteration (once per plan): one timing event recorded per op, two per
  wait for a copy and per copy, then at End one host wait for the device to finish the
  iteration (the planning that follows holds the host longer) and one ` + "`" + `Elapsed` + "`" + ` per event
  (about a microsecond each). A STABLE sample: groups + 1 events on the compute stream, two
  per wait and per copy, no host wait; at the default of 65 groups every 10 iterations, about
  7 records per iteration plus 0.2 per copy, a few microseconds of host time (a timing record
  costs 1-3 µs on CUDA) against steps of tens of milliseconds. Events are pooled and reused.
- Failures. A device without timing events (` + "`" + `ErrNotSupported` + "`" + `) turns timing off with a
  warning; any other timing error leaves that iteration's times to the estimator with a
  warning (` + "`" + `Stats.TimingErrors` + "`" + `) and never fails the iteration. ` + "`" + `WithMeasuredTimes(false)` + "`" + `
  plans on the estimator and the configured link.
- Limits. On the host backend the clock counts modeled time only (copies on the link model,
  kernels queued with ` + "`" + `LaunchFor` + "`" + `); kernels queued with ` + "`" + `Launch` + "`" + ` take no time, so an iteration
  whose measured compute is under 1% of its stream time is not used and the estimator plans.
  An op's time from events is the stream's timeline: when the host launches slower than the
  device runs, it includes the device's idle time waiting for the launch, which is the
  step's real time, but it makes per-op times unreliable: the layer is what is used.
`

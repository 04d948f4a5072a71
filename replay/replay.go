// Package replay runs recorded traces through the Engine on a device,
// with real bytes: every tensor of the recorded iterations is allocated
// (sizes divided by a scale so a trace fits a test), filled with a known
// pattern when an op produces it and verified at every use. It is the end-
// to-end check that a swapped tensor always comes back byte-identical and
// that the Engine keeps device memory under its limit.
//
// A timed replay (Config.Timing) runs each op instead as a kernel of its
// time on the Engine's compute stream, with the Engine's real allocations
// and copies, and measures each iteration's step beside the simulator's.
package replay

import (
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"time"

	"github.com/chameleon-go/chameleon"
	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/layer"
	"github.com/chameleon-go/chameleon/memory"
	"github.com/chameleon-go/chameleon/mre"
	"github.com/chameleon-go/chameleon/simulate"
	"github.com/chameleon-go/chameleon/trace"
)

// Config says how to replay.
type Config struct {
	// Scale divides every tensor size (at least 1).
	Scale int64
	// Rounds replays the trace's iterations this many times, in order.
	Rounds int
	// Order, when set, replays the trace's iterations in this order
	// instead (positions in the trace, from 0; one may come many times, so
	// a test can make runs the recording does not have), once; Rounds is
	// then ignored. An iteration's releases are its own wherever it runs.
	Order []int
	// Limit is the Engine's device memory limit in (scaled) bytes.
	Limit int64
	// LimitFrom, when set, says where Limit came from ("80% of the peak
	// recorded at f:12"); errors about the limit quote it.
	LimitFrom string
	// Options are passed to chameleon.New after the limit.
	Options []chameleon.Option
	// Progress, when set, gets a line per replayed iteration.
	Progress io.Writer
	// Recompute gives every op that may run again (mre.Recomputable) a
	// Recompute: it checks the op's inputs hold what they held when it ran
	// and writes its output's pattern again, so the Engine may drop the
	// output and make it again, and every use still verifies it.
	Recompute bool
	// PolicyFile, when set, is the Engine's policy file: loaded at start if
	// it exists (chameleon.WithPolicyFile) and saved at the end.
	PolicyFile string
	// Timing, when set, makes the replay a timed one (see Timing): each op
	// a kernel of its time, bytes checked only where Timing.VerifyEvery
	// says, and each iteration's step measured.
	Timing *Timing
	// Kernels gives each op's kernel time for the iterations whose op
	// sequence it times (OpTimes); the others run the planning path's
	// estimates. KernelsFrom names its file in errors. With Kernels or
	// Timing, the Engine plans with those op times (Estimator).
	Kernels     *trace.Kernels
	KernelsFrom string
}

// Report is what a replay saw. The JSON names are those of the replay
// command's report.
type Report struct {
	Trace           string `json:"trace"`
	Iterations      int    `json:"iterations"`
	Scale           int64  `json:"scale"`
	LimitBytes      int64  `json:"limit_bytes"`
	PeakDeviceBytes int64  `json:"peak_device_bytes"`
	VerifiedUses    int64  `json:"verified_uses"`
	FailedUses      int64  `json:"failed_uses"`
	SwappedBytes    int64  `json:"swapped_bytes"`
	Replans         int    `json:"replans"`
	CacheHits       int    `json:"cache_hits"`
	// PolicyUpdates counts cached policies updated to this run's limit,
	// link or device (differential updates, not replans).
	PolicyUpdates int `json:"policy_updates"`
	// Outgrown counts policies an iteration outgrew (Stats.Outgrown),
	// each planned again from the next iteration without a warm-up.
	Outgrown int `json:"outgrown"`
	// Tightened counts policies planned again below the limit because
	// their blocks needed more pages than the limit holds
	// (Stats.Tightened).
	Tightened int `json:"tightened"`
	// Refined counts policies planned on times measured under forced
	// evictions and planned again once from a profile under them
	// (Stats.Refined, in Replans too).
	Refined int `json:"refined"`
	// PolicyFileError is why the policy file was not used, if it was not.
	PolicyFileError string   `json:"policy_file_error,omitempty"`
	Stages          []string `json:"stages"`
	// Timing reports a timed replay (Config.Timing); VerifyEvery its
	// sampling of checked storages (0: none checked).
	Timing      bool `json:"timing,omitempty"`
	VerifyEvery int  `json:"verify_every,omitempty"`
	// Stable sums up a timed replay's STABLE iterations (nil when none).
	Stable *StableReport `json:"stable,omitempty"`
	// Not in the command's required report, but useful.
	OnDemandSwapIns int64    `json:"on_demand_swap_ins"`
	Recomputes      int64    `json:"recomputes"`
	Evictions       int64    `json:"evictions"`
	PlanErrors      []string `json:"plan_errors,omitempty"`
	// KeptSwapOuts counts swap-outs of parameters and optimizer state whose
	// host copy was still current: no bytes copied (KeptBytes not copied).
	KeptSwapOuts int64              `json:"kept_swap_outs"`
	KeptBytes    int64              `json:"kept_bytes"`
	PerIteration []IterationReport  `json:"per_iteration"`
	Results      []chameleon.Result `json:"-"`
	Failures     []string           `json:"failures,omitempty"`
	Stats        chameleon.Stats    `json:"-"`
	Engine       *chameleon.Engine  `json:"-"`
	// Timeline is the last STABLE iteration's stamped ops (the last
	// iteration's when none ran STABLE), with Timing.Timeline; TimelineOf
	// names it.
	Timeline   []OpSpan `json:"-"`
	TimelineOf string   `json:"-"`
	// TimelineCopies is the copies stamped at that iteration's end, with a
	// CopyTimeline.
	TimelineCopies []CopySpan `json:"-"`
	// TimelineSim is the simulation of the policy that iteration ran under
	// (nil: none), for the timeline to show beside what ran.
	TimelineSim *chameleon.Simulation `json:"-"`
}

// IterationReport is what one replayed iteration did.
type IterationReport struct {
	Round              int    `json:"round"`
	Iter               int    `json:"iter"`
	Stage              string `json:"stage"`
	PlannedSwaps       int64  `json:"planned_swaps"`
	PlannedRecomputes  int64  `json:"planned_recomputes"`
	OnDemandSwapIns    int64  `json:"on_demand_swap_ins"`
	Evictions          int64  `json:"evictions"`
	DeferredPrefetches int64  `json:"deferred_prefetches"`
	SwappedBytes       int64  `json:"swapped_bytes"`
	// SimulatedMS is the simulator's step for the policy in force.
	SimulatedMS float64 `json:"simulated_ms,omitempty"`
	// A timed replay's figures: where the op times come from (TimesKernels
	// or TimesEstimated) and their sum (KernelMS), the same kernels run
	// alone on the stream with no Engine (UnlimitedMS, measured once per
	// trace iteration before the first round), and the step measured from
	// Begin to the compute stream's sync after the last op (MeasuredMS).
	OpTimes     string  `json:"op_times,omitempty"`
	KernelMS    float64 `json:"kernel_ms,omitempty"`
	UnlimitedMS float64 `json:"unlimited_ms,omitempty"`
	MeasuredMS  float64 `json:"measured_ms,omitempty"`
	// IssuedMS is the host's time from Begin to the last op queued (a
	// timed replay): a step whose IssuedMS is near its MeasuredMS is bound
	// by the host, not by the device.
	IssuedMS float64 `json:"issued_ms,omitempty"`
	// BeginMS is the host's time in Begin (a timed replay): where the
	// Engine looks up its policy and the allocator plans placement.
	BeginMS float64 `json:"begin_ms,omitempty"`
	// HostWaits and Maps are the allocator's host waits and page mappings
	// during the iteration (Engine Stats): both 0 once a policy runs.
	HostWaits int64 `json:"host_waits"`
	Maps      int64 `json:"maps"`
	// MappedPages is the pages those maps mapped.
	MappedPages int64 `json:"mapped_pages"`
	// Placed and Missed are the device blocks served at the address the
	// allocator planned for them and, with a plan, elsewhere
	// (chameleon.WithPlacement).
	Placed int64 `json:"placed"`
	Missed int64 `json:"missed"`
	// HostAllocs is the pinned slabs the Engine's host pool allocated.
	HostAllocs int64 `json:"host_allocs"`
	// Held is the storages of activations and inputs the replay still
	// holds when the iteration ends: those the trace reads again in a
	// later iteration (live-out), no others.
	Held int `json:"held"`
	// With Timing.Timeline, the step on the device's clock: the time it ran
	// the op kernels (DeviceBusyMS), the time it stood idle because the
	// host had not queued the next kernel yet (HostStallMS) and idle with
	// the kernel queued, waiting for an event such as a copy back, or
	// running a recompute's kernels (DeviceStallMS; RecomputeKernelMS says
	// how much of it the recomputes ran), and the longest of those stalls.
	DeviceBusyMS  float64 `json:"device_busy_ms,omitempty"`
	HostStallMS   float64 `json:"host_stall_ms,omitempty"`
	DeviceStallMS float64 `json:"device_stall_ms,omitempty"`
	WorstStalls   []Stall `json:"worst_stalls,omitempty"`
	// With a timeline that stamps copies (CopyTimeline): the copies each
	// way read at the iteration's end.
	D2H *LinkFigures `json:"d2h,omitempty"`
	H2D *LinkFigures `json:"h2d,omitempty"`
	// LinkParts is, with such a timeline, how busy each direction of the
	// link was over the forward, the backward and what follows it
	// (trace.StepParts), and LinkPartsSimulated the same of the policy in
	// force's simulation (simulate.Result.PartsBusy), where it has one of
	// this iteration's ops.
	LinkParts          []simulate.PartBusy `json:"link_by_part,omitempty"`
	LinkPartsSimulated []simulate.PartBusy `json:"link_by_part_simulated,omitempty"`
	// WorstLayers are, with a timeline, the three logical layers of the
	// policy in force that ran longest over their simulated time.
	WorstLayers []LayerTime `json:"worst_layers,omitempty"`
	// RecomputeKernelMS is, with a timeline, the time the iteration's
	// stamped recomputes ran on the compute stream (each between its two
	// stamps: its kernel and a launch gap or two).
	RecomputeKernelMS float64 `json:"recompute_kernel_ms,omitempty"`
}

// LayerTime is one logical layer's time on the device's clock (from the
// end of the layer before to the end of its last op: stalls, recomputes
// and kernels) beside the simulator's for the policy in force.
type LayerTime struct {
	FirstOp     int     `json:"first_op"`
	LastOp      int     `json:"last_op"`
	Phase       string  `json:"phase"`
	SimulatedMS float64 `json:"simulated_ms"`
	MeasuredMS  float64 `json:"measured_ms"`
	// SimulatedWaitMS is the part of SimulatedMS the layer's ops waited
	// for copies; MeasuredWaitMS the time the device stood idle in the
	// layer, less the stamped recomputes that ran in it.
	SimulatedWaitMS float64 `json:"simulated_wait_ms"`
	MeasuredWaitMS  float64 `json:"measured_wait_ms"`
}

// PeakBytes is the trace's largest recorded peak (the max of op.Mem over
// all iterations), the base of a percent limit.
func PeakBytes(tr *trace.Trace) int64 {
	if op := PeakOp(tr); op != nil {
		return max(op.Mem, 0)
	}
	return 0
}

// PeakOp is the first op that recorded PeakBytes (its Line says where in
// the trace file), nil when the trace has no ops.
func PeakOp(tr *trace.Trace) *trace.Op {
	var p *trace.Op
	for _, it := range tr.Iterations {
		for i := range it.Ops {
			if p == nil || it.Ops[i].Mem > p.Mem {
				p = &it.Ops[i]
			}
		}
	}
	return p
}

// blockBytes is the granule the Engine rounds every allocation up to.
const blockBytes = 512

// Scaled is the size a replay at scale allocates for a storage of b bytes:
// b/scale rounded up, at least 16 bytes. It refuses what no device can
// hold: a negative size, or one whose rounding up to the Engine's 512-byte
// blocks overflows int64.
func Scaled(b, scale int64) (int64, error) {
	if b < 0 {
		return 0, fmt.Errorf("negative size %d", b)
	}
	if scale < 1 {
		return 0, fmt.Errorf("scale %d: want at least 1", scale)
	}
	n := b / scale
	if b%scale != 0 {
		n++
	}
	if n > math.MaxInt64-(blockBytes-1) {
		return 0, fmt.Errorf("%d bytes at scale 1/%d: rounding to %d-byte blocks overflows", b, scale, blockBytes)
	}
	return max(16, n), nil
}

// checkSizes refuses, before anything is allocated, a storage the replay
// could not allocate under limit, naming the tensor and where the trace
// declared it.
func checkSizes(tr *trace.Trace, scale, limit int64) error {
	room := limit &^ (blockBytes - 1) // what the Engine reserves
	seen := make(map[*trace.Tensor]bool)
	for _, it := range tr.Iterations {
		for _, id := range sortedIDs(it) {
			t := it.Tensors[id]
			if seen[t] {
				continue
			}
			seen[t] = true
			n, err := Scaled(t.Bytes, scale)
			if err == nil && (n+blockBytes-1)&^(blockBytes-1) > room {
				err = fmt.Errorf("%d bytes at scale 1/%d: larger than the device limit of %d bytes", n, scale, limit)
			}
			if err != nil {
				return fmt.Errorf("replay: tensor %d (%d bytes, declared at %s): %w", id, t.Bytes, where(tr, t.Line), err)
			}
		}
	}
	return checkWorkingSets(tr, scale, room)
}

// checkWorkingSets refuses a limit under what one op needs resident at
// once (its inputs and outputs, at the Engine's rounding): no plan and no
// eviction can run that op, so the replay would stop there after minutes.
// The error names the op and the lowest limit the trace can run under.
func checkWorkingSets(tr *trace.Trace, scale, room int64) error {
	var worst *trace.Op
	var worstIt *trace.Iteration
	var most int64
	for _, it := range tr.Iterations {
		for i := range it.Ops {
			op := &it.Ops[i]
			var n int64
			for j, id := range op.In {
				if !slices.Contains(op.In[:j], id) {
					n += roundedAt(it.Tensors[id], scale)
				}
			}
			for j, id := range op.Out {
				if !slices.Contains(op.In, id) && !slices.Contains(op.Out[:j], id) {
					n += roundedAt(it.Tensors[id], scale)
				}
			}
			if n > most {
				worst, worstIt, most = op, it, n
			}
		}
	}
	if most <= room {
		return nil
	}
	hint := ""
	if _, ok := trace.Divide(worstIt, worst); ok {
		hint = "; the op is made of independent pieces, which replay --split (trace.SplitTrace) runs one by one"
	}
	return fmt.Errorf("replay: op %d (%s) of iteration %d (%s) reads and writes %d bytes at scale 1/%d, more than the device limit of %d bytes: "+
		"every tensor an op lists is resident while it runs, so the lowest limit this trace can run under is %d bytes at this scale (%.1f%% of its peak)%s",
		worst.Seq, worst.Name, worstIt.Index, where(tr, worst.Line), most, scale, room, most, 100*float64(most)*float64(scale)/float64(max(PeakBytes(tr), 1)), hint)
}

// roundedAt is t's size at scale as the Engine allocates it.
func roundedAt(t *trace.Tensor, scale int64) int64 {
	if t == nil {
		return 0
	}
	n, err := Scaled(t.Bytes, scale)
	if err != nil {
		return 0 // refused by checkSizes first
	}
	return (n + blockBytes - 1) &^ (blockBytes - 1)
}

// where is file:line, or the file alone when the line is unknown.
func where(tr *trace.Trace, line int) string {
	if line > 0 {
		return fmt.Sprintf("%s:%d", tr.Name, line)
	}
	return tr.Name
}

// live is one replayed storage.
type live struct {
	t   *chameleon.Tensor
	gen uint64 // pattern generation written last
}

// Run replays tr on dev, which must have room for cfg.Limit bytes.
func Run(tr *trace.Trace, dev device.Device, cfg Config) (*Report, error) {
	if cfg.Scale < 1 {
		return nil, fmt.Errorf("replay: scale %d: want at least 1", cfg.Scale)
	}
	if cfg.Rounds < 1 {
		cfg.Rounds = 1
	}
	if len(tr.Iterations) == 0 {
		return nil, errors.New("replay: trace has no iterations")
	}
	for i, k := range cfg.Order {
		if k < 0 || k >= len(tr.Iterations) {
			return nil, fmt.Errorf("replay: order[%d] is %d: want a position in the trace's %d iterations", i, k, len(tr.Iterations))
		}
	}
	limitErr := func(err error) error {
		if cfg.LimitFrom != "" {
			return fmt.Errorf("replay: limit %d bytes (%s): %w", cfg.Limit, cfg.LimitFrom, err)
		}
		return fmt.Errorf("replay: limit %d bytes: %w", cfg.Limit, err)
	}
	if cfg.Limit <= 0 {
		return nil, limitErr(errors.New("want a positive limit"))
	}
	_, total, err := dev.MemInfo()
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	if cfg.Limit > total {
		return nil, limitErr(fmt.Errorf("larger than %s (%d bytes)", dev.Name(), total))
	}
	if err := checkSizes(tr, cfg.Scale, cfg.Limit); err != nil {
		return nil, err
	}
	if cfg.Timing != nil && cfg.Timing.Launch == nil {
		return nil, errors.New("replay: Timing without a Launch")
	}
	// A replay plans synchronously (first, so cfg.Options may say
	// otherwise): its figures are the same on every machine.
	opts := append([]chameleon.Option{chameleon.WithMemoryLimit(cfg.Limit), chameleon.WithSyncPlanning(true)}, cfg.Options...)
	if cfg.PolicyFile != "" {
		opts = append(opts, chameleon.WithPolicyFile(cfg.PolicyFile))
	}
	var times [][]float64
	var bases []string
	var est *Estimator
	if cfg.Timing != nil || cfg.Kernels != nil {
		if times, bases, err = OpTimes(tr, cfg.Kernels, cfg.KernelsFrom); err != nil {
			return nil, err
		}
		// Last, so that it replaces an estimator among cfg.Options. The op
		// times are the very ones the kernels take: the Engine plans with
		// them rather than with the device's spans between its events,
		// which hold the device's idle time wherever the host falls behind.
		est = &Estimator{Trace: tr, Times: times}
		opts = append(opts, chameleon.WithEstimator(est), chameleon.WithMeasuredTimes(false))
	}
	eng, err := chameleon.New(dev, opts...)
	if err != nil {
		return nil, limitErr(err)
	}
	rep := &Report{Trace: tr.Name, Scale: cfg.Scale, LimitBytes: cfg.Limit, Engine: eng}
	if err := eng.PolicyFileError(); err != nil {
		rep.PolicyFileError = err.Error()
	}
	if cfg.Timing != nil {
		rep.Timing, rep.VerifyEvery = true, max(cfg.Timing.VerifyEvery, 0)
	}
	// Release points per iteration, from the memory model (which reads
	// them off the recorded curve).
	frees := make([][][]trace.TensorID, len(tr.Iterations))
	for k, it := range tr.Iterations {
		m := memory.Build(it, memory.LiveOutFromTrace(tr, k))
		frees[k] = make([][]trace.TensorID, len(it.Ops)+1)
		for _, lt := range m.Lifetimes {
			// A storage the recorded curve drops inside its last op (an
			// autograd node releasing what it saved as it returns) no
			// longer counts at that op, but the op still reads it: the
			// replay releases it after.
			at := max(lt.Free, lt.LastUse()+1)
			if !lt.LiveOut && !lt.Tensor.Kind.Persistent() && at <= len(it.Ops) {
				frees[k][at] = append(frees[k][at], lt.Tensor.ID)
			}
		}
	}
	r := &runner{eng: eng, dev: dev, tr: tr, scale: cfg.Scale, tensors: map[trace.TensorID]*live{}, rep: rep, recompute: cfg.Recompute,
		timing: cfg.Timing, times: times, bases: bases, est: est}
	// Parameters and optimizer state first, as a training job allocates
	// them at start: scattered among activations they would fragment the
	// device memory for the whole run.
	for _, it := range tr.Iterations {
		for _, id := range sortedIDs(it) {
			if t := it.Tensors[id]; t.Kind.Persistent() && r.tensors[id] == nil {
				if _, err := r.get(it, id, false); err != nil {
					return rep, fmt.Errorf("replay: %w", err)
				}
			}
		}
	}
	if cfg.Timing != nil {
		if r.unlimited, err = unlimited(dev, eng.ComputeStream(), cfg.Timing, times); err != nil {
			return rep, fmt.Errorf("replay: the kernels alone: %w", err)
		}
		if cfg.Progress != nil {
			for k, it := range tr.Iterations {
				fmt.Fprintf(cfg.Progress, "iter %d alone: %d kernels of %s times, %.2f ms of kernels, unlimited step %.2f ms\n",
					it.Index, len(times[k]), bases[k], sum(times[k])/1000, r.unlimited[k])
			}
		}
	}
	order := cfg.Order
	if len(order) == 0 {
		for range cfg.Rounds {
			for k := range tr.Iterations {
				order = append(order, k)
			}
		}
	}
	var gen uint64
	for n, k := range order {
		it := tr.Iterations[k]
		round := 0
		if len(cfg.Order) == 0 {
			round = n / len(tr.Iterations)
		}
		r.round = round
		if err := r.iteration(k, it, frees[k], &gen); err != nil {
			return rep, fmt.Errorf("replay: round %d iteration %d: %w", round, it.Index, err)
		}
		res := rep.Results[len(rep.Results)-1]
		if cfg.Progress != nil {
			fmt.Fprintf(cfg.Progress, "round %d iter %d: %s ops=%d swaps out=%d in=%d on-demand=%d evictions=%d matched=%d planned=%v cache=%v",
				round, it.Index, res.Stage, res.Ops, res.SwapsOut, res.SwapsIn, res.OnDemand, res.Evictions, res.Matched, res.Planned, res.CacheHit)
			if x := rep.PerIteration[len(rep.PerIteration)-1]; cfg.Timing != nil {
				fmt.Fprintf(cfg.Progress, " measured=%.2fms simulated=%.2fms unlimited=%.2fms", x.MeasuredMS, x.SimulatedMS, x.UnlimitedMS)
			}
			fmt.Fprintln(cfg.Progress)
		}
	}
	st := eng.Stats()
	rep.Stats = st
	rep.Iterations = len(rep.Results)
	rep.PeakDeviceBytes = st.PeakDeviceBytes
	rep.SwappedBytes = st.SwappedOutBytes
	rep.Replans = st.Replans
	rep.CacheHits = st.CacheHits
	rep.OnDemandSwapIns = st.OnDemandIn
	rep.Evictions = st.Evictions
	rep.KeptSwapOuts, rep.KeptBytes = st.KeptEvictions, st.KeptBytes
	rep.PolicyUpdates = st.PolicyUpdates
	rep.Outgrown, rep.Tightened, rep.Refined = st.Outgrown, st.Tightened, st.Refined
	if cfg.PolicyFile != "" {
		if err := eng.SavePolicyFile(cfg.PolicyFile); err != nil {
			return rep, fmt.Errorf("replay: %w", err)
		}
	}
	if cfg.Timing != nil {
		rep.Stable = stableOf(rep.PerIteration)
	}
	return rep, nil
}

func sortedIDs(it *trace.Iteration) []trace.TensorID {
	ids := make([]trace.TensorID, 0, len(it.Tensors))
	for id := range it.Tensors {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

type runner struct {
	eng     *chameleon.Engine
	dev     device.Device
	tr      *trace.Trace
	scale   int64
	tensors map[trace.TensorID]*live
	rep     *Report
	buf     []byte
	want    []byte
	// recompute: ops that may run again get a Recompute (Config.Recompute).
	recompute bool
	round     int // the round being replayed
	// the Engine's allocator counters at the end of the last iteration
	hostWaits, maps, pages int64
	placed, missed, hostA  int64
	// stableTimeline: Report.Timeline is of a STABLE iteration.
	stableTimeline bool
	// A timed replay (Config.Timing): the op times of each trace iteration
	// (µs), where they come from, the Engine's estimator of them and each
	// iteration's kernels alone (ms).
	timing    *Timing
	times     [][]float64
	bases     []string
	est       *Estimator
	unlimited []float64
}

// checked reports whether the bytes of storage id are written and
// verified: all of them, or in a timed replay those Timing.VerifyEvery
// samples.
func (r *runner) checked(id trace.TensorID) bool {
	if r.timing == nil {
		return true
	}
	n := trace.TensorID(r.timing.VerifyEvery)
	return n > 0 && id%n == 0
}

// kernel queues op i's kernel of iteration k on the compute stream, in a
// timed replay.
func (r *runner) kernel(k, i int) error {
	if r.timing == nil {
		return nil
	}
	if err := r.timing.Launch(r.eng.ComputeStream(), usDuration(r.times[k][i])); err != nil {
		return fmt.Errorf("op %d: kernel: %w", i, err)
	}
	return nil
}

func (r *runner) iteration(k int, it *trace.Iteration, frees [][]trace.TensorID, gen *uint64) error {
	e := r.eng
	var start time.Time
	if r.timing != nil {
		start = time.Now()
	}
	outBefore := e.Stats().SwappedOutBytes
	x := e.Begin()
	var begun float64
	if r.timing != nil {
		begun = float64(time.Since(start)) / 1e6
	}
	seen := make(map[trace.TensorID]bool, len(it.Tensors))
	var ok []bool
	if r.recompute {
		ok = mre.Recomputable(it)
	}
	var op chameleon.Op
	var inplace []trace.TensorID
	var issuedAt []int64
	tl := r.timing != nil && r.timing.Timeline != nil
	if tl {
		issuedAt = make([]int64, len(it.Ops))
	}
	for i := range it.Ops {
		o := &it.Ops[i]
		for _, id := range frees[i] {
			if err := r.release(id); err != nil {
				return err
			}
		}
		op = chameleon.Op{Name: o.Name, Overload: o.Overload, Module: o.Module, Phase: o.Phase, In: op.In[:0], Out: op.Out[:0]}
		for _, id := range o.In {
			l, err := r.get(it, id, false)
			if err != nil {
				return err
			}
			seen[id] = true
			op.In = append(op.In, l.t)
		}
		view := layer.Classify(it, o) == layer.KindView
		for _, id := range o.Out {
			if view && slices.Contains(o.In, id) {
				// A view of its input writes nothing (mre.Writes): listed
				// among the outputs, a weight's view would end the host
				// copy the Engine keeps of it, and every swap the plan
				// makes of it with no copy out would copy.
				continue
			}
			if !seen[id] && !it.Tensors[id].Kind.Persistent() {
				// First appearance in this iteration as an output: a new
				// allocation (an id from an earlier round is replaced).
				seen[id] = true
				if err := r.release(id); err != nil {
					return err
				}
			}
			l, err := r.get(it, id, true)
			if err != nil {
				return err
			}
			op.Out = append(op.Out, l.t)
		}
		// Parameters and optimizer state an in-place op writes (an
		// optimizer step lists them among its inputs alone) are among its
		// outputs for the Engine, as a host lists them, and get a fresh
		// pattern: a host copy kept of one from before is stale.
		inplace = inplace[:0]
		if !view && mre.InPlace(o) {
			listed := make(map[trace.TensorID]bool, len(o.Out))
			for _, id := range o.Out {
				listed[id] = true
			}
			for _, id := range o.In {
				if tt := it.Tensors[id]; tt.Kind.Persistent() && !tt.Frozen && !listed[id] {
					listed[id] = true
					inplace = append(inplace, id)
					op.Out = append(op.Out, r.tensors[id].t)
				}
			}
		}
		if r.recompute && ok[i] && len(o.Out) == 1 {
			op.Recompute = r.recomputeOf(o, k, i, *gen+1)
		}
		if err := x.Before(&op); err != nil {
			return err
		}
		// The op "runs": its inputs must hold what was written last.
		for _, id := range o.In {
			if r.checked(id) {
				r.verify(id, i)
			}
		}
		if tl {
			issuedAt[i] = int64(time.Since(start))
			if err := r.timing.Timeline.Launch(e.ComputeStream(), usDuration(r.times[k][i]), i); err != nil {
				return fmt.Errorf("op %d: kernel: %w", i, err)
			}
		} else if err := r.kernel(k, i); err != nil {
			return err
		}
		// A view's output is its input's storage, unchanged; every other
		// output gets a fresh pattern.
		if !view {
			for _, id := range slices.Concat(o.Out, inplace) {
				*gen++
				if err := r.write(id, *gen); err != nil {
					return err
				}
			}
		}
		if err := x.After(&op); err != nil {
			return err
		}
	}
	for _, id := range frees[len(it.Ops)] {
		if err := r.release(id); err != nil {
			return err
		}
	}
	held := 0
	for id := range r.tensors {
		if tt := it.Tensors[id]; tt != nil && !tt.Kind.Persistent() {
			held++
		}
	}
	var measured, issued float64
	if r.timing != nil {
		issued = float64(time.Since(start)) / 1e6
		if err := r.dev.SyncStream(e.ComputeStream()); err != nil {
			return fmt.Errorf("sync of the compute stream: %w", err)
		}
		measured = float64(time.Since(start)) / 1e6
	}
	if r.est != nil {
		r.est.current = k // End plans this iteration's profile
	}
	res := x.End()
	r.rep.Results = append(r.rep.Results, res)
	// Every byte copied out in the iteration, forced evictions too, as the
	// run's total counts them (Stats.SwappedOutBytes).
	swapped := e.Stats().SwappedOutBytes - outBefore
	ir := IterationReport{Round: r.round, Iter: it.Index, Stage: res.Stage.String(),
		PlannedSwaps: res.SwapsOut, PlannedRecomputes: res.Recomputes, OnDemandSwapIns: res.OnDemand, Evictions: res.Evictions,
		DeferredPrefetches: res.Deferrals, SwappedBytes: swapped, SimulatedMS: res.SimulatedMS, Held: held}
	if r.timing != nil {
		ir.OpTimes, ir.KernelMS, ir.UnlimitedMS, ir.MeasuredMS = r.bases[k], sum(r.times[k])/1000, r.unlimited[k], measured
		ir.IssuedMS, ir.BeginMS = issued, begun
	}
	if tl {
		st, err := r.timing.Timeline.Stamps(len(it.Ops))
		if err != nil {
			return fmt.Errorf("timeline: %w", err)
		}
		names := make([]string, len(it.Ops))
		for i := range it.Ops {
			names[i] = it.Ops[i].Name
		}
		sp := spans(names, issuedAt, st)
		stallsOf(&ir, sp, 5)
		var cp []CopySpan
		if ct, ok := r.timing.Timeline.(CopyTimeline); ok && len(st) > 0 {
			cs, err := ct.Copies()
			if err != nil {
				return fmt.Errorf("timeline: %w", err)
			}
			cp = copySpans(cs, st[0].Start)
			ir.D2H, ir.H2D = linkOf(cp, true), linkOf(cp, false)
			parts := trace.StepParts(it.Ops)
			ir.LinkParts = partsOf(parts, sp, cp)
			if sim := e.Simulation(); sim != nil && sim.Result != nil && len(sim.Result.Ops) == len(it.Ops) {
				ir.LinkPartsSimulated = sim.Result.PartsBusy(parts)
			}
			for _, c := range cp {
				if c.Recompute {
					ir.RecomputeKernelMS += (c.EndUS - c.StartUS) / 1e3
				}
			}
		}
		ir.WorstLayers = worstLayers(sp, cp, e.GroupTimes(), 3)
		if stable := ir.Stage == "STABLE"; stable || !r.stableTimeline {
			r.stableTimeline = stable
			r.rep.Timeline, r.rep.TimelineCopies, r.rep.TimelineSim = sp, cp, e.Simulation()
			r.rep.TimelineOf = fmt.Sprintf("round %d iteration %d, %s", r.round, it.Index, ir.Stage)
		}
	}
	st := e.Stats()
	ir.HostWaits, ir.Maps, ir.MappedPages = st.HostWaits-r.hostWaits, st.Maps-r.maps, st.MappedPages-r.pages
	r.hostWaits, r.maps, r.pages = st.HostWaits, st.Maps, st.MappedPages
	ir.Placed, ir.Missed = st.Placed-r.placed, st.Missed-r.missed
	r.placed, r.missed = st.Placed, st.Missed
	ir.HostAllocs, r.hostA = st.HostAllocs-r.hostA, st.HostAllocs
	r.rep.PerIteration = append(r.rep.PerIteration, ir)
	r.rep.Stages = append(r.rep.Stages, res.Stage.String())
	if res.PlanError != nil {
		r.rep.PlanErrors = append(r.rep.PlanErrors, res.PlanError.Error())
	}
	return nil
}

// recomputeOf is op i's Recompute (of iteration k): the inputs still hold
// what they held when it ran (the Engine kept them), and its output gets
// the pattern of generation gen, which it wrote then, again. In a timed
// replay it is a kernel of the op's time, and checks and writes only the
// storages Timing.VerifyEvery samples.
func (r *runner) recomputeOf(o *trace.Op, k, i int, gen uint64) func() error {
	ins := make([]*live, len(o.In))
	for x, id := range o.In {
		ins[x] = r.tensors[id]
	}
	inGen := make([]uint64, len(ins))
	for x, l := range ins {
		inGen[x] = l.gen
	}
	out, id := r.tensors[o.Out[0]], o.Out[0]
	return func() error {
		for x, l := range ins {
			if l.gen != inGen[x] {
				r.fail(fmt.Sprintf("recompute of op %d: input %d was written since", i, o.In[x]))
			}
			if r.checked(o.In[x]) {
				r.verifyLive(l, o.In[x], i)
			}
		}
		r.rep.Recomputes++
		var ct CopyTimeline
		if r.timing != nil {
			ct, _ = r.timing.Timeline.(CopyTimeline)
		}
		var err error
		if ct != nil {
			err = ct.AroundRecompute(r.eng.ComputeStream(), i, func() error { return r.kernel(k, i) })
		} else {
			err = r.kernel(k, i)
		}
		if err != nil {
			return fmt.Errorf("recompute: %w", err)
		}
		return r.writeLive(out, id, gen)
	}
}

// get returns the live storage id, allocating it on first sight.
func (r *runner) get(it *trace.Iteration, id trace.TensorID, out bool) (*live, error) {
	if l := r.tensors[id]; l != nil {
		return l, nil
	}
	tt := it.Tensors[id]
	kind := chameleon.Activation
	switch {
	case tt.Frozen && tt.Kind == trace.KindParam:
		// Read-only for the run: set once (Fill) and never copied out
		// again.
		kind = chameleon.Frozen
	case tt.Kind.Persistent():
		kind = chameleon.Persistent
	}
	size, err := Scaled(tt.Bytes, r.scale) // checked by checkSizes
	if err != nil {
		return nil, fmt.Errorf("tensor %d (%d bytes, declared at %s): %w", id, tt.Bytes, where(r.tr, tt.Line), err)
	}
	t, err := r.eng.NewTensor(size, kind, tt.DType, tt.Shape)
	if err != nil {
		return nil, fmt.Errorf("tensor %d (%d bytes, declared at %s): %w", id, tt.Bytes, where(r.tr, tt.Line), err)
	}
	l := &live{t: t}
	r.tensors[id] = l
	if !out {
		// Live-in storage first seen as an input (parameters, state made
		// before the trace): give it contents now; a frozen parameter
		// through Fill, its one write.
		gen := uint64(id)<<32 | 0xfeed
		if kind == chameleon.Frozen {
			l.gen = gen
			n := int(size)
			if cap(r.buf) < n {
				r.buf = make([]byte, n)
			}
			b := r.buf[:n]
			if r.checked(id) {
				fill(b, id, gen)
			} else {
				clear(b)
			}
			if err := r.eng.Fill(t, b); err != nil {
				return nil, fmt.Errorf("tensor %d (%d bytes, declared at %s): %w", id, tt.Bytes, where(r.tr, tt.Line), err)
			}
			return l, nil
		}
		if err := r.write(id, gen); err != nil {
			return nil, err
		}
	}
	return l, nil
}

func (r *runner) release(id trace.TensorID) error {
	l := r.tensors[id]
	if l == nil {
		return nil
	}
	delete(r.tensors, id)
	return r.eng.Release(l.t)
}

// fill writes the pattern of (id, gen) into b: a xorshift stream, so any
// misplaced or stale byte shows.
func fill(b []byte, id trace.TensorID, gen uint64) {
	s := uint64(id)*0x9E3779B97F4A7C15 ^ gen*0xBF58476D1CE4E5B9 | 1
	for i := range b {
		s ^= s << 13
		s ^= s >> 7
		s ^= s << 17
		b[i] = byte(s)
	}
}

func (r *runner) write(id trace.TensorID, gen uint64) error {
	return r.writeLive(r.tensors[id], id, gen)
}

// writeLive writes the pattern of (id, gen) into l's tensor; of a storage
// whose bytes are not checked (checked) it only notes the generation.
func (r *runner) writeLive(l *live, id trace.TensorID, gen uint64) error {
	l.gen = gen
	if !r.checked(id) {
		return nil
	}
	n := int(l.t.Size())
	if cap(r.buf) < n {
		r.buf = make([]byte, n)
	}
	b := r.buf[:n]
	fill(b, id, gen)
	return r.dev.WriteDevice(l.t.Ptr(), b)
}

func (r *runner) verify(id trace.TensorID, op int) { r.verifyLive(r.tensors[id], id, op) }

// verifyLive checks that l's tensor holds the pattern written last.
func (r *runner) verifyLive(l *live, id trace.TensorID, op int) {
	n := int(l.t.Size())
	if cap(r.buf) < n {
		r.buf = make([]byte, n)
	}
	if cap(r.want) < n {
		r.want = make([]byte, n)
	}
	got, want := r.buf[:n], r.want[:n]
	if err := r.dev.ReadDevice(got, l.t.Ptr()); err != nil {
		r.fail(fmt.Sprintf("op %d: tensor %d: read: %v", op, id, err))
		return
	}
	fill(want, id, l.gen)
	if string(got) != string(want) {
		r.fail(fmt.Sprintf("op %d: tensor %d (%d bytes): contents differ from what was written", op, id, n))
		return
	}
	r.rep.VerifiedUses++
}

func (r *runner) fail(msg string) {
	r.rep.FailedUses++
	if len(r.rep.Failures) < 20 {
		r.rep.Failures = append(r.rep.Failures, msg)
	}
}

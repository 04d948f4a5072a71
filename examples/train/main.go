// Command train trains a deep residual MLP in Go with every activation in
// memory managed by the chameleon Engine, under a device memory limit that
// forces the Engine to swap, and shows that the limit changes nothing but
// memory and time: with the same seed the loss curve is bitwise the curve
// of a run without the limit.
//
//	go run ./examples/train                          # host backend, 50% of the unlimited peak
//	go run ./examples/train --dynamic --steps 60     # layers skipped in phases: detection, re-planning, policy cache hits
//	go run ./examples/train --device cuda --layers 32 --width 2048 --batch 65536 --limit 40%
//	go run ./examples/train --ranks 3 --batch 1536 --verify  # data-parallel ranks, one host device each
//
// A percent limit is of the peak device bytes measured in a run of the same
// model without a limit (its first --baseline-steps steps, on a reservation
// sized from the model's analytic upper bound). That run also gives the
// step time without a limit, which the summary compares with the limited
// run's and with the simulator's prediction.
//
// On the host backend (the default) device memory is Go memory and kernels
// are pure Go, queued on the Engine's compute stream. With --device cuda,
// device memory, streams and copies go through libcudart (device/cuda), the
// GEMMs through cuBLAS and the elementwise kernels through NVRTC and the
// driver API (package gpu), all loaded with purego: the binary builds with
// CGO_ENABLED=0.
//
// With --ranks N the command trains data-parallel: N goroutines, each on a
// device of its own (GPU r with --device cuda, a host device each with
// --device host) with an Engine of its own, each on batch/N rows of the
// global batch. The gradients and the loss are averaged over the ranks
// before the optimizer step (in Go on the host backend, ncclAllReduce on
// CUDA), and the Engines share one policy: rank 0 plans, the others adopt
// it over the policy channel (--rank-channel: in-process, or NCCL
// broadcasts between the GPUs). A percent --limit is of one rank's peak
// and holds on every rank.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/chameleon-go/chameleon"
	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/examples/internal/cli"
	"github.com/chameleon-go/chameleon/seq"
)

func main() {
	os.Exit(runMain(os.Args[1:], os.Stdout, os.Stderr))
}

// errUsage marks a bad command line (exit 2); the flag package has printed
// its own errors and the usage already.
var errUsage = cli.ErrUsage

// runMain runs the command and returns its exit status: 0 done (or -h),
// 1 the run failed, 2 a bad command line.
func runMain(args []string, stdout, stderr io.Writer) int {
	err := run(args, stdout, stderr)
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		if msg := strings.TrimSuffix(err.Error(), ": "+errUsage.Error()); msg != errUsage.Error() {
			fmt.Fprintln(stderr, "train:", msg)
		}
		return 2
	}
	fmt.Fprintln(stderr, "train:", err)
	return 1
}

// usagef is a bad flag value: exit 2.
func usagef(format string, args ...any) error { return cli.Usagef(format, args...) }

// options are the command's flags.
type options struct {
	device        string
	limit         string
	steps         int
	baselineSteps int
	limitBatch    int
	dynamic       bool
	phase         int
	patterns      int
	seed          uint64
	model         Model
	lr, momentum  float64
	minSwap       string
	hostBW        float64
	workers       int
	tf32          bool
	pageSize      string
	placement     bool
	syncPlanning  bool
	tiers         string
	arch          string
	hostReserve   string
	verify        bool
	recompute     bool
	hoist         bool
	phaseTimes    bool
	timing        bool
	estimated     bool
	quiet         bool
	ranks         int
	rankChannel   string
	rankTimeout   time.Duration
	hostBudget    string
	// syncSet: --sync-planning was given on the command line.
	syncSet bool
}

func parse(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("train", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.device, "device", "host", "host (pure Go) or cuda (libcudart, cuBLAS, NVRTC through purego)")
	fs.StringVar(&o.limit, "limit", "50%", "device memory limit: a share of the unlimited run's peak in (0%, 100%], or bytes with a unit (512MiB, 12GiB, 1e9B); none runs only without a limit")
	fs.IntVar(&o.steps, "steps", 40, "training steps")
	fs.IntVar(&o.limitBatch, "limit-batch", 0, "a percent --limit is of the unlimited peak at this batch, measured in a run of its own, instead of --batch's: --batch 4096 --limit-batch 1024 --limit 100% trains 4x the batch in the memory batch 1024 needs; the summary compares the time per sample (0: --batch)")
	fs.IntVar(&o.baselineSteps, "baseline-steps", 3, "steps of the run without a limit that measures the peak and the step time")
	fs.BoolVar(&o.dynamic, "dynamic", false, "skip a random set of blocks in phases of --phase steps: the operator sequence changes while training")
	fs.IntVar(&o.phase, "phase", 12, "steps each skip pattern holds (--dynamic); the Engine plans after 5 warm-up and 1 profiled step")
	fs.IntVar(&o.patterns, "patterns", 3, "distinct skip patterns, pattern 0 skipping nothing (--dynamic)")
	fs.Uint64Var(&o.seed, "seed", 1, "seed of the initialization, the data and the skip patterns")
	fs.IntVar(&o.model.Layers, "layers", 8, "residual blocks")
	fs.IntVar(&o.model.Width, "width", 64, "residual stream width")
	fs.IntVar(&o.model.FFN, "ffn", 0, "hidden width of a block (0: --width)")
	fs.IntVar(&o.model.Batch, "batch", 1024, "batch size")
	fs.IntVar(&o.model.In, "in", 64, "input features")
	fs.IntVar(&o.model.Out, "out", 16, "output features")
	fs.IntVar(&o.model.TeacherHidden, "teacher", 128, "hidden width of the teacher network")
	fs.IntVar(&o.model.LossChunks, "loss-chunks", 0, "compute the head and the loss this many chunks of the batch at a time, each chunk's target and prediction a tensor of its own, so that no op lists the whole batch's predictions (a wide --out: the chunked loss over a language model's logits); 0: the batch whole")
	fs.Float64Var(&o.lr, "lr", 0, "learning rate (0: DefaultLR of the width, 0.02 at width 64)")
	fs.Float64Var(&o.momentum, "momentum", 0.9, "SGD momentum")
	fs.StringVar(&o.minSwap, "min-swap", "auto", "smallest tensor the planner swaps (auto: 1 MiB, or one batch x width activation when smaller)")
	fs.Float64Var(&o.hostBW, "host-bw", 0, "host backend: model a host link of this many GB/s each way (0: instantaneous copies)")
	fs.IntVar(&o.workers, "workers", 0, "host backend: goroutines per GEMM (0: GOMAXPROCS)")
	fs.StringVar(&o.pageSize, "page-size", "", "cuda: bytes of each mapped page, a power of two of at least 2MiB (default: the device's rule for the limit)")
	fs.BoolVar(&o.syncPlanning, "sync-planning", false, "each step that ends a profile waits for its plan (chameleon.WithSyncPlanning): the same steps on every machine")
	fs.BoolVar(&o.placement, "placement", true, "serve each device block at the address the allocator planned from the step before, once a policy runs (chameleon.WithPlacement); false: best fit")
	fs.StringVar(&o.tiers, "tiers", "100", "shares of the limit the Engine plans for in turn, in percent (chameleon.WithTiers, an escape hatch): 100, the Engine's default, plans for the limit, lowered as the plan's layout needs")
	fs.BoolVar(&o.tf32, "tf32", false, "cuda: let cuBLAS use TF32 tensor cores for the fp32 GEMMs")
	fs.StringVar(&o.arch, "arch", "compute_90", "cuda: NVRTC --gpu-architecture of the elementwise kernels")
	fs.StringVar(&o.hostReserve, "host-reserve", "0", "pinned host bytes to reserve up front for swapped tensors (0: grow on first need, during warm-up)")
	fs.BoolVar(&o.phaseTimes, "phase-times", false, "wait for the device at the end of each forward and report forward and backward times apart (one more sync per step)")
	fs.BoolVar(&o.verify, "verify", false, "run the unlimited baseline for all --steps and compare the loss curves bit for bit")
	fs.BoolVar(&o.recompute, "recompute", false, "let the Engine drop activations of the forward's ops and run the ops again before their use, beside swaps")
	fs.BoolVar(&o.hoist, "hoist", false, "step each parameter in the backward, as soon as its gradient is final (an optimizer hook on the gradients), instead of all of them at the step's end: the same losses, bit for bit")
	fs.BoolVar(&o.timing, "timing", false, "print the policy's layer times (planned, simulated, sampled on the device) and the link the executor's copies measured against the raw copy rate")
	fs.BoolVar(&o.estimated, "estimated", false, "plan on the estimator's op times and the configured link, not on measured ones (chameleon.WithMeasuredTimes(false))")
	fs.BoolVar(&o.quiet, "quiet", false, "print only the summary")
	fs.IntVar(&o.ranks, "ranks", 1, "data-parallel ranks, one device each (GPU r on cuda), each on --batch/ranks rows of the global batch, gradients averaged over them")
	fs.StringVar(&o.rankChannel, "rank-channel", "", "the channel rank 0 sends its policies over: local (in-process) or nccl (cuda; NCCL broadcasts between the GPUs). Default: none with --ranks 1, local on host, nccl on cuda; given with --ranks 1, the rank machinery runs with one rank")
	fs.DurationVar(&o.rankTimeout, "rank-timeout", chameleon.DefaultRankTimeout, "how long a rank waits for rank 0's policy (chameleon.WithRankTimeout), and for the NCCL channel to connect")
	fs.StringVar(&o.hostBudget, "host-budget", "0", "pinned host bytes of the node, shared by the ranks of the limited run (chameleon.WithHostBudget(total, ranks)); 0: none, each Engine's pool grows as it needs")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, errUsage
	}
	if fs.NArg() > 0 {
		return nil, usagef("unexpected argument %q: every input is a flag (train -h)", fs.Arg(0))
	}
	fs.Visit(func(f *flag.Flag) { o.syncSet = o.syncSet || f.Name == "sync-planning" })
	if o.model.FFN == 0 {
		o.model.FFN = o.model.Width
	}
	if err := o.model.Validate(); err != nil {
		return nil, usagef("%v", err)
	}
	if err := o.check(); err != nil {
		return nil, err
	}
	return o, nil
}

// check validates every flag before any work.
func (o *options) check() error {
	switch {
	case o.steps < 1 || o.baselineSteps < 1:
		return usagef("--steps %d and --baseline-steps %d must be at least 1", o.steps, o.baselineSteps)
	case o.device != "host" && o.device != "cuda":
		return usagef("--device %q: want host or cuda", o.device)
	case o.phase < 1:
		return usagef("--phase %d: want at least 1 step", o.phase)
	case o.patterns < 1:
		return usagef("--patterns %d: want at least 1", o.patterns)
	case o.lr < 0 || o.momentum < 0:
		return usagef("--lr %g and --momentum %g cannot be negative", o.lr, o.momentum)
	case o.hostBW < 0:
		return usagef("--host-bw %g: cannot be negative", o.hostBW)
	case o.workers < 0:
		return usagef("--workers %d: cannot be negative", o.workers)
	case o.ranks < 1:
		return usagef("--ranks %d: want at least 1", o.ranks)
	case o.limitBatch < 0 || (o.limitBatch > 0 && o.ranks > 1):
		return usagef("--limit-batch %d: want 0, or a batch with --ranks 1", o.limitBatch)
	case o.model.Batch%o.ranks != 0:
		return usagef("--batch %d is not divisible by --ranks %d: each rank trains on batch/ranks rows of the global batch", o.model.Batch, o.ranks)
	case o.model.LossChunks > o.model.Batch/o.ranks:
		return usagef("--loss-chunks %d is more than the %d rows of the batch each rank trains on", o.model.LossChunks, o.model.Batch/o.ranks)
	case o.limitBatch > 0 && o.model.LossChunks > o.limitBatch:
		return usagef("--loss-chunks %d is more than the %d rows of --limit-batch", o.model.LossChunks, o.limitBatch)
	case o.rankChannel != "" && o.rankChannel != "local" && o.rankChannel != "nccl":
		return usagef("--rank-channel %q: want local or nccl", o.rankChannel)
	case o.rankChannel == "nccl" && o.device != "cuda":
		return usagef("--rank-channel nccl: NCCL runs between GPUs, want --device cuda (or --rank-channel local)")
	case o.rankTimeout <= 0:
		return usagef("--rank-timeout %v: want a positive duration", o.rankTimeout)
	}
	if _, err := parseLimit(o.limit, 1<<40); err != nil {
		return err
	}
	if _, err := minSwap(o.minSwap, o.model); err != nil {
		return usagef("--min-swap: %v", err)
	}
	reserve, err := chameleon.ParseBytes(o.hostReserve)
	if err != nil {
		return usagef("--host-reserve: %v", err)
	}
	budget, err := chameleon.ParseBytes(o.hostBudget)
	if err != nil {
		return usagef("--host-budget: %v", err)
	}
	if budget > 0 {
		share := budget / int64(o.ranks) &^ (device.BlockSize - 1)
		switch {
		case share < device.BlockSize:
			return usagef("--host-budget %s: a share of %d bytes a rank is below one %d-byte block", o.hostBudget, share, device.BlockSize)
		case reserve > share:
			return usagef("--host-reserve %s is above a rank's share of --host-budget %s, %d bytes", o.hostReserve, o.hostBudget, share)
		}
	}
	return nil
}

// hostLink is the host backend's modeled link each way (0: none).
func hostLink(o *options) float64 {
	if o.device == "host" && o.hostBW > 0 {
		return o.hostBW * 1e9
	}
	return 0
}

func run(args []string, out, stderr io.Writer) error {
	o, err := parse(args, stderr)
	if err != nil {
		return err
	}
	_, err = train(o, out)
	return err
}

// outcome is what a command's runs gave, for the summary and the tests.
type outcome struct {
	// Base and Limited are the runs without and with the limit, a report
	// per rank (Limited nil under --limit none).
	Base, Limited []*Report
	// Ref is one device at the global batch, run with --verify when the
	// command runs ranks.
	Ref          *Report
	Limit, Peak  int64
	Ranks        int
	Channel      string
	Model        Model // one rank's
	GlobalBatch  int
	BaseMS       float64
	HostBudget   int64
	SyncPlanning bool
}

// train runs the command's runs after parse.
func train(o *options, out io.Writer) (*outcome, error) {
	tiers, err := chameleon.ParseTiers(o.tiers)
	if err != nil {
		return nil, usagef("--tiers: %v", err)
	}
	var page int64
	if o.pageSize != "" {
		if page, err = chameleon.ParseBytes(o.pageSize); err != nil {
			return nil, cli.Usagef("--page-size: %v", err)
		}
	}
	j, err := openJob(o, page)
	if err != nil {
		return nil, err
	}
	defer j.Close()
	b := j.backends[0]
	m := o.model
	m.Batch /= j.n
	res := &outcome{Ranks: j.n, Channel: j.channel, Model: m, GlobalBatch: o.model.Batch}
	lr := float32(o.lr)
	if lr == 0 {
		lr = DefaultLR(m.Width)
	}
	cfg := Config{Model: m, Steps: o.steps, LR: lr, Momentum: float32(o.momentum), Seed: o.seed,
		Dynamic: o.dynamic, Phase: o.phase, Patterns: o.patterns, Link: hostLink(o), Estimator: b.Est, PhaseSync: o.phaseTimes, Recompute: o.recompute, Hoist: o.hoist}
	if cfg.MinSwap, err = minSwap(o.minSwap, m); err != nil {
		return nil, err
	}
	reserve, err := chameleon.ParseBytes(o.hostReserve)
	if err != nil {
		return nil, fmt.Errorf("--host-reserve: %w", err)
	}
	if res.HostBudget, err = chameleon.ParseBytes(o.hostBudget); err != nil {
		return nil, fmt.Errorf("--host-budget: %w", err)
	}
	fmt.Fprintf(out, "device %s: %d blocks, width %d, ffn %d, batch %d; parameters %s (x3 with gradients and momentum), saved activations %s per step\n",
		b.Dev.Name(), m.Layers, m.Width, m.FFN, m.Batch, bytesStr(m.ParamBytes()), bytesStr(m.SavedActivationBytes()))
	if j.ranked {
		names := make([]string, j.n)
		for r, rb := range j.backends {
			names[r] = rb.Dev.Name()
		}
		grads := "averaged in Go"
		switch {
		case j.grads != nil:
			grads = "averaged with ncclAllReduce (NCCL " + ncclVersion(j) + ")"
		case o.device == "cuda":
			grads = "kept as they are (one rank)"
		}
		fmt.Fprintf(out, "ranks %d: %d rows each of a global batch of %d; policies over the %s channel, gradients and loss %s; devices %s\n",
			j.n, m.Batch, o.model.Batch, j.channel, grads, strings.Join(names, ", "))
	}
	// Ranks exchange policies at the iteration each plans a sequence:
	// with NCCL, rank 0's broadcast is best queued there too, among the
	// gradients' collectives, not where its planning worker happens to
	// finish.
	res.SyncPlanning = o.syncPlanning || (j.ranked && j.n > 1 && j.channel == "nccl" && !o.syncSet)

	// The run without a limit: its reservation covers the analytic upper
	// bound, and is doubled if the Engine still had to evict.
	base := cfg
	base.Steps = o.baselineSteps
	if o.verify {
		base.Steps = o.steps
	}
	base.Limit = m.UpperBoundBytes()
	base.SyncPlanning = res.SyncPlanning && j.ranked
	noLimit := strings.TrimSpace(o.limit) == "none"
	if noLimit {
		base.Steps = o.steps
		if !o.quiet {
			base.Progress = func(s Step) { printStep(out, s, o.dynamic) }
		}
	}
	free := j.free()
	for {
		if free > 0 && base.Limit > free*9/10 {
			base.Limit = free * 9 / 10
		}
		fmt.Fprintf(out, "unlimited run: %d steps on a reservation of %s\n", base.Steps, bytesStr(base.Limit))
		res.Base, err = j.train(base)
		if err != nil {
			return res, fmt.Errorf("unlimited run: %w", err)
		}
		var swaps int64
		for _, r := range res.Base {
			swaps += r.Stats.SwapsOut
		}
		if swaps == 0 || (free > 0 && base.Limit >= free*9/10) {
			break
		}
		base.Limit *= 2
	}
	baseRep := res.Base[0]
	for _, r := range res.Base {
		res.Peak = max(res.Peak, r.Stats.PeakDeviceBytes)
	}
	peak := res.Peak
	baseMS := medianMS(baseRep.Steps[min(1, len(baseRep.Steps)-1):], nil)
	res.BaseMS = baseMS
	fmt.Fprintf(out, "unlimited: peak %s (persistent %s), step %.2f ms (median after the first)\n",
		bytesStr(peak), bytesStr(m.PersistentBytes()), baseMS)

	// The summary speaks of one rank's model (the whole one without ranks).
	so := *o
	so.model = m
	limitPeak := peak
	var small *smallBatch
	if o.limitBatch > 0 && !noLimit {
		if small, err = runSmall(j, base, o, out); err != nil {
			return res, err
		}
		limitPeak = small.peak
	}
	limit, err := parseLimit(o.limit, limitPeak)
	if err != nil {
		return res, err
	}
	if limit == 0 {
		printSummary(out, &so, baseRep, nil, 0, peak, baseMS)
		if j.ranked {
			if err := reference(j, o, cfg, free, res); err != nil {
				return res, err
			}
			printRanks(out, o, res)
		}
		return res, nil
	}
	res.Limit = limit
	cfg.Limit = limit
	cfg.StepMS = baseMS
	if reserve > 0 {
		cfg.Options = append(cfg.Options, chameleon.WithHostReserve(reserve))
	}
	if res.HostBudget > 0 {
		cfg.Options = append(cfg.Options, chameleon.WithHostBudget(res.HostBudget, j.n))
	}
	if !o.quiet {
		cfg.Progress = func(s Step) { printStep(out, s, o.dynamic) }
	}
	if o.estimated {
		cfg.Options = append(cfg.Options, chameleon.WithMeasuredTimes(false))
	}
	cfg.Options = append(cfg.Options, chameleon.WithPlacement(o.placement))
	cfg.SyncPlanning = res.SyncPlanning
	cfg.Options = append(cfg.Options, chameleon.WithTiers(tiers...))
	var raw *rawRates
	if o.timing {
		measure := func() (err error) {
			raw, err = rawLink(b.Dev, rawCopyBytes(limit), 4)
			return err
		}
		if j.ranked {
			err = onDevice(b.Dev, measure)
		} else {
			err = measure()
		}
		if err != nil {
			return res, fmt.Errorf("raw copy rate: %w", err)
		}
	}
	fmt.Fprintf(out, "limited run: %d steps, limit %s (%.0f%% of the unlimited peak); the unlimited peak less persistent bytes is %.2fx the limit\n",
		cfg.Steps, bytesStr(limit), 100*float64(limit)/float64(peak), float64(peak-m.PersistentBytes())/float64(limit))
	res.Limited, err = j.train(cfg)
	if err != nil {
		return res, fmt.Errorf("limited run: %w", err)
	}
	rep := res.Limited[0]
	printSummary(out, &so, baseRep, rep, limit, peak, baseMS)
	if small != nil {
		printPerSample(out, small, m.Batch, baseMS, rep)
	}
	if j.ranked {
		if err := reference(j, o, cfg, free, res); err != nil {
			return res, err
		}
		printRanks(out, o, res)
	}
	if o.timing {
		printTiming(out, rep, raw)
	}
	return res, nil
}

// reference is, with --verify, the run the ranks are checked against:
// one device (rank 0's) at the global batch, without a limit (its
// reservation bounded by the device, as the unlimited run's: a run that
// must swap there still gives the same losses).
func reference(j *job, o *options, cfg Config, free int64, res *outcome) error {
	if !o.verify {
		return nil
	}
	ref := cfg
	ref.Model = o.model
	ref.Steps = o.steps
	ref.Limit = ref.UpperBoundBytes()
	if free > 0 && ref.Limit > free*9/10 {
		ref.Limit = free * 9 / 10
	}
	ref.StepMS, ref.Options, ref.Progress, ref.Rank, ref.Reduce = 0, nil, nil, 0, nil
	ref.SyncPlanning = o.syncPlanning
	ref.MinSwap, _ = minSwap(o.minSwap, ref.Model)
	var err error
	if res.Ref, err = j.single(ref); err != nil {
		return fmt.Errorf("one device at the global batch of %d (--verify): %w", ref.Batch, err)
	}
	return nil
}

func printStep(out io.Writer, s Step, dynamic bool) {
	r := s.Result
	line := fmt.Sprintf("step %4d  loss %.6f  %9.2f ms  peak %9s  swapped out %.4f GB in %.4f GB  %-10s  swaps %d/%d on-demand %d evictions %d recomputes %d pages mapped %d host waits %d placed %d",
		s.Index, s.Loss, float64(s.Time.Microseconds())/1000, bytesStr(s.Peak), float64(s.Out)/1e9, float64(s.In)/1e9,
		r.Stage, r.SwapsOut, r.SwapsIn, r.OnDemand, s.Evictions, s.Recomputes, s.Pages, s.HostWaits, s.Placed)
	if dynamic {
		line += fmt.Sprintf("  pattern %d ops %d changed=%v planned=%v cache_hit=%v", s.Pattern, r.Ops, r.Detect.Changed, r.Planned, r.CacheHit)
		if r.Detect.Changed {
			line += " (" + r.Detect.Reason + ")"
		}
	} else if r.Planned || r.CacheHit {
		line += fmt.Sprintf("  planned=%v cache_hit=%v", r.Planned, r.CacheHit)
	}
	if r.PlanError != nil {
		line += "  plan: " + r.PlanError.Error()
	}
	fmt.Fprintln(out, line)
}

func printSummary(out io.Writer, o *options, base, rep *Report, limit, peak int64, baseMS float64) {
	fmt.Fprintln(out, "summary:")
	if rep == nil {
		ls := base.Losses()
		fmt.Fprintf(out, "  loss %.6f -> %.6f over %d steps without a limit (min %.6f); peak %s, step %.2f ms\n",
			ls[0], ls[len(ls)-1], len(ls), slices.Min(ls), bytesStr(peak), baseMS)
		return
	}
	ls := rep.Losses()
	st := rep.Stats
	fmt.Fprintf(out, "  loss %.6f -> %.6f over %d steps (min %.6f)\n", ls[0], ls[len(ls)-1], len(ls), slices.Min(ls))
	fmt.Fprintf(out, "  device memory: limit %s, peak %s (%s), unlimited peak %s; saved activations by the model's count %s = %.2fx the limit\n",
		bytesStr(limit), bytesStr(st.PeakDeviceBytes), okStr(st.PeakDeviceBytes <= limit, "within the limit", "OVER THE LIMIT"),
		bytesStr(peak), bytesStr(o.model.SavedActivationBytes()), float64(o.model.SavedActivationBytes())/float64(limit))
	stable := func(s Step) bool { return s.Result.Stage == seq.Stable }
	steady := rep.Steps[min(1, len(rep.Steps)-1):]
	ms := medianMS(steady, stable)
	what := "STABLE steps"
	if math.IsNaN(ms) {
		ms, what = medianMS(steady, nil), "steps after the first"
	}
	fmt.Fprintf(out, "  step time: %.2f ms without the limit, %.2f ms with it (median of %s): %+.1f%%%s\n",
		baseMS, ms, what, 100*(ms/baseMS-1), fasterNote(base.Steps[min(1, len(base.Steps)-1):], baseMS, ms))
	var out_, in_ int64
	var n int
	for _, s := range steady {
		if what != "STABLE steps" || stable(s) {
			out_ += s.Out
			in_ += s.In
			n++
		}
	}
	if n > 0 {
		fmt.Fprintf(out, "  swapped per step (%s): %.3f GB out, %.3f GB in; total %.3f GB out\n",
			what, float64(out_)/float64(n)/1e9, float64(in_)/float64(n)/1e9, float64(st.SwappedOutBytes)/1e9)
	}
	fmt.Fprintf(out, "  engine: %d policies planned (%d refined under a policy), %d cache hits, %d infeasible, %d forced evictions, %d on-demand swap-ins, %d swaps out, %d recomputes\n",
		st.Replans, st.Refined, st.CacheHits, st.Infeasible, st.Evictions, st.OnDemandIn, st.SwapsOut, st.Recomputes)
	fmt.Fprintf(out, "  device allocator: %d blocks at their planned place, %d missed it (%d plans); %d pages mapped after the start, %d host waits\n",
		st.Placed, st.Missed, st.Placements, st.MappedPages, st.HostWaits)
	// The counts above are the whole run's, warm-up included; a policy's
	// steps should add none of the first four.
	var sn int
	var ev, od, pages, waits, placed, hostAllocs int64
	for _, s := range rep.Steps {
		if stable(s) {
			sn++
			ev, od, pages, waits, placed = ev+s.Evictions, od+s.Result.OnDemand, pages+s.Pages, waits+s.HostWaits, placed+s.Placed
			hostAllocs += s.HostAllocs
		}
	}
	if sn > 0 {
		fmt.Fprintf(out, "  in the %d STABLE steps: %d forced evictions, %d on-demand swap-ins, %d pages mapped, %d host waits, %d blocks placed, %d pinned host allocations\n",
			sn, ev, od, pages, waits, placed, hostAllocs)
	}
	if k := len(rep.Sims); k > 0 {
		sim := rep.Sims[k-1]
		fmt.Fprintf(out, "  simulator (last policy): predicted %.2f ms = %.2f ms compute + %.2f ms recomputes + %.2f ms stalls; measured %.2f ms\n",
			sim.IterationUS/1000, sim.BaseUS/1000, sim.RecomputeUS/1000, sim.StallUS/1000, ms)
		if o.phaseTimes {
			fmt.Fprintf(out, "  simulator forward: ends at %.2f ms\n", rep.SimForwardUS[k-1]/1000)
		}
	}
	if o.phaseTimes {
		fwd := func(r *Report) float64 {
			var v []float64
			for _, s := range r.Steps[min(1, len(r.Steps)-1):] {
				v = append(v, float64(s.Forward.Microseconds())/1000)
			}
			slices.Sort(v)
			return v[len(v)/2]
		}
		bf, lf := fwd(base), fwd(rep)
		fmt.Fprintf(out, "  forward (median): %.2f ms without the limit, %.2f ms with it; backward and optimizer: %.2f ms, %.2f ms\n",
			bf, lf, baseMS-bf, ms-lf)
	}
	if o.verify {
		bl := base.Losses()
		same := len(bl) == len(ls)
		first := -1
		for i := range min(len(bl), len(ls)) {
			if math.Float32bits(bl[i]) != math.Float32bits(ls[i]) {
				same = false
				first = i
				break
			}
		}
		if same {
			fmt.Fprintf(out, "  loss curve: bitwise identical to the unlimited run over %d steps\n", len(ls))
		} else {
			fmt.Fprintf(out, "  loss curve: DIFFERS from the unlimited run (first at step %d)\n", first)
		}
	}
}

func okStr(ok bool, yes, no string) string {
	if ok {
		return yes
	}
	return no
}

// fasterNote qualifies a limited step time ms under the baseline's
// baseMS, the median of the baseline's timed steps: a limit adds copies
// and recomputes to the same work, so a faster limited step is the
// baseline's noise (a few steps, --baseline-steps) or its warm-up, not a
// speed-up. Empty when ms is not under baseMS.
func fasterNote(timed []Step, baseMS, ms float64) string {
	if !(ms < baseMS) || len(timed) == 0 {
		return ""
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, s := range timed {
		t := float64(s.Time.Microseconds()) / 1000
		lo, hi = min(lo, t), max(hi, t)
	}
	steps := fmt.Sprintf("%d timed step", len(timed))
	if len(timed) > 1 {
		steps += "s"
	}
	if ms >= lo {
		return fmt.Sprintf(" (within the spread of the baseline's %s, %.2f to %.2f ms: noise, not a speed-up; --baseline-steps for a steadier baseline)", steps, lo, hi)
	}
	return fmt.Sprintf(" (faster than each of the baseline's %s, %.2f to %.2f ms: the short baseline's noise or warm-up, not a speed-up; --baseline-steps for a steadier baseline)", steps, lo, hi)
}

// medianMS is the median step time of the steps keep accepts (nil: all),
// NaN when none.
func medianMS(steps []Step, keep func(Step) bool) float64 {
	var ts []float64
	for _, s := range steps {
		if keep == nil || keep(s) {
			ts = append(ts, float64(s.Time.Microseconds())/1000)
		}
	}
	return cli.Median(ts)
}

// smallBatch is the unlimited run at --limit-batch: its peak is the
// limit's base, its step time per sample what a larger batch under that
// limit is compared with.
type smallBatch struct {
	batch int
	peak  int64
	ms    float64
}

// runSmall runs the model without a limit at --limit-batch for
// --baseline-steps steps, on base's reservation.
func runSmall(j *job, base Config, o *options, out io.Writer) (*smallBatch, error) {
	base.Model.Batch = o.limitBatch
	base.Steps = o.baselineSteps
	base.Progress = nil
	if err := base.Model.Validate(); err != nil {
		return nil, usagef("--limit-batch %d: %v", o.limitBatch, err)
	}
	fmt.Fprintf(out, "unlimited run at batch %d, the limit's base: %d steps on a reservation of %s\n", o.limitBatch, base.Steps, bytesStr(base.Limit))
	reps, err := j.train(base)
	if err != nil {
		return nil, fmt.Errorf("unlimited run at batch %d: %w", o.limitBatch, err)
	}
	s := &smallBatch{batch: o.limitBatch}
	for _, r := range reps {
		s.peak = max(s.peak, r.Stats.PeakDeviceBytes)
	}
	st := reps[0].Steps
	s.ms = medianMS(st[min(1, len(st)-1):], nil)
	fmt.Fprintf(out, "unlimited at batch %d: peak %s, step %.2f ms (median after the first)\n", s.batch, bytesStr(s.peak), s.ms)
	return s, nil
}

// printPerSample compares the time per sample of the limited run at batch
// with the unlimited runs at batch and at --limit-batch.
func printPerSample(out io.Writer, s *smallBatch, batch int, baseMS float64, rep *Report) {
	stable := func(st Step) bool { return st.Result.Stage == seq.Stable }
	steady := rep.Steps[min(1, len(rep.Steps)-1):]
	ms := medianMS(steady, stable)
	if math.IsNaN(ms) {
		ms = medianMS(steady, nil)
	}
	per := func(ms float64, b int) float64 { return 1000 * ms / float64(b) }
	fmt.Fprintf(out, "  per sample: %.3f us at batch %d under the peak of batch %d (%.2fx the batch), %.3f us at batch %d unlimited, %.3f us at batch %d unlimited: %+.1f%% against the batch that fits\n",
		per(ms, batch), batch, s.batch, float64(batch)/float64(s.batch), per(baseMS, batch), batch, per(s.ms, s.batch), s.batch, 100*(per(ms, batch)/per(s.ms, s.batch)-1))
}

// parseLimit reads --limit (cli.ParseLimit).
func parseLimit(s string, peak int64) (int64, error) { return cli.ParseLimit(s, peak) }

func minSwap(s string, m Model) (int64, error) {
	if s == "auto" {
		return min(1<<20, int64(m.Batch)*int64(m.Width)*4), nil
	}
	return chameleon.ParseBytes(s)
}

func bytesStr(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.2f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

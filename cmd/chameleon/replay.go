package main

import (
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/chameleon-go/chameleon"
	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/device/cuda"
	"github.com/chameleon-go/chameleon/device/cuda/driver"
	"github.com/chameleon-go/chameleon/device/host"
	"github.com/chameleon-go/chameleon/layer"
	"github.com/chameleon-go/chameleon/plan"
	"github.com/chameleon-go/chameleon/replay"
	"github.com/chameleon-go/chameleon/seq"
)

func init() {
	register("replay", "run a trace's iterations through the Engine on the host backend, verifying every byte, or timing each step (--timing)", runReplay)
}

func runReplay(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("replay", "--trace FILE [--kineto FILE] [--limit 80%] [--scale N] [--rounds R] [--device host|cuda] [--timing [--verify] [--kernels FILE]] [--json]", stderr)
	tf := addTraceFlags(fs)
	path := tf.path
	limitS := fs.String("limit", "80%", "device memory limit: a share of the trace's largest peak in (0%, 100%], or bytes with a unit (12GiB), scaled")
	scale := fs.Int64("scale", 0, "divide every tensor size by `N` (default 1024; 1 with --timing: full size)")
	rounds := fs.Int("rounds", 1, "replay the trace's iterations this many times in order; not given, a trace of fewer iterations than a policy needs (--m + --n + 1) is replayed enough times to plan one and run a whole round under it, and stderr says so")
	asJSON := fs.Bool("json", false, "print one JSON object")
	quiet := fs.Bool("quiet", false, "no progress lines on stderr")
	recompute := fs.Bool("recompute", true, "let the Engine drop tensors of ops that can run again (mre.Recomputable) and recompute them, each recompute verified; --recompute=false swaps alone")
	policyFile := fs.String("policy-file", "", "policy file: loaded at start if it exists, saved at the end (its directory must exist and be writable)")
	devName := fs.String("device", "host", "device: host (pure Go) or cuda (libcudart, found as device/cuda documents)")
	bounds := fs.String("boundaries", "", "layer boundaries by hand for the Engine's plans: op seq numbers (`120,240,360`) or a module-path pattern (model.layers.*)")
	timing := fs.Bool("timing", false, "run each op as a kernel of its time on the Engine's compute stream and measure each iteration's step (docs/replay.md)")
	pageSize := fs.String("page-size", "", "--device cuda: bytes of each mapped page, a power of two of at least the driver's 2 MiB (16MiB: fewer, cheaper driver calls to move memory, more waste in partly used pages); default the driver's granularity")
	placement := fs.Bool("placement", true, "in STABLE, serve each device block at the address planned from the iteration before (chameleon.WithPlacement); false: best fit online")
	mapping := fs.Bool("mapping", true, "page-mapped allocation (on cuda, the driver's virtual memory management where the driver has it; on host, its model of it); false reserves one plain segment")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the replay to `file` (go tool pprof): where the host's time per op goes")
	timeline := fs.String("timeline", "", "with --timing: stamp every op kernel on the device's clock, report where the device stood idle and why (host_stall_ms, device_stall_ms), and write one STABLE iteration's timeline to `file` (Chrome trace JSON, opens in Perfetto)")
	verify := fs.Bool("verify", false, fmt.Sprintf("with --timing: check the bytes of every %dth storage at each use (they are not checked otherwise)", replay.DefaultVerifyEvery))
	cfg := detectionFlags(fs)
	if err := parseArgs(fs, args); err != nil {
		return err
	}
	// The scale's default depends on --timing: 1024, or 1 (full size: the
	// step the GPU takes); the flag's zero value says it was not given.
	if !isSet(fs, "scale") {
		*scale = 1024
		if *timing {
			*scale = 1
		}
	}
	if err := checkReplayFlags(tf, *limitS, *scale, *rounds, *devName, *cfg); err != nil {
		return err
	}
	if *timeline != "" && !*timing {
		return usagef("--timeline stamps the kernels of a timed replay: it needs --timing")
	}
	if *verify && !*timing {
		return usagef("--verify samples the bytes a timed replay checks: it needs --timing (without it every use is checked)")
	}
	if err := checkPolicyFile(*policyFile); err != nil {
		return err
	}
	roundsSet := isSet(fs, "rounds")
	tr, err := tf.loadWarn(stderr)
	if err != nil {
		return err
	}
	if err := allocatesNothing(tr, *path); err != nil {
		return err
	}
	recorded := replay.PeakBytes(tr)
	if recorded <= 0 && isShare(*limitS) {
		if op := replay.PeakOp(tr); op == nil || op.Mem < 0 {
			return fmt.Errorf("--limit %s: %s records no allocated bytes (no op has mem), so it has no peak to take a share of: give the limit in bytes (--limit 12GiB)", strings.TrimSpace(*limitS), *path)
		}
		return fmt.Errorf("--limit %s: the peak recorded in %s is 0 bytes (every op's mem is 0), so no share of it is a limit: give the limit in bytes (--limit 12GiB)", strings.TrimSpace(*limitS), *path)
	}
	if r := roundsToPlan(len(tr.Iterations), *cfg); !roundsSet && r > *rounds {
		*rounds = r
		fmt.Fprintf(stderr, "the trace has %d iterations; replaying them %d times so that a policy is planned (--rounds to choose)\n", len(tr.Iterations), r)
	}
	// With kernel times the Engine plans a profile of their op sequence with
	// them: a --kernels file through the replay (replay.Config.Kernels, which
	// times --timing's kernels too), an Execution Trace's Kineto kernels
	// through the Engine's estimator.
	kernels, kpath := tf.kt.file, *tf.kernels
	timeBase, extra := layer.BaseEstimated, []chameleon.Option(nil)
	if tf.kt.est != nil {
		timeBase = layer.BaseKernels
		if kernels == nil {
			extra = append(extra, chameleon.WithEstimator(tf.kt.est))
		}
	}
	if *bounds != "" {
		g, err := plan.ParseBoundaries(*bounds)
		if err != nil {
			return fmt.Errorf("--boundaries: %w", err)
		}
		extra = append(extra, chameleon.WithGrouper(g))
	}
	peak := recorded / *scale
	limit, err := parseLimit(*limitS, peak)
	if err != nil {
		return err
	}
	limitFrom := "--limit " + *limitS
	if !strings.HasSuffix(strings.TrimSpace(*limitS), "%") {
		limit /= *scale // bytes of the recorded trace: scale them too
	} else if op := replay.PeakOp(tr); op != nil && op.Mem >= 0 {
		at := *path
		if op.Line > 0 {
			at = fmt.Sprintf("%s:%d", at, op.Line)
		}
		limitFrom = fmt.Sprintf("--limit %s of the peak of %d bytes recorded at %s, scaled 1/%d", *limitS, op.Mem, at, *scale)
	}
	if limit <= 0 {
		of := ""
		if isShare(*limitS) {
			of = fmt.Sprintf(" of the peak of %d bytes recorded in %s", recorded, *path)
		}
		return fmt.Errorf("--limit %s%s is 0 bytes at scale 1/%d: lower --scale (--scale 1 replays at full size)", strings.TrimSpace(*limitS), of, *scale)
	}
	var dev device.Device
	var library string // the runtime library the device loaded (--device cuda)
	peakOf := func() int64 { return -1 }
	opts := []chameleon.Option{chameleon.WithDetection(*cfg), chameleon.WithPlacement(*placement)}
	var tm *replay.Timing
	if *timing {
		tm = &replay.Timing{}
		if *verify {
			tm.VerifyEvery = replay.DefaultVerifyEvery
		}
	}
	switch *devName {
	case "host":
		// The host "device" holds exactly the limit: the Engine reserves
		// it, so nothing above it can ever be handed out. Its pages model
		// the GPU's at the replay's scale (replay.PageAtScale).
		hopts := []host.Option{host.WithName("host"), host.WithPageSize(replay.PageAtScale(limit, *scale))}
		if !*mapping {
			hopts = append(hopts, host.WithoutMapping())
		}
		if tm != nil {
			// The link is modeled, at the replay's scale so that a copy
			// takes its full size's time, and the Engine plans on it.
			l := replay.HostLink(*scale)
			hopts = append(hopts, host.WithBandwidth(l.H2D, l.D2H), host.WithSleep(replay.Wait))
			if *scale > 1 {
				opts = append(opts, chameleon.WithLinkBandwidth(l.D2H))
			}
		}
		h, err := host.New(limit, hopts...)
		if err != nil {
			return err
		}
		dev, peakOf = h, h.PeakAllocated
		if tm != nil {
			tm.Launch = replay.HostKernel(h)
			if *timeline != "" {
				tl := replay.HostTimeline(h, maxOps(tr))
				tm.Timeline, dev = tl, replay.StampHostCopies(h, tl)
			}
		}
	case "cuda":
		var copts []cuda.Option
		if !*mapping {
			copts = append(copts, cuda.WithoutMapping())
		}
		if *pageSize != "" {
			n, err := chameleon.ParseBytes(*pageSize)
			if err != nil {
				return fmt.Errorf("--page-size: %w", err)
			}
			copts = append(copts, cuda.WithPageSize(n))
		}
		c, err := cuda.New(copts...)
		if err != nil {
			return err
		}
		dev, library = c, c.Library()
		if !*quiet {
			fmt.Fprintf(stderr, "device %s: %s\n", c.Name(), library)
		}
	default:
		return fmt.Errorf("--device %q: want host or cuda", *devName)
	}
	defer dev.Close()
	if c, ok := dev.(*cuda.Device); ok && tm != nil {
		sp, err := spinner(c)
		if err != nil {
			return err
		}
		defer func() {
			dev.SyncStream(dev.DefaultStream()) // the last kernels before their module goes
			sp.Close()
		}()
		tm.Launch = func(s device.Stream, d time.Duration) error { return sp.Spin(s, d.Nanoseconds()) }
		if *timeline != "" {
			ct, err := newCUDATimeline(c, sp, maxOps(tr))
			if err != nil {
				return err
			}
			defer ct.close()
			tm.Timeline, dev = ct, &stampedCUDA{Device: c, tl: ct}
		}
	}
	rc := replay.Config{Scale: *scale, Rounds: *rounds, Limit: limit, LimitFrom: limitFrom, Options: append(opts, extra...),
		Recompute: *recompute, PolicyFile: *policyFile, Timing: tm, Kernels: kernels, KernelsFrom: kpath}
	if !*quiet {
		rc.Progress = stderr
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return fmt.Errorf("--cpuprofile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("--cpuprofile: %w", err)
		}
		defer pprof.StopCPUProfile()
		defer fmt.Fprintf(stderr, "wrote %s\n", *cpuProfile)
	}
	rep, err := replay.Run(tr, dev, rc)
	if rep != nil && rep.Engine != nil {
		defer rep.Engine.Close()
	}
	if err != nil {
		return err
	}
	rep.Trace = *path
	if rep.PolicyFileError != "" {
		fmt.Fprintf(stderr, "warning: %s\n", rep.PolicyFileError)
	}
	if *asJSON {
		if err := writeJSON(stdout, replayJSON{Schema: schemaVersion, Command: "replay", Trace: rep.Trace, TimeBase: timeBase, Library: library, Report: rep}); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(stdout, "%s: %d iterations", rep.Trace, rep.Iterations)
		if *rounds > 1 {
			fmt.Fprintf(stdout, " (the trace's %d, %d rounds)", len(tr.Iterations), *rounds)
		}
		fmt.Fprintf(stdout, " at scale 1/%d under %d bytes; time base %s\n", rep.Scale, rep.LimitBytes, timeBase)
		if rep.Timing {
			fmt.Fprintf(stdout, "timed: each op a kernel of its time on %s's compute stream", dev.Name())
			if rep.VerifyEvery > 0 {
				fmt.Fprintf(stdout, ", bytes of every %dth storage checked", rep.VerifyEvery)
			} else {
				fmt.Fprint(stdout, ", bytes not checked")
			}
			fmt.Fprintln(stdout)
		}
		fmt.Fprintf(stdout, "%s: peak bytes handed out %d (%.1f%% of the limit)", dev.Name(), rep.PeakDeviceBytes, 100*float64(rep.PeakDeviceBytes)/float64(rep.LimitBytes))
		if p := peakOf(); p >= 0 {
			fmt.Fprintf(stdout, ", device peak %d", p)
		}
		fmt.Fprintln(stdout)
		fmt.Fprintf(stdout, "uses verified %d, failed %d; swapped %d bytes; on-demand swap-ins %d; recomputes %d\n", rep.VerifiedUses, rep.FailedUses, rep.SwappedBytes, rep.OnDemandSwapIns, rep.Recomputes)
		fmt.Fprintf(stdout, "policies planned %d, cache hits %d, policy updates %d, outgrown %d, tightened for placement %d, refined %d\nstages %s\n", rep.Replans, rep.CacheHits, rep.PolicyUpdates, rep.Outgrown, rep.Tightened, rep.Refined, strings.Join(rep.Stages, " "))
		if why := noPolicy(rep, len(tr.Iterations), *cfg); why != "" {
			fmt.Fprintf(stdout, "no policy ran: %s\n", why)
		}
		for i := range rep.Results {
			if p := rep.Results[i].Plan; p != nil && p.Layout != nil && p.Policy != nil {
				l := p.Layout
				fits := "fits"
				if !l.Fits() {
					fits = "does not fit: placed by the allocator's own recording"
				}
				fmt.Fprintf(stdout, "plan of iteration %d: for %.1f%% of the limit (%d more plans for its layout); layout of %d blocks in %d pages of %d KiB, %d in use at most, of %d: %s\n",
					rep.Results[i].Index, 100*float64(p.Planned)/float64(max(p.Limit, 1)), p.Tries, len(l.Blocks), l.Touched, l.Page>>10, l.Most, l.Budget/max(l.Page, 1), fits)
			}
		}
		if rep.Engine != nil {
			if n := rep.Engine.Stats().Relocated; n > 0 {
				fmt.Fprintf(stdout, "relocated to their places in a layout: %d parameters and optimizer state\n", n)
			}
		}
		tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
		head := "round\titer\tstage\tplanned swaps\tplanned recomputes\ton-demand in\tevictions\tdeferred\tswapped bytes\tpages mapped\tplaced\tmissed\tsimulated ms\t"
		if rep.Timing {
			head += "measured ms\tissued ms\thost waits\tunlimited ms\tkernels ms\top times\t"
		}
		if tm != nil && tm.Timeline != nil {
			head += "device busy ms\tidle on host ms\tidle queued ms\tto host GB/s\tto device GB/s\t"
		}
		fmt.Fprintln(tw, head)
		for _, x := range rep.PerIteration {
			fmt.Fprintf(tw, "%d\t%d\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%.2f\t", x.Round, x.Iter, x.Stage, x.PlannedSwaps, x.PlannedRecomputes,
				x.OnDemandSwapIns, x.Evictions, x.DeferredPrefetches, x.SwappedBytes, x.MappedPages, x.Placed, x.Missed, x.SimulatedMS)
			if rep.Timing {
				fmt.Fprintf(tw, "%.2f\t%.2f\t%d\t%.2f\t%.2f\t%s\t", x.MeasuredMS, x.IssuedMS, x.HostWaits, x.UnlimitedMS, x.KernelMS, x.OpTimes)
			}
			if tm != nil && tm.Timeline != nil {
				fmt.Fprintf(tw, "%.2f\t%.2f\t%.2f\t%s\t%s\t", x.DeviceBusyMS, x.HostStallMS, x.DeviceStallMS, rate(x.D2H), rate(x.H2D))
			}
			fmt.Fprintln(tw)
		}
		tw.Flush()
		if s := rep.Stable; s != nil {
			fmt.Fprintf(stdout, "STABLE (%d iterations, medians): unlimited %.2f ms, measured %.2f ms, simulated %.2f ms", s.Iterations, s.UnlimitedMS, s.MeasuredMS, s.SimulatedMS)
			if s.SimulatedMS > 0 {
				fmt.Fprintf(stdout, " (measured %+.1f%% of simulated)", 100*(s.MeasuredMS/s.SimulatedMS-1))
			}
			fmt.Fprintf(stdout, "; forced evictions %d, on-demand swap-ins %d\n", s.Evictions, s.OnDemandSwapIns)
		}
		printLinkParts(stdout, rep.PerIteration)
	}
	if *timeline != "" {
		if err := writeTimeline(*timeline, rep); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "wrote %s (%s)\n", *timeline, rep.TimelineOf)
	}
	if rep.FailedUses > 0 {
		return fmt.Errorf("%d uses read bytes that differ from what was written: %s", rep.FailedUses, strings.Join(rep.Failures, "; "))
	}
	return nil
}

// spinner is the spin kernel on d's primary context, the one libcudart
// uses, so that it runs on the Engine's streams: compiled by NVRTC for
// CHAMELEON_ARCH (default driver.DefaultArch).
func spinner(d *cuda.Device) (*driver.Spinner, error) {
	ctx, err := d.Context()
	if err != nil {
		return nil, fmt.Errorf("--timing: the spin kernel needs libcuda's primary context: %w", err)
	}
	nv, err := driver.LoadNVRTC()
	if err != nil {
		return nil, fmt.Errorf("--timing: the spin kernel is compiled by NVRTC: %w", err)
	}
	sp, err := driver.NewSpinner(ctx, nv, os.Getenv("CHAMELEON_ARCH"))
	if err != nil {
		return nil, fmt.Errorf("--timing: %w", err)
	}
	return sp, nil
}

// rate is a direction's copy rate for the table, "-" with no copy.
func rate(f *replay.LinkFigures) string {
	if f == nil {
		return "-"
	}
	return fmt.Sprintf("%.1f", f.GBps)
}

// roundsToPlan is the rounds a replay of a trace of n iterations needs for
// the Engine to plan a policy and run a whole round under it, with the
// detector's cfg: M unchanged iterations in WARMUP and N in GEN_POLICY
// before the first STABLE one. 0 when one round reaches STABLE.
func roundsToPlan(n int, cfg seq.Config) int {
	need := cfg.M + cfg.N
	if n <= 0 || n > need {
		return 0
	}
	return (need+n-1)/n + 1
}

// noPolicy says why no policy ran in a replay that had none in force ("":
// one did): too few iterations for the detector to leave WARMUP and
// GEN_POLICY, with the --rounds that gives enough; the planner's error; or
// a sequence that kept changing.
func noPolicy(rep *replay.Report, n int, cfg seq.Config) string {
	if rep.Replans > 0 || rep.CacheHits > 0 || rep.PolicyUpdates > 0 || slices.Contains(rep.Stages, seq.Stable.String()) {
		return ""
	}
	if need := cfg.M + cfg.N + 1; rep.Iterations < need {
		return fmt.Sprintf("the Engine plans one after --m %d iterations of one sequence in WARMUP and --n %d in GEN_POLICY, and applies it from the next; %d iterations ran: --rounds %d repeats the trace's %d enough",
			cfg.M, cfg.N, rep.Iterations, roundsToPlan(n, cfg), n)
	}
	if len(rep.PlanErrors) > 0 {
		return "planning failed: " + rep.PlanErrors[len(rep.PlanErrors)-1]
	}
	return fmt.Sprintf("the sequence changed before %d iterations of one ran (chameleon detect --trace F says where and why; --cosine, --length and --memory set what counts as a change)", cfg.M+cfg.N+1)
}

// printLinkParts prints, for the last iteration whose copies were stamped
// (--timeline), how busy each direction of the link was over each part of
// the step, measured and, where the policy's simulation is of its ops,
// simulated.
func printLinkParts(w io.Writer, its []replay.IterationReport) {
	for k := len(its) - 1; k >= 0; k-- {
		x := &its[k]
		if len(x.LinkParts) == 0 {
			continue
		}
		fmt.Fprintf(w, "link busy by part, round %d iteration %d (%s), measured", x.Round, x.Iter, x.Stage)
		if len(x.LinkPartsSimulated) == len(x.LinkParts) {
			fmt.Fprint(w, " (simulated)")
		}
		fmt.Fprint(w, ": ")
		writeParts(w, x.LinkParts, x.LinkPartsSimulated)
		fmt.Fprintln(w)
		return
	}
}

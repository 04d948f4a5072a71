// Command infer serves a stack of decoder blocks to several sessions
// taking turns, with every weight in memory managed by the chameleon
// Engine under a device memory limit a fraction of the weights: the
// weights are Frozen (filled once from the host, never written), so they
// stream in ahead of their block and leave it with no copy out; each
// session's cache grows a row per token (a fresh storage one row longer
// per step, the old one released, like a KV cache); between a session's
// turns the host sends its caches off the device (Engine.Evict) and asks
// for the next session's ahead of its turn (Engine.Prefetch). The limit
// changes nothing but memory and time: the logits of every token are
// bitwise those of a run without the limit, which the command checks.
//
//	go run ./examples/infer                           # host backend, 40% of the unlimited peak
//	go run ./examples/infer --host-bw 2               # a modeled 2 GB/s host link: streaming-bound
//	go run ./examples/infer --device cuda --layers 16 --width 4096 --ffn 16384 --vocab 32000 --limit 40%
//
// It prints tokens per second with and without the limit, the bytes
// streamed per token, the streaming bound (the peak less the limit must
// come in at each token, at the link's rate) and the simulator's
// prediction for the Engine's plan.
//
// On the host backend device memory is Go memory and kernels are pure Go,
// queued on the Engine's compute stream. With --device cuda, memory,
// streams and copies go through libcudart (device/cuda), the GEMMs through
// cuBLAS and the elementwise kernels through NVRTC and the driver API (the
// training example's package gpu), all loaded with purego: the binary
// builds with CGO_ENABLED=0.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/chameleon-go/chameleon"
	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/examples/internal/backend"
	"github.com/chameleon-go/chameleon/examples/internal/cli"
	"github.com/chameleon-go/chameleon/seq"
)

func main() {
	os.Exit(runMain(os.Args[1:], os.Stdout, os.Stderr))
}

// errUsage marks a bad command line (exit 2).
var errUsage = cli.ErrUsage

// errDiffer marks a limited run whose outputs differ from the unlimited
// run's (exit 1).
var errDiffer = errors.New("the outputs differ from the unlimited run")

// runMain runs the command and returns its exit status: 0 done (or -h),
// 1 the run failed or its outputs differ, 2 a bad command line.
func runMain(args []string, stdout, stderr io.Writer) int {
	err := run(args, stdout, stderr)
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		if msg := strings.TrimSuffix(err.Error(), ": "+errUsage.Error()); msg != errUsage.Error() {
			fmt.Fprintln(stderr, "infer:", msg)
		}
		return 2
	}
	fmt.Fprintln(stderr, "infer:", err)
	return 1
}

// usagef is a bad flag value: exit 2.
func usagef(format string, args ...any) error { return cli.Usagef(format, args...) }

type options struct {
	device       string
	limit        string
	steps        int
	seed         uint64
	model        Model
	hints        bool
	minSwap      string
	hostBW       float64
	link         float64
	workers      int
	tf32         bool
	arch         string
	hostReserve  string
	quiet        bool
	syncPlanning bool
}

func parse(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("infer", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.device, "device", "host", "host (pure Go) or cuda (libcudart, cuBLAS, NVRTC through purego)")
	fs.StringVar(&o.limit, "limit", "40%", "device memory limit: a share of the unlimited run's peak in (0%, 100%], or bytes with a unit (4MiB, 6GiB); none runs only without a limit")
	fs.IntVar(&o.steps, "steps", 24, "rounds: each session decodes one token per round")
	fs.Uint64Var(&o.seed, "seed", 1, "seed of the weights and the prompts' caches")
	fs.IntVar(&o.model.Layers, "layers", 8, "decoder blocks")
	fs.IntVar(&o.model.Width, "width", 256, "hidden width")
	fs.IntVar(&o.model.FFN, "ffn", 1024, "MLP hidden width")
	fs.IntVar(&o.model.Vocab, "vocab", 512, "vocabulary (rows of the embedding, columns of the head)")
	fs.IntVar(&o.model.Sessions, "sessions", 4, "sessions taking turns")
	fs.IntVar(&o.model.Prompt, "prompt", 16, "cache rows each session starts with")
	fs.BoolVar(&o.hints, "hints", true, "evict each session's caches after its turn and prefetch the next session's (Engine.Evict, Engine.Prefetch)")
	fs.StringVar(&o.minSwap, "min-swap", "auto", "smallest tensor the planner swaps (auto: 1 MiB, or one prompt cache when smaller)")
	fs.Float64Var(&o.hostBW, "host-bw", 0, "host backend: model a host link of this many GB/s each way (0: memory-speed copies)")
	fs.Float64Var(&o.link, "link", 0, "GB/s each way the planner and the streaming bound assume (0: --host-bw on the host backend when set, else the Engine's default, 55)")
	fs.IntVar(&o.workers, "workers", 0, "host backend: goroutines per GEMM (0: GOMAXPROCS)")
	fs.BoolVar(&o.tf32, "tf32", false, "cuda: let cuBLAS use TF32 tensor cores")
	fs.StringVar(&o.arch, "arch", "compute_90", "cuda: NVRTC --gpu-architecture of the elementwise kernels")
	fs.StringVar(&o.hostReserve, "host-reserve", "0", "pinned host bytes to reserve up front (0: grow on first need)")
	fs.BoolVar(&o.quiet, "quiet", false, "print only the summary")
	fs.BoolVar(&o.syncPlanning, "sync-planning", false, "each step that ends a profile waits for its plan (chameleon.WithSyncPlanning): the same steps on every machine")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, errUsage
	}
	if fs.NArg() > 0 {
		return nil, usagef("unexpected argument %q: every input is a flag (infer -h)", fs.Arg(0))
	}
	if err := o.model.Validate(); err != nil {
		return nil, usagef("%v", err)
	}
	switch {
	case o.steps < 1:
		return nil, usagef("--steps %d: want at least 1", o.steps)
	case o.device != "host" && o.device != "cuda":
		return nil, usagef("--device %q: want host or cuda", o.device)
	case o.hostBW < 0 || o.link < 0:
		return nil, usagef("--host-bw %g and --link %g cannot be negative", o.hostBW, o.link)
	case o.workers < 0:
		return nil, usagef("--workers %d: cannot be negative", o.workers)
	}
	if _, err := parseLimit(o.limit, 1<<40); err != nil {
		return nil, err
	}
	if _, err := minSwap(o.minSwap, o.model); err != nil {
		return nil, usagef("--min-swap: %v", err)
	}
	if _, err := chameleon.ParseBytes(o.hostReserve); err != nil {
		return nil, usagef("--host-reserve: %v", err)
	}
	return o, nil
}

// defaultLink is the Engine's link each way when none is set (the measured
// H200 figure, chameleon.WithLinkBandwidth).
const defaultLink = 55e9

func run(args []string, out, stderr io.Writer) error {
	o, err := parse(args, stderr)
	if err != nil {
		return err
	}
	b, err := backend.Open(backend.Options{Device: o.device, Workers: o.workers, HostBW: o.hostBW, TF32: o.tf32, Arch: o.arch})
	if err != nil {
		return err
	}
	defer b.Close()
	m := o.model
	link := o.link * 1e9
	if link == 0 && o.device == "host" && o.hostBW > 0 {
		link = o.hostBW * 1e9
	}
	cfg := Config{Model: m, Steps: o.steps, Seed: o.seed, Hints: o.hints, Link: link, Estimator: b.Est, SyncPlanning: o.syncPlanning}
	if cfg.MinSwap, err = minSwap(o.minSwap, m); err != nil {
		return err
	}
	reserve, err := chameleon.ParseBytes(o.hostReserve)
	if err != nil {
		return err
	}
	if link == 0 {
		link = defaultLink
	}
	tokens := o.steps * m.Sessions
	fmt.Fprintf(out, "device %s: %d blocks, width %d, ffn %d, vocab %d; weights %s (Frozen, filled from the host); %d sessions, prompt %d, %d rounds (%d tokens)\n",
		b.Dev.Name(), m.Layers, m.Width, m.FFN, m.Vocab, bytesStr(m.WeightBytes()), m.Sessions, m.Prompt, o.steps, tokens)

	// The run without a limit: nothing to evict for, so no hints.
	base := cfg
	base.Hints = false
	base.Limit = m.UpperBoundBytes(o.steps)
	if mp, ok := b.Dev.(device.Mapper); ok && mp.PageSize() > 0 {
		// On pages, every block may hold a part of a page more: the
		// weights, two caches a session and block (the old one and the
		// one a row longer) and the activations.
		base.Limit += int64(3*m.Layers+2+2*m.Sessions*m.Layers+8) * mp.PageSize()
	}
	if b.Free > 0 && base.Limit > b.Free*9/10 {
		base.Limit = b.Free * 9 / 10
	}
	noLimit := strings.TrimSpace(o.limit) == "none"
	if noLimit && !o.quiet {
		base.Progress = func(r Round) { printRound(out, r) }
	}
	fmt.Fprintf(out, "unlimited run on a reservation of %s\n", bytesStr(base.Limit))
	baseRep, err := Run(b.Dev, b.Kernels, base)
	if err != nil {
		return fmt.Errorf("unlimited run: %w", err)
	}
	peak := baseRep.Stats.PeakDeviceBytes
	baseMS := medianMS(baseRep.Rounds[min(1, len(baseRep.Rounds)-1):], nil)
	fmt.Fprintf(out, "unlimited: peak %s, round %.2f ms (median after the first): %.1f tokens/s; %d swaps out (want 0)\n",
		bytesStr(peak), baseMS, float64(m.Sessions)/baseMS*1e3, baseRep.Stats.SwapsOut)
	limit, err := parseLimit(o.limit, peak)
	if err != nil {
		return err
	}
	if limit == 0 {
		return nil
	}
	cfg.Limit = limit
	cfg.StepMS = baseMS
	if reserve > 0 {
		cfg.Options = append(cfg.Options, chameleon.WithHostReserve(reserve))
	}
	if !o.quiet {
		cfg.Progress = func(r Round) { printRound(out, r) }
	}
	fmt.Fprintf(out, "limited run: limit %s (%.0f%% of the unlimited peak); the weights are %.2fx the limit\n",
		bytesStr(limit), 100*float64(limit)/float64(peak), float64(m.WeightBytes())/float64(limit))
	rep, err := Run(b.Dev, b.Kernels, cfg)
	if err != nil {
		return fmt.Errorf("limited run: %w", err)
	}
	return printSummary(out, baseRep, rep, limit, peak, baseMS, link)
}

func printRound(out io.Writer, r Round) {
	res := r.Result
	line := fmt.Sprintf("round %3d  %8.2f ms  peak %9s  in %9s  out %9s  released %4d  on-demand %4d  %-10s",
		r.Index, float64(r.Time.Microseconds())/1000, bytesStr(r.Peak), bytesStr(r.In), bytesStr(r.Out), r.Released, r.OnDemand, res.Stage)
	if res.Planned || res.CacheHit {
		line += fmt.Sprintf("  planned=%v cache_hit=%v", res.Planned, res.CacheHit)
	}
	if res.PlanError != nil {
		line += "  plan: " + res.PlanError.Error()
	}
	fmt.Fprintln(out, line)
}

// steady are the rounds the summary measures: the STABLE ones when there
// are, else every round after the first.
func steady(rep *Report) ([]Round, string) {
	rs := rep.Rounds[min(1, len(rep.Rounds)-1):]
	var st []Round
	for _, r := range rs {
		if r.Result.Stage == seq.Stable {
			st = append(st, r)
		}
	}
	if len(st) > 0 {
		return st, "STABLE rounds"
	}
	return rs, "rounds after the first"
}

func printSummary(out io.Writer, base, rep *Report, limit, peak int64, baseMS, link float64) error {
	m := rep.Config.Model
	st := rep.Stats
	fmt.Fprintln(out, "summary:")
	same := bytes.Equal(base.Logits, rep.Logits) && slices.Equal(base.Tokens, rep.Tokens)
	if same {
		fmt.Fprintf(out, "  outputs: the logits of all %d tokens (%s) are bitwise those of the unlimited run\n", len(rep.Tokens), bytesStr(int64(len(rep.Logits))))
	} else {
		first := firstDiff(base.Logits, rep.Logits) / (4 * m.Vocab)
		fmt.Fprintf(out, "  outputs: DIFFER from the unlimited run (first at token %d)\n", first)
	}
	rounds, what := steady(rep)
	ms := medianMS(rounds, nil)
	tps := func(ms float64) float64 { return float64(m.Sessions) / ms * 1e3 }
	fmt.Fprintf(out, "  tokens/s: %.1f without the limit, %.1f with it (median round of the %s: %.2f ms, %.2f ms); over the whole run %.1f and %.1f\n",
		tps(baseMS), tps(ms), what, baseMS, ms,
		float64(len(base.Tokens))/base.Decode.Seconds(), float64(len(rep.Tokens))/rep.Decode.Seconds())
	fmt.Fprintf(out, "  device memory: limit %s, peak %s (%s), unlimited peak %s; weights %s = %.2fx the limit\n",
		bytesStr(limit), bytesStr(st.PeakDeviceBytes), okStr(st.PeakDeviceBytes <= limit, "within the limit", "OVER THE LIMIT"),
		bytesStr(peak), bytesStr(m.WeightBytes()), float64(m.WeightBytes())/float64(limit))
	var in, outB, released, onDemand int64
	for _, r := range rounds {
		in += r.In
		outB += r.Out
		released += r.Released
		onDemand += r.OnDemand
	}
	n := float64(len(rounds) * m.Sessions) // tokens
	perTok := float64(in) / n
	fmt.Fprintf(out, "  streamed per token (%s): %s in, %s copied out, %.1f swap-outs released with no copy; %.1f on-demand swap-ins per round; link in use %.2f GB/s\n",
		what, bytesStr(int64(perTok)), bytesStr(int64(float64(outB)/n)), float64(released)/n, float64(onDemand)/float64(len(rounds)),
		float64(in)/float64(len(rounds))/(ms/1e3)/1e9)
	need := float64(peak - limit)
	boundMS := need / link * 1e3
	fmt.Fprintf(out, "  streaming bound: the peak less the limit, %s, in per token at %.1f GB/s = %.2f ms per token: at most %.1f tokens/s (measured %.1f: %.0f%% of the bound; streamed %.2fx the bytes it needs)\n",
		bytesStr(int64(need)), link/1e9, boundMS, 1e3/max(boundMS, baseMS/float64(m.Sessions)), tps(ms),
		100*tps(ms)/(1e3/max(boundMS, baseMS/float64(m.Sessions))), perTok/need)
	if k := len(rep.Sims); k > 0 {
		sim := rep.Sims[k-1]
		fmt.Fprintf(out, "  simulator (last policy, op times fitted to the unlimited round): round %.2f ms = %.2f ms compute + %.2f ms stalls: %.1f tokens/s predicted; measured %.2f ms\n",
			sim.IterationUS/1000, sim.BaseUS/1000, sim.StallUS/1000, tps(sim.IterationUS/1000), ms)
	} else {
		fmt.Fprintln(out, "  simulator: no policy was planned (see the rounds' plan errors)")
	}
	fmt.Fprintf(out, "  stages: %s\n", stages(rep.Rounds))
	fmt.Fprintf(out, "  engine: %d policies planned, %d cache hits, %d infeasible, %d forced evictions, %d on-demand swap-ins, %d swaps out (%d released with no copy), %d hinted evictions, %d hinted prefetches (%d waited for room)\n",
		st.Replans, st.CacheHits, st.Infeasible, st.Evictions, st.OnDemandIn, st.SwapsOut, st.KeptEvictions, st.HintEvictions, st.HintPrefetches, st.HintDeferrals)
	if !same {
		return errDiffer
	}
	return nil
}

// stages counts the rounds of each stage, in the order the stages came.
func stages(rounds []Round) string {
	var names []string
	count := map[string]int{}
	for _, r := range rounds {
		n := r.Result.Stage.String()
		if count[n] == 0 {
			names = append(names, n)
		}
		count[n]++
	}
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = fmt.Sprintf("%d %s", count[n], n)
	}
	return strings.Join(parts, ", ") + " rounds"
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

func okStr(ok bool, yes, no string) string {
	if ok {
		return yes
	}
	return no
}

// medianMS is the median round time of the rounds keep accepts (nil:
// all), NaN when none.
func medianMS(rounds []Round, keep func(Round) bool) float64 {
	var ts []float64
	for _, r := range rounds {
		if keep == nil || keep(r) {
			ts = append(ts, float64(r.Time)/float64(time.Millisecond))
		}
	}
	return cli.Median(ts)
}

// parseLimit reads --limit (cli.ParseLimit).
func parseLimit(s string, peak int64) (int64, error) { return cli.ParseLimit(s, peak) }

func minSwap(s string, m Model) (int64, error) {
	if s == "auto" {
		return min(1<<20, int64(m.Prompt)*int64(m.Width)*4), nil
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

// Package mre plans swaps: it finds the memory reduction list (MRL, every op
// after which the memory curve exceeds the limit, with the bytes to cut
// there), the candidate tensors that sit idle over those points, and selects
// swaps among them until every point is satisfied, checking the policy on the
// simulate timeline and adjusting it where the simulation shows a stall.
//
// It is pure: the iteration, its memory model and curve, op times and
// logical layers go in; a plan (or an error wrapping ErrInfeasible) comes
// out.
package mre

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"

	"github.com/chameleon-go/chameleon/layer"
	"github.com/chameleon-go/chameleon/memory"
	"github.com/chameleon-go/chameleon/simulate"
	"github.com/chameleon-go/chameleon/trace"
)

// ErrInfeasible is wrapped by the error Plan returns when no set of swaps
// keeps the curve under the limit.
var ErrInfeasible = errors.New("memory limit cannot be met by swapping")

// InfeasibleError says where the limit cannot be met: at op Op, swapping
// every tensor idle there (over its whole idle gap) still leaves Shortfall
// bytes over Limit.
type InfeasibleError struct {
	Limit     int64
	Op        int
	Shortfall int64
}

func (e *InfeasibleError) Error() string {
	return fmt.Sprintf("mre: %v: %d bytes over the limit of %d at op %d with every idle activation swapped",
		ErrInfeasible, e.Shortfall, e.Limit, e.Op)
}

// Unwrap makes errors.Is(err, ErrInfeasible) hold.
func (e *InfeasibleError) Unwrap() error { return ErrInfeasible }

// Point is one entry of the memory reduction list: after op Op the curve is
// Need bytes over the limit.
type Point struct {
	Op   int
	Need int64
}

// MRL returns the memory reduction list of a curve under limit, in op order.
func MRL(curve []int64, limit int64) []Point {
	var out []Point
	for t, v := range curve {
		if v > limit {
			out = append(out, Point{Op: t, Need: v - limit})
		}
	}
	return out
}

// Candidate is one idle gap of one storage: it is used by op Out, then by
// no op until op Use. Swapping it over the gap can relieve any point in
// (Out, Use).
type Candidate struct {
	Tensor trace.TensorID
	Bytes  int64
	Out    int
	Use    int
}

// Candidates lists the idle gaps of at least minBytes that hold at least
// one op after which the curve is over limit: gaps of activations, and
// gaps between two uses inside the iteration of parameters and optimizer
// state (a weight idle from its layer's forward to its backward). Inputs
// and activations made before the iteration are left alone: the host
// hands them in and may hold them elsewhere. A tensor with several gaps
// gives several candidates.
func Candidates(m *memory.Model, curve []int64, limit, minBytes int64) []Candidate {
	n := len(curve)
	over := make([]int32, n+1) // prefix count of points over the limit
	for t, v := range curve {
		over[t+1] = over[t]
		if v > limit {
			over[t+1]++
		}
	}
	var out []Candidate
	for k := range m.Lifetimes {
		lt := &m.Lifetimes[k]
		k := lt.Tensor.Kind
		movable := k.Persistent() || (k == trace.KindActivation && lt.ProducedHere())
		if !movable || lt.Bytes < minBytes || lt.Bytes == 0 {
			continue
		}
		for u := 1; u < len(lt.Uses); u++ {
			i, j := int(lt.Uses[u-1]), int(lt.Uses[u])
			if j-i < 2 || j >= n || over[j]-over[i+1] == 0 {
				continue
			}
			out = append(out, Candidate{Tensor: lt.Tensor.ID, Bytes: lt.Bytes, Out: i, Use: j})
		}
	}
	return out
}

// Input is what Plan needs.
type Input struct {
	Model *memory.Model
	// Curve is the allocated bytes after each op that the plan must keep
	// under Limit. Nil: the recorded curve (op.Mem) when the iteration has
	// one, else the model's curve.
	Curve []int64
	// OpTimes is each op's time in microseconds (a layer.Estimator's
	// output, or measured kernel times).
	OpTimes []float64
	// Groups are the logical layers the swap-in trigger counts in; nil:
	// each op is its own layer.
	Groups []layer.Group
	Limit  int64
	// Recomputable says, per op, whether its output may be dropped and made
	// again by running the op once more before its next use (Recomputable
	// derives it from a trace; the Engine from the ops its host can run
	// again). Nil: swaps only.
	Recomputable []bool
}

// Policy is a checked swap plan.
type Policy struct {
	Limit int64
	MRL   []Point
	// Swaps, ordered by Out then Tensor.
	Swaps []simulate.Swap
	// Recomputes, ordered by Before then Tensor: the tensors dropped and
	// made again (Input.Recomputable).
	Recomputes []simulate.Recompute
	// Sim is the policy on the simulated timeline.
	Sim *simulate.Result
	// Curve is the curve the plan was made against.
	Curve []int64
	// Rounds is how many plan-simulate rounds ran.
	Rounds int
}

// ResolveCurve returns in.Curve or the default curve Plan uses.
func (in Input) ResolveCurve() []int64 {
	if in.Curve != nil {
		return in.Curve
	}
	it := in.Model.Iter
	if it != nil && it.HasMem() {
		c := make([]int64, len(it.Ops))
		for t := range it.Ops {
			c[t] = it.Ops[t].Mem
		}
		return c
	}
	return in.Model.Curve
}

// cand is a candidate with its current timing.
type cand struct {
	Candidate
	// Span [f, k) is where the swap frees memory.
	f, k int
	// Measured on the simulated timeline: from the end of op Out to the
	// copy out being complete, and from the issue of the copy back to its
	// completion (queueing included).
	outDelay, inDelay float64
	sel               bool
}

// planner holds the per-iteration state shared by the rounds.
type planner struct {
	cfg config
	// Recomputes chosen before the swaps: need is what they leave, simCurve
	// the curve without them (the simulator subtracts their bytes itself),
	// and a swap candidate may not take a tensor off the device where a
	// recompute needs it or drops it (fit drops or splits such gaps).
	recomputes []simulate.Recompute
	simCurve   []int64
	fit        func(cs []Candidate) []Candidate
	readAt     func(id trace.TensorID) int // the last op before which a recompute reads it, -1 if none
	noQueue    bool                        // time wrapping swaps' copies back each alone
	queued     bool                        // queueing moved a wrapping swap's copy back
	n          int
	curve      []int64
	need       []int64 // curve - limit
	times      []float64
	start      []float64 // op start on the stall-free timeline
	groups     []layer.Group
	gOf        []int
	cands      []cand
	rem        []int64 // need left after the current selection
	dirty      int     // the first point whose unsat count may be stale
	unsat      []int32 // prefix count of rem > 0
	nmre       int
	maxB       int64
	model      *memory.Model
}

// frozen reports a tensor that never crosses out: its swaps release the
// device memory at the end of their Out op and copy only back.
func (p *planner) frozen(id trace.TensorID) bool {
	if p.model == nil {
		return false
	}
	t := p.model.Iter.Tensors[id]
	return t != nil && t.Frozen
}

// copies is how many times a swap of id crosses the link: 1 for a frozen
// tensor, else 2.
func (p *planner) copies(id trace.TensorID) float64 {
	if p.frozen(id) {
		return 1
	}
	return 2
}

// Plan selects swaps that keep the curve under in.Limit (see package doc),
// simulates them and adjusts the triggers until the simulation shows no
// stall or the rounds run out, keeping the fastest valid policy. It returns
// an error wrapping ErrInfeasible when no set of swaps meets the limit.
//
// Selection follows the paper's score N_MRE + C*S, where N_MRE is the
// share of unsatisfied reduction points a swap covers and S its size over
// the largest candidate's. A swap's memory counts as free only from the op
// that starts after its copy out is complete (on the simulated timeline of
// the previous round), and as taken again from its trigger, PrefetchLayers
// logical layers before its next use or earlier if the copy back needs it.
// When the timed spans cannot cover every point, spans are stretched
// towards the whole idle gap: the plan then stays valid and the simulation
// charges the wait it costs.
//
// Last, the copies that still made compute wait are moved where the
// simulated memory has room (unless WithoutRetime): a swap whose memory an
// op waited to count free frees it later (into the next iteration for one
// whose copy out runs past the end), one whose use waited for its copy
// back has it issued earlier; each pass is kept only when it simulates
// faster within the limit. Then the copies out of tensors written earlier
// in the step are issued as write-backs at those writes, where that
// simulates faster (simulate.Swap.Early).
func Plan(in Input, opts ...Option) (*Policy, error) {
	cfg := newConfig(opts)
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if in.Model == nil {
		return nil, fmt.Errorf("mre: nil memory model")
	}
	curve := in.ResolveCurve()
	if len(in.OpTimes) != len(curve) {
		return nil, fmt.Errorf("mre: %d op times for %d ops", len(in.OpTimes), len(curve))
	}
	var pol *Policy
	var err error
	if in.Recomputable != nil {
		if len(in.Recomputable) != len(curve) {
			return nil, fmt.Errorf("mre: recomputable flags for %d ops, want %d", len(in.Recomputable), len(curve))
		}
		pol, err = planHybrid(in, curve, cfg)
	} else {
		pol, err = planSwaps(in, curve, &planner{cfg: cfg})
	}
	if err != nil || pol == nil || cfg.noRetime {
		return pol, err
	}
	p := &planner{cfg: cfg, simCurve: pol.Curve, recomputes: pol.Recomputes}
	return p.writeBack(in, p.retime(in, pol)), nil
}

// planSwaps is the swap planner of Plan, over the need that p's recomputes
// leave. Where swaps across the iteration boundary are needed, it plans
// them twice, with their copies back timed each alone and as one engine
// queues them (wrapping), and keeps the faster policy: queued, the copies
// back stall nothing but free less; alone, they free more and may stall.
func planSwaps(in Input, curve []int64, p *planner) (*Policy, error) {
	alone := *p
	pol, err := planSwapsOnce(in, curve, p)
	if err != nil || !p.queued {
		return pol, err
	}
	alone.noQueue = true
	if pa, err := planSwapsOnce(in, curve, &alone); err == nil && pa.Sim.IterationUS < pol.Sim.IterationUS {
		return pa, nil
	}
	return pol, nil
}

// planSwapsOnce plans swaps for curve with p's settings (noQueue among
// them), in steps: set p up over the need curve - limit (setup); with no
// point over the limit, simulate no swap; else list the candidates, plan
// the swaps that wrap the iteration where the gaps inside it cannot meet
// the limit (wrapSwaps), and run the selection-simulation rounds (rounds).
// p's need ends less what the wrapping swaps free.
func planSwapsOnce(in Input, curve []int64, p *planner) (*Policy, error) {
	p.setup(in, curve)
	plan := &Policy{Limit: in.Limit, MRL: MRL(p.simCurve, in.Limit), Curve: p.simCurve, Recomputes: p.recomputes}
	if p.nmre == 0 {
		sim, err := p.simulateRound(in, nil)
		if err != nil {
			return nil, err
		}
		plan.Sim = sim
		return plan, nil
	}
	cs, wrap, err := p.wrapSwaps(in, curve)
	if err != nil {
		return nil, err
	}
	p.init(cs)
	return p.rounds(in, wrap, plan.MRL)
}

// setup points p at the iteration (curve, op times, groups, model), takes
// curve as the curve to simulate unless p has one (the curve without the
// recomputes), and sets need to curve - limit and nmre to the count of
// points over the limit.
func (p *planner) setup(in Input, curve []int64) {
	n := len(curve)
	p.n, p.curve, p.times, p.groups, p.model = n, curve, in.OpTimes, in.Groups, in.Model
	if p.simCurve == nil {
		p.simCurve = curve
	}
	p.need = make([]int64, n)
	for t, v := range curve {
		p.need[t] = v - in.Limit
		if p.need[t] > 0 {
			p.nmre++
		}
	}
}

// simulateRound marks the read-only swaps and simulates swaps with p's
// recomputes on the simulated curve.
func (p *planner) simulateRound(in Input, swaps []simulate.Swap) (*simulate.Result, error) {
	MarkReadOnly(in.Model, swaps)
	return p.cfg.sim(simulate.Input{OpTimes: in.OpTimes, Curve: p.simCurve, Swaps: swaps, Recomputes: p.recomputes, Link: p.cfg.link})
}

// candidates lists the swap candidates of at least minBytes, fitted to
// p's recomputes when it has them.
func (p *planner) candidates(in Input, curve []int64, minBytes int64) []Candidate {
	cs := Candidates(in.Model, curve, in.Limit, minBytes)
	if p.fit != nil {
		cs = p.fit(cs)
	}
	return cs
}

// applyWrap takes from need what the wrapping swaps wrap free (over
// [0, In) and [Free, n) each) and recounts nmre.
func (p *planner) applyWrap(wrap []simulate.Swap) {
	for _, w := range wrap {
		for t := range p.n {
			if t < w.In || t >= w.Free {
				p.need[t] -= w.Bytes
			}
		}
	}
	p.nmre = 0
	for _, v := range p.need {
		if v > 0 {
			p.nmre++
		}
	}
}

// wrapSwaps returns the candidates the rounds select from and the swaps
// that wrap the iteration, planned ahead of them and applied to need. It
// tries, in order:
//   - a forward-only iteration (inference, a decode step) has no backward
//     to bring anything back for: what it holds over the limit is weights,
//     used once a step. Streaming them in ahead of their use and releasing
//     them after it, every step, is the plan (stream); the gaps inside the
//     iteration cover only what streaming leaves;
//   - the candidates of at least the size threshold, if swapping them
//     over their whole gaps meets the limit (feasible);
//   - else every candidate, below the threshold too: there may be enough
//     small tensors;
//   - last, what is idle across the iteration boundary (optimizer state
//     between two steps), in place of any streaming above: those swaps
//     take the whole iteration's link time twice over, so they are a last
//     resort, chosen only until the gaps inside the iteration can do the
//     rest (wrapping, else stream over what is short).
//
// It fails, wrapping ErrInfeasible, when even that leaves the limit unmet.
func (p *planner) wrapSwaps(in Input, curve []int64) ([]Candidate, []simulate.Swap, error) {
	cs := p.candidates(in, curve, p.cfg.minBytes)
	var wrap []simulate.Swap
	if forwardOnly(in.Model.Iter) {
		p.init(cs)
		if wrap = p.stream(in.Model, slices.Clone(p.need)); wrap != nil {
			p.applyWrap(wrap)
		}
	}
	if err := feasible(p.n, p.need, cs, in.Limit); err != nil {
		// Below the size threshold there may be enough small tensors.
		cs = p.candidates(in, curve, 0)
		if err := feasible(p.n, p.need, cs, in.Limit); err != nil {
			p.init(cs)
			if wrap = p.wrapping(in.Model, cs); wrap == nil {
				// Timed on the stall-free timeline, a copy back longer
				// than the compute before its use must start at op 0 and
				// frees nothing: where the link, not compute, sets the
				// pace, trigger each copy back as early as memory allows
				// instead (stream).
				if wrap = p.stream(in.Model, p.short(cs)); wrap == nil {
					return nil, nil, err
				}
			}
			p.applyWrap(wrap)
			if err := feasible(p.n, p.need, cs, in.Limit); err != nil {
				return nil, nil, err
			}
		}
	}
	return cs, wrap, nil
}

// rounds runs up to cfg.rounds rounds of selection (after the swaps that
// wrap) and simulation, each folding the simulated copy times into the
// candidates' timings, until a round stalls nothing or teaches nothing.
// It returns the fastest round's policy (the first on a tie), with Rounds
// the rounds run.
func (p *planner) rounds(in Input, wrap []simulate.Swap, mrl []Point) (*Policy, error) {
	var best *Policy
	for round := 1; round <= p.cfg.rounds; round++ {
		swaps := append(slices.Clone(wrap), p.selectSwaps()...)
		sim, err := p.simulateRound(in, swaps)
		if err != nil {
			return nil, fmt.Errorf("mre: round %d: %w", round, err)
		}
		if best == nil || sim.IterationUS < best.Sim.IterationUS {
			best = &Policy{Limit: in.Limit, MRL: mrl, Curve: p.simCurve, Swaps: swaps, Recomputes: p.recomputes, Sim: sim}
		}
		best.Rounds = round
		if sim.StallUS <= 1e-9 || !p.learn(swaps, sim) {
			break
		}
	}
	return best, nil
}

// feasible checks that swapping every candidate over its whole gap meets
// the limit at every op.
func feasible(n int, need []int64, cs []Candidate, limit int64) error {
	delta := make([]int64, n+1)
	for _, c := range cs {
		delta[c.Out+1] += c.Bytes
		delta[c.Use] -= c.Bytes
	}
	var cover int64
	worst := &InfeasibleError{Limit: limit, Op: -1}
	for t := range n {
		cover += delta[t]
		if short := need[t] - cover; short > 0 && short > worst.Shortfall {
			worst.Op, worst.Shortfall = t, short
		}
	}
	if worst.Op >= 0 {
		return worst
	}
	return nil
}

// wrapping chooses swaps over the gaps that cross the iteration boundary
// (persistent tensors: out after their last use, back before their first
// use of the next iteration), greedily by the paper's score over the points
// the in-iteration candidates cs cannot satisfy, until they can. It
// returns nil when even all of them leave a point short. Spans are timed
// as the copies would run alone: out from the end of the last use, back
// the copy's time (and PrefetchLayers layers) before the first use.
func (p *planner) wrapping(m *memory.Model, cs []Candidate) []simulate.Swap {
	n := p.n
	short := p.short(cs)
	margin := 1 + p.cfg.margin
	var cands []simulate.Swap
	for k := range m.Lifetimes {
		lt := &m.Lifetimes[k]
		if !lt.Tensor.Kind.Persistent() || len(lt.Uses) == 0 || lt.Bytes < p.cfg.minBytes || lt.Bytes == 0 {
			continue
		}
		i, j := lt.LastUse(), int(lt.Uses[0])
		if p.readAt != nil && p.readAt(lt.Tensor.ID) > i {
			continue // a recompute reads it after its last use: it must stay
		}
		tOut := float64(lt.Bytes) / p.cfg.link.D2H * 1e6 * margin
		if lt.Tensor.Frozen {
			tOut = 0
		}
		tIn := float64(lt.Bytes) / p.cfg.link.H2D * 1e6 * margin
		ready := p.start[i+1] + tOut
		f := i + 1 + sort.Search(n-i-1, func(x int) bool { return p.start[i+1+x] >= ready })
		kTime := max(sort.Search(j+1, func(x int) bool { return p.start[x] > p.start[j]-tIn })-1, 0)
		g := max(p.gOf[j]-p.cfg.prefetch, 0)
		kk := min(kTime, p.groups[g].First, j)
		cands = append(cands, simulate.Swap{Tensor: lt.Tensor.ID, Bytes: lt.Bytes, Out: i, Free: f, In: kk, Use: j})
	}
	covers := func(w simulate.Swap, t int) bool { return t < w.In || t >= w.Free }
	base := slices.Clone(short)
	var chosen []simulate.Swap
	var picked []int
	used := make([]bool, len(cands))
	pos := make([]int, n+1)
	for {
		var left int
		for _, v := range short {
			if v > 0 {
				left++
			}
		}
		if left == 0 {
			// The copies back share one engine: time them together, latest
			// use first, each ending before its use and before the next one
			// starts, and count what that takes back.
			if p.noQueue || !p.queueWraps(cands, picked, chosen) {
				return chosen
			}
			p.queued = true
			copy(short, base)
			for _, w := range chosen {
				for t := range n {
					if covers(w, t) {
						short[t] -= w.Bytes
					}
				}
			}
			continue
		}
		// pos[t]: the points short among the first t. A swap covers the
		// ops before In and from Free on (all of them when Free <= In).
		for t := range n {
			pos[t+1] = pos[t]
			if short[t] > 0 {
				pos[t+1]++
			}
		}
		best, bestScore := -1, 0.0
		for x, w := range cands {
			if used[x] {
				continue
			}
			in := min(max(w.In, 0), n)
			cnt := pos[in] + pos[n] - pos[max(min(w.Free, n), in)]
			if cnt == 0 {
				continue
			}
			if s := float64(cnt)/float64(left) + p.cfg.c*float64(w.Bytes)/float64(max(p.maxB, w.Bytes)); s > bestScore {
				best, bestScore = x, s
			}
		}
		if best < 0 {
			return nil
		}
		used[best] = true
		w := cands[best]
		chosen = append(chosen, w)
		picked = append(picked, best)
		for t := range n {
			if covers(w, t) {
				short[t] -= w.Bytes
			}
		}
	}
}

// short is the need that swapping every candidate of cs over its whole
// gap leaves, per op.
func (p *planner) short(cs []Candidate) []int64 {
	n := p.n
	short := slices.Clone(p.need)
	delta := make([]int64, n+1)
	for _, c := range cs {
		delta[c.Out+1] += c.Bytes
		delta[c.Use] -= c.Bytes
	}
	var cov int64
	for t := range n {
		cov += delta[t]
		short[t] -= cov
	}
	return short
}

// stream plans the persistent tensors that leave after their last use and
// come back for their first use of the next iteration (swaps that wrap)
// so that they meet short, the need per op, on their own, with each copy
// back triggered from memory rather than from the stall-free timeline:
// weight streaming, where the link and not compute sets the pace.
//
// Which tensors: greedily by the paper's score, each counted as if it
// came back at its use (free over [0, Use) and [Free, end)), until no op
// is short; nil when even all of them leave one short. A frozen tensor is
// free from the end of its last use; another from the first op that
// starts after its copy out would end.
//
// When each comes back: in order of use (the order the copy engine serves
// them), each copy back is issued at the latest op that leaves the copies
// queued on the engine time to end by their uses on the stall-free
// timeline, and no later than PrefetchLayers logical layers ahead; but
// never earlier than memory allows. The memory the chosen tensors may hold
// at op t is their bytes less short(t); each trigger moves back from its
// use only while what is held by the tensors triggered before it and by
// those in use fits. The prefetch distance is so the bytes the link can
// bring in before the use, bounded by the memory free to hold them, down
// to a single op: a coarse grouping cannot make a stream infeasible.
func (p *planner) stream(m *memory.Model, short []int64) []simulate.Swap {
	n := p.n
	margin := 1 + p.cfg.margin
	var cands []simulate.Swap
	for _, minBytes := range []int64{p.cfg.minBytes, 0} {
		cands = cands[:0]
		for k := range m.Lifetimes {
			lt := &m.Lifetimes[k]
			if !lt.Tensor.Kind.Persistent() || len(lt.Uses) == 0 || lt.Bytes < minBytes || lt.Bytes == 0 {
				continue
			}
			i, j := lt.LastUse(), int(lt.Uses[0])
			if p.readAt != nil && p.readAt(lt.Tensor.ID) > i {
				continue
			}
			f := i + 1
			if !lt.Tensor.Frozen {
				ready := p.start[i+1] + float64(lt.Bytes)/p.cfg.link.D2H*1e6*margin
				f = i + 1 + sort.Search(n-i-1, func(x int) bool { return p.start[i+1+x] >= ready })
			}
			cands = append(cands, simulate.Swap{Tensor: lt.Tensor.ID, Bytes: lt.Bytes, Out: i, Free: f, In: j, Use: j,
				NoCopyOut: lt.Tensor.Frozen})
		}
		// Two greedy orders: by score (the largest tensors first) and the
		// smallest first (a tensor does not cover the ops that use it, so
		// the bytes chosen exceed the need by what is in use where it
		// peaks, and small tensors keep that excess small); each for the
		// need itself and for the need plus a prefetch buffer of half, one
		// and two of the largest tensors (more bytes on the link, fewer
		// copies held back by memory). The fastest on the simulated
		// timeline is kept, the fewer bytes among equals.
		var maxB int64
		for _, w := range cands {
			maxB = max(maxB, w.Bytes)
		}
		var best []simulate.Swap
		var bestUS float64
		seen := map[int64]bool{}
		for _, smallest := range []bool{false, true} {
			for _, extra := range []int64{0, maxB / 2, maxB, 2 * maxB} {
				want := slices.Clone(short)
				for t := range want {
					if want[t] > 0 {
						want[t] += extra
					}
				}
				chosen := p.streamSelect(cands, want, smallest)
				if chosen == nil {
					continue
				}
				if b := streamBytes(chosen); seen[b] {
					continue
				} else {
					seen[b] = true
				}
				p.streamTriggers(chosen, short)
				us := math.Inf(1)
				if p.cfg.sim != nil {
					sw := slices.Clone(chosen)
					MarkReadOnly(m, sw)
					if r, err := p.cfg.sim(simulate.Input{OpTimes: p.times, Curve: p.simCurve, Swaps: sw, Recomputes: p.recomputes, Link: p.cfg.link}); err == nil {
						us = r.IterationUS
					}
				}
				if best == nil || us < bestUS || (us == bestUS && streamBytes(chosen) < streamBytes(best)) {
					best, bestUS = chosen, us
				}
			}
		}
		if best != nil {
			return best
		}
	}
	return nil
}

func streamBytes(ws []simulate.Swap) int64 {
	var b int64
	for _, w := range ws {
		b += w.Bytes
	}
	return b
}

// streamSelect picks among cands (each free over [0, Use) and [Free,
// end)) until no op of short is left over zero, by score or, when
// smallest, the smallest that covers a short op first; nil when all of
// them cannot.
func (p *planner) streamSelect(cands []simulate.Swap, short []int64, smallest bool) []simulate.Swap {
	n := p.n
	var maxB int64
	for _, w := range cands {
		maxB = max(maxB, w.Bytes)
	}
	used := make([]bool, len(cands))
	var chosen []simulate.Swap
	// A prefix count of the short ops scores a candidate in O(1).
	pre := make([]int32, n+1)
	for {
		for t, v := range short {
			pre[t+1] = pre[t]
			if v > 0 {
				pre[t+1]++
			}
		}
		left := pre[n]
		if left == 0 {
			return pruneStream(chosen, short)
		}
		best, bestScore := -1, 0.0
		for x, w := range cands {
			if used[x] {
				continue
			}
			cnt := pre[w.Use] + pre[n] - pre[w.Free]
			if cnt == 0 {
				continue
			}
			if smallest {
				if best < 0 || w.Bytes < cands[best].Bytes {
					best = x
				}
				continue
			}
			cost := 2.0
			if w.NoCopyOut {
				cost = 1
			}
			if s := float64(cnt)/float64(left) + p.cfg.c*float64(w.Bytes)/float64(maxB)*2/cost; s > bestScore {
				best, bestScore = x, s
			}
		}
		if best < 0 {
			return nil
		}
		used[best] = true
		w := cands[best]
		chosen = append(chosen, w)
		for t := range w.Use {
			short[t] -= w.Bytes
		}
		for t := w.Free; t < n; t++ {
			short[t] -= w.Bytes
		}
	}
}

// pruneStream drops chosen swaps the others make redundant, largest
// first (each byte dropped is a byte less on the link every iteration);
// short is what is left of the need with all of chosen (<= 0 everywhere).
func pruneStream(chosen []simulate.Swap, short []int64) []simulate.Swap {
	order := make([]int, len(chosen))
	for x := range order {
		order[x] = x
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(chosen[b].Bytes, chosen[a].Bytes) })
	drop := make([]bool, len(chosen))
	for _, x := range order {
		w := &chosen[x]
		ok := true
		for t := range short {
			if (t < w.Use || t >= w.Free) && short[t]+w.Bytes > 0 {
				ok = false
				break
			}
		}
		if !ok {
			continue
		}
		drop[x] = true
		for t := range short {
			if t < w.Use || t >= w.Free {
				short[t] += w.Bytes
			}
		}
	}
	kept := chosen[:0]
	for x, w := range chosen {
		if !drop[x] {
			kept = append(kept, w)
		}
	}
	return kept
}

// streamTriggers sets each chosen swap's In (see stream): chosen meets
// short with every In at its Use, and still does after.
func (p *planner) streamTriggers(chosen []simulate.Swap, short []int64) {
	n := p.n
	margin := 1 + p.cfg.margin
	var total int64
	held := make([]int64, n) // chosen bytes on the device at each op
	for _, w := range chosen {
		total += w.Bytes
		for t := w.Use; t < w.Free; t++ {
			held[t] += w.Bytes
		}
	}
	order := make([]int, len(chosen))
	for x := range order {
		order[x] = x
	}
	slices.SortStableFunc(order, func(a, b int) int {
		return cmp.Or(cmp.Compare(chosen[a].Use, chosen[b].Use), cmp.Compare(chosen[a].Tensor, chosen[b].Tensor))
	})
	// The time rule: latest use first, each copy back ends before its use
	// and before the copy after it starts.
	want := make([]int, len(chosen))
	avail := math.Inf(1)
	for y := len(order) - 1; y >= 0; y-- {
		x := order[y]
		w := &chosen[x]
		end := min(p.start[w.Use], avail)
		begin := end - float64(w.Bytes)/p.cfg.link.H2D*1e6*margin
		avail = begin
		k := max(sort.Search(w.Use+1, func(t int) bool { return p.start[t] > begin })-1, 0)
		g := max(p.gOf[w.Use]-p.cfg.prefetch, 0)
		want[x] = min(k, p.groups[g].First, w.Use)
	}
	for _, x := range order {
		w := &chosen[x]
		k := w.Use
		for k > want[x] && held[k-1]+w.Bytes <= total-short[k-1] {
			k--
		}
		for t := k; t < w.Use; t++ {
			held[t] += w.Bytes
		}
		w.In = k
	}
}

// queueWraps times the copies back of the chosen wrapping swaps (chosen[x]
// is cands[picked[x]]) as one engine runs them: from the latest use back,
// each copy ends before its use and before the copy after it starts, and
// is issued no later than its own timing (cands) says. It reports whether
// any trigger moved earlier.
func (p *planner) queueWraps(cands []simulate.Swap, picked []int, chosen []simulate.Swap) bool {
	order := make([]int, len(chosen))
	for x := range order {
		order[x] = x
	}
	slices.SortStableFunc(order, func(a, b int) int {
		if chosen[a].Use != chosen[b].Use {
			return chosen[b].Use - chosen[a].Use
		}
		return int(chosen[a].Tensor - chosen[b].Tensor)
	})
	margin := 1 + p.cfg.margin
	moved := false
	avail := math.Inf(1)
	for _, x := range order {
		w := &chosen[x]
		end := min(p.start[w.Use], avail)
		begin := end - float64(w.Bytes)/p.cfg.link.H2D*1e6*margin
		avail = begin
		k := max(sort.Search(w.Use+1, func(t int) bool { return p.start[t] > begin })-1, 0)
		k = min(k, cands[picked[x]].In)
		if k < w.In {
			w.In, moved = k, true
		}
	}
	return moved
}

func (p *planner) init(cs []Candidate) {
	p.start = opStarts(p.times)
	if len(p.groups) == 0 {
		p.groups = make([]layer.Group, p.n)
		for t := range p.n {
			p.groups[t] = layer.Group{First: t, Last: t}
		}
	}
	p.gOf = layer.GroupOf(p.groups, p.n)
	p.cands = make([]cand, len(cs))
	for x, c := range cs {
		p.cands[x] = cand{Candidate: c}
		p.maxB = max(p.maxB, c.Bytes)
	}
	p.rem = make([]int64, p.n)
	p.unsat = make([]int32, p.n+1)
}

// timedSpan is where a candidate frees memory if its copies run as timed:
// from the first op that starts after the copy out completes, to the
// trigger of the copy back.
func (p *planner) timedSpan(c *cand) (int, int) {
	i, j := c.Out, c.Use
	margin := 1 + p.cfg.margin
	tOut := max(float64(c.Bytes)/p.cfg.link.D2H*1e6*margin, c.outDelay)
	if p.frozen(c.Tensor) {
		tOut = 0 // released at the end of Out
	}
	tIn := max(float64(c.Bytes)/p.cfg.link.H2D*1e6*margin, c.inDelay*margin)
	// f: first op t > i with start[t] >= end of i + tOut.
	ready := p.start[i+1] + tOut
	f := i + 1 + sort.Search(j-i-1, func(x int) bool { return p.start[i+1+x] >= ready })
	// k: the latest op whose start leaves tIn before op j starts, and no
	// later than PrefetchLayers logical layers ahead of j.
	latest := p.start[j] - tIn
	kTime := sort.Search(j+1, func(x int) bool { return p.start[x] > latest }) - 1
	g := max(p.gOf[j]-p.cfg.prefetch, 0)
	kLayer := min(p.groups[g].First, j)
	k := min(kTime, kLayer)
	if k <= f || f >= j {
		return f, f
	}
	return f, k
}

// selectSwaps runs the greedy selection with the current timings: it
// resets the selection and times each candidate's span, selects on timed
// spans (phase 1), stretches spans where points are left (phase 2),
// prunes, and returns the selected swaps ordered by Out, then tensor.
func (p *planner) selectSwaps() []simulate.Swap {
	copy(p.rem, p.need)
	p.dirty = 0
	for x := range p.cands {
		c := &p.cands[x]
		c.sel = false
		c.f, c.k = p.timedSpan(c)
	}
	p.selectTimed()
	p.selectStretched()
	p.prune()
	return p.selected()
}

// selectTimed is phase 1: while points are unsatisfied, it selects the
// unselected candidate with the best score over the points its timed span
// [f, k) covers (the first on a tie) and covers its span, until no
// candidate covers any.
func (p *planner) selectTimed() {
	for p.refreshUnsat() > 0 {
		bestX, bestScore := -1, 0.0
		for x := range p.cands {
			c := &p.cands[x]
			if c.sel || c.k <= c.f {
				continue
			}
			cnt := p.unsat[c.k] - p.unsat[c.f]
			if cnt == 0 {
				continue
			}
			if s := p.score(int(cnt), c.Bytes, c.Tensor); s > bestScore {
				bestX, bestScore = x, s
			}
		}
		if bestX < 0 {
			break
		}
		c := &p.cands[bestX]
		c.sel = true
		p.cover(c.f, c.k, c.Bytes)
	}
}

// selectStretched is phase 2: while points are unsatisfied, it takes the
// candidate with the best score over the points its whole gap covers
// beyond its selected span (the first on a tie), selects it if it is not
// (covering its timed span, or giving it an empty span at the gap's far
// end) and stretches its span (stretch). Once feasible() passed, some
// candidate always covers a point left.
func (p *planner) selectStretched() {
	for p.refreshUnsat() > 0 {
		bestX, bestScore := -1, 0.0
		for x := range p.cands {
			c := &p.cands[x]
			lo, hi := c.Out+1, c.Use
			cnt := p.unsat[hi] - p.unsat[lo]
			if c.sel || c.k > c.f {
				cnt -= p.unsat[c.k] - p.unsat[c.f]
			}
			if cnt == 0 {
				continue
			}
			if s := p.score(int(cnt), c.Bytes, c.Tensor); s > bestScore {
				bestX, bestScore = x, s
			}
		}
		if bestX < 0 {
			break // cannot happen once feasible() passed
		}
		c := &p.cands[bestX]
		if !c.sel {
			c.sel = true
			if c.k > c.f {
				p.cover(c.f, c.k, c.Bytes)
			} else {
				c.f, c.k = c.Use, c.Use // empty span at the far end
			}
		}
		p.stretch(c)
	}
}

// stretch widens c's span [f, k) within its gap to the first and last
// points outside it still unsatisfied, and covers what it adds: an empty
// span becomes [first, last+1); a span keeps its side where no point is
// left beyond it. The span stays one interval.
func (p *planner) stretch(c *cand) {
	lo, hi := c.Out+1, c.Use
	first, last := -1, -1
	for t := lo; t < hi; t++ {
		if (t < c.f || t >= c.k) && p.rem[t] > 0 {
			if first < 0 {
				first = t
			}
			last = t
		}
	}
	nf, nk := c.f, c.k
	if c.k <= c.f {
		nf, nk = first, last+1
	} else {
		if first < c.f {
			nf = first
		}
		if last >= c.k {
			nk = last + 1
		}
	}
	if c.k <= c.f {
		p.cover(nf, nk, c.Bytes)
	} else {
		p.cover(nf, c.f, c.Bytes)
		p.cover(c.k, nk, c.Bytes)
	}
	c.f, c.k = nf, nk
}

// selected is the selected candidates as swaps (freed at f, back at k),
// ordered by Out, then tensor.
func (p *planner) selected() []simulate.Swap {
	var swaps []simulate.Swap
	for x := range p.cands {
		c := &p.cands[x]
		if c.sel {
			swaps = append(swaps, simulate.Swap{Tensor: c.Tensor, Bytes: c.Bytes, Out: c.Out, Free: c.f, In: c.k, Use: c.Use})
		}
	}
	slices.SortFunc(swaps, func(a, b simulate.Swap) int {
		if a.Out != b.Out {
			return a.Out - b.Out
		}
		return int(a.Tensor - b.Tensor)
	})
	return swaps
}

// score is the paper's N_MRE + C*S, with S counting what the swap frees
// per copy: a swap that crosses the link once (a frozen tensor) frees its
// bytes for half the link time of one that crosses twice.
func (p *planner) score(cnt int, bytes int64, id trace.TensorID) float64 {
	return float64(cnt)/float64(p.nmre) + p.cfg.c*float64(bytes)/float64(p.maxB)*2/p.copies(id)
}

// refreshUnsat rebuilds the prefix count of unsatisfied points and returns
// their number.
// Only the counts from the first point satisfied since the last refresh
// (dirty) on change.
func (p *planner) refreshUnsat() int32 {
	for t := p.dirty; t < p.n; t++ {
		p.unsat[t+1] = p.unsat[t]
		if p.rem[t] > 0 {
			p.unsat[t+1]++
		}
	}
	p.dirty = p.n
	return p.unsat[p.n]
}

func (p *planner) cover(lo, hi int, b int64) {
	if lo >= hi {
		return
	}
	r := p.rem[lo:hi]
	// The first op the bytes satisfy, if before dirty, is dirty now.
	for i, v := range r[:max(min(p.dirty, hi)-lo, 0)] {
		if v > 0 && v <= b {
			p.dirty = lo + i
			break
		}
	}
	for i := range r {
		r[i] -= b
	}
}

// prune drops selected swaps that the others make redundant (largest
// first: they cost the most link time), then trims each span to where it
// is needed, which leaves its copies more time.
func (p *planner) prune() {
	sel := make([]int, 0, 64)
	for x := range p.cands {
		if p.cands[x].sel {
			sel = append(sel, x)
		}
	}
	slices.SortFunc(sel, func(a, b int) int { return int(p.cands[b].Bytes - p.cands[a].Bytes) })
	// rem < 0 is slack: bytes covered beyond the need.
	for _, x := range sel {
		c := &p.cands[x]
		ok := true
		for t := c.f; t < c.k; t++ {
			if p.need[t] > 0 && p.rem[t]+c.Bytes > 0 {
				ok = false
				break
			}
		}
		if ok {
			c.sel = false
			p.cover(c.f, c.k, -c.Bytes)
		}
	}
	for _, x := range sel {
		c := &p.cands[x]
		if !c.sel {
			continue
		}
		needed := func(t int) bool { return p.need[t] > 0 && p.rem[t]+c.Bytes > 0 }
		nf, nk := c.f, c.k
		for nf < nk && !needed(nf) {
			nf++
		}
		for nk > nf && !needed(nk-1) {
			nk--
		}
		p.cover(c.f, nf, -c.Bytes)
		p.cover(nk, c.k, -c.Bytes)
		c.f, c.k = nf, nk
	}
}

// learn folds the simulated copy times of this round's swaps into the
// candidates' timings; it reports whether any timing grew.
func (p *planner) learn(swaps []simulate.Swap, sim *simulate.Result) bool {
	idx := make(map[[2]int64]int, len(p.cands))
	for x := range p.cands {
		c := &p.cands[x]
		idx[[2]int64{int64(c.Tensor), int64(c.Out)}] = x
	}
	grew := false
	for s, sw := range swaps {
		x, ok := idx[[2]int64{int64(sw.Tensor), int64(sw.Out)}]
		if !ok {
			continue
		}
		c := &p.cands[x]
		// Only copies that made compute wait teach anything: the others
		// were on time.
		if fo := sim.Ops[sw.Free]; fo.Stall > 0 && sim.Out[s].End >= fo.Start-1e-9 {
			if d := sim.Out[s].End - sim.Ops[sw.Out].End; d > c.outDelay+1e-6 {
				c.outDelay, grew = d, true
			}
		}
		if uo := sim.Ops[sw.Use]; uo.Stall > 0 && sim.In[s].End >= uo.Start-1e-9 {
			if d := sim.In[s].End - sim.In[s].Issue; d > c.inDelay+1e-6 {
				c.inDelay, grew = d, true
			}
		}
	}
	return grew
}

package mre

import (
	"cmp"
	"math"
	"slices"

	"github.com/chameleon-go/chameleon/layer"
	"github.com/chameleon-go/chameleon/memory"
	"github.com/chameleon-go/chameleon/trace"
)

// Bound is the physical lower bound on the slowdown of any swap-only plan.
type Bound struct {
	// OverheadUS is the least added time; OverheadPct the same over the
	// iteration's compute time.
	OverheadUS, OverheadPct float64
	// OutOp and InOp are the ops that set the two terms (-1 when a term is
	// zero).
	OutOp, InOp int
}

// opStarts is each op's start on the stall-free timeline of op times d,
// and the end of the last as its last entry.
func opStarts(d []float64) []float64 {
	start := make([]float64, len(d)+1)
	for t, v := range d {
		start[t+1] = start[t] + v
	}
	return start
}

// LowerBound bounds the overhead of any swap-only plan that keeps curve
// under limit, given op times d (microseconds) and the link's one-way rates
// out and in (bytes per second, each direction alone: no plan copies
// faster).
//
// Let S(t) be the start of op t on the stall-free timeline, T = sum d, and
// X(t) = max(0, curve(t)-limit) the excess after op t. Swapped memory
// counts as free only from the start of an op after its copy completed, so
// X(t) bytes must have crossed out by the start of op t, which cannot be
// before X(t)/out: op t starts at least
//
//	Dout(t) = X(t)/out - S(t)
//
// late. Those bytes are still off the device after op t, so their copies
// back start no earlier than the end of op t and must complete before the
// last op starts (every swapped tensor has a next use, at the latest the
// last op, which waits for it): the iteration ends at least
//
//	Din(t) = X(t)/in - (S(n-1) - S(t+1))
//
// late. A delay before op t1 pushes every later op, so for t1 <= t2 both
// add up:
//
//	bound = max over t1 <= t2 of max(0, Dout(t1)) + max(0, Din(t2)).
//
// It ignores that a tensor cannot leave before it is produced, queueing,
// and link congestion (both directions at full rate), so real plans can
// only be slower.
func LowerBound(curve []int64, limit int64, d []float64, out, in float64) Bound {
	return LowerBoundKept(curve, limit, d, out, in, nil)
}

// LowerBoundKept is LowerBound where kept[t] bytes may leave the device at
// op t with no copy out (tensors whose host copy is current: frozen
// weights, KeptIdle): only X(t)-kept(t) must have crossed out by the start
// of op t, while all X(t) must still come back. kept nil: none.
func LowerBoundKept(curve []int64, limit int64, d []float64, out, in float64, kept []int64) Bound {
	n := len(curve)
	b := Bound{OutOp: -1, InOp: -1}
	if n == 0 || len(d) != n || out <= 0 || in <= 0 {
		return b
	}
	start := opStarts(d)
	total := start[n]
	// Suffix maximum of Din.
	bestIn := make([]float64, n+1)
	bestInOp := make([]int, n+1)
	bestInOp[n] = -1
	for t := n - 1; t >= 0; t-- {
		bestIn[t], bestInOp[t] = bestIn[t+1], bestInOp[t+1]
		x := curve[t] - limit
		if x <= 0 {
			continue
		}
		din := float64(x)/in*1e6 - (start[n-1] - start[t+1])
		if din > bestIn[t] {
			bestIn[t], bestInOp[t] = din, t
		}
	}
	// Every point over the limit needs at least its own terms.
	b.OverheadUS, b.InOp = bestIn[0], bestInOp[0]
	for t := range n {
		x := curve[t] - limit
		if x <= 0 {
			continue
		}
		if kept != nil {
			x = max(x-kept[t], 0)
		}
		dout := float64(x)/out*1e6 - start[t]
		if dout <= 0 {
			continue
		}
		if v := dout + bestIn[t]; v > b.OverheadUS {
			b.OverheadUS, b.OutOp, b.InOp = v, t, bestInOp[t]
		}
	}
	if total > 0 {
		b.OverheadPct = b.OverheadUS / total * 100
	}
	return b
}

// KeptIdle is, per op of m's iteration, the bytes of frozen parameters on
// the device that the op does not use: what can leave there with no copy
// out (LowerBoundKept). Tensors that are read-only only within the
// iteration (a skipped optimizer step's weights) are not counted: a plan
// releases them with no copy only when a swap across the iteration
// boundary brought them back, which the bound does not model.
func KeptIdle(m *memory.Model) []int64 { return frozenIdle(m) }

// EntryIdle is, per op t of m's iteration, the most bytes of storages
// live when the iteration begins (frozen parameters aside: KeptIdle) and
// not yet used by op t that a plan run step after step can have off the
// device by then with no link time of its own step: copied out in the step
// before, after their last use there (an optimizer state stepped in the
// backward, a gradient kept for the next step). Those copies share the
// link's time up to the step's end, out bytes per second over op times d
// (µs): for each cut c, the storages released at or after op c (their last
// use at c-1 or later) cross in the T-S(c) after it at most, so what is off
// is at most the bytes released before c plus out·(T-S(c)), the least such
// over c. Added to KeptIdle, it is what LowerBoundKept needs no copy out of
// before op t; StreamingBound does not take it, as those copies still cross
// once a step.
func EntryIdle(m *memory.Model, d []float64, out float64) []int64 {
	n := len(m.Iter.Ops)
	idle := make([]int64, n)
	if len(d) != n || out <= 0 {
		return idle
	}
	rate := out / 1e6 // bytes per µs
	start := opStarts(d)
	total := start[n]
	// The storages by first use: those idle at op t are those first used
	// after it.
	type entry struct {
		first, release int // first use; the op after the last
		bytes          int64
	}
	var es []entry
	for k := range m.Lifetimes {
		lt := &m.Lifetimes[k]
		if lt.Alloc >= 0 || lt.Tensor.Frozen {
			continue
		}
		// Every storage of the model is used: its lifetime is there
		// because an op lists it.
		es = append(es, entry{first: int(lt.Uses[0]), release: lt.LastUse() + 1, bytes: lt.Bytes})
	}
	slices.SortFunc(es, func(a, b entry) int { return cmp.Compare(a.first, b.first) })
	released := make([]int64, n+1) // bytes released at each op, of the storages idle now
	for _, e := range es {
		released[e.release] += e.bytes
	}
	k := 0
	var cur int64
	for t := range n {
		changed := t == 0
		for k < len(es) && es[k].first <= t {
			released[es[k].release] -= es[k].bytes
			k, changed = k+1, true
		}
		if k == len(es) {
			break
		}
		if changed {
			// The least over cuts c of the bytes released before c and
			// the link's time after S(c).
			var before int64
			cur = math.MaxInt64
			for c := 0; c <= n; c++ {
				cur = min(cur, before+int64(rate*(total-start[c])))
				before += released[c]
			}
		}
		idle[t] = cur
	}
	return idle
}

// StreamingBound is the least time of one iteration run over and over in
// steady state (swaps may wrap the iteration boundary), in microseconds:
// the ops' time, and at least the largest excess max(curve-limit) must
// come in each iteration at the link's rate in (bytes per second), since
// every byte off the device at the peak is used again by the next
// iteration; of that excess, all but kept(t) (KeptIdle, nil: none) must go
// out each iteration at the rate out. With no excess it is the ops' time.
func StreamingBound(curve []int64, limit int64, d []float64, out, in float64, kept []int64) float64 {
	var total float64
	for _, v := range d {
		total += v
	}
	b := total
	if out <= 0 || in <= 0 {
		return b
	}
	for t, v := range curve {
		x := v - limit
		if x <= 0 {
			continue
		}
		b = max(b, float64(x)/in*1e6)
		if kept != nil && t < len(kept) {
			x = max(x-kept[t], 0)
		}
		b = max(b, float64(x)/out*1e6)
	}
	return b
}

// RecomputeBound bounds the overhead of any plan of swaps and recomputes
// that this package's model admits (in.Recomputable; in.Limit, in.OpTimes,
// the curve in.ResolveCurve gives): each dropped activation is made again
// by its producer, with the inputs the trace frees earlier made again by
// theirs or held, as Plan counts them. Frozen weights leave with no copy
// (KeptIdle), and what lives from the step before and is not yet used may
// have left in it (EntryIdle); out is the link's one-way rate out, bytes
// per second.
//
// Let S(t) be the start of op t on the stall-free timeline and X(t) the
// excess over the limit after it. A plan that starts op t D µs late has
// moved at most out·(S(t)+D) bytes off by then; the rest of X(t) must be
// dropped there, by recomputes that run after t (each before its next
// use), at no less than g_t, the cheapest recomputes alive over t that
// free that many bytes, taken by their time per byte and the last in part
// (a held input shared by k of them counted 1/k to each; a gap that may be
// made again in two ways counted once, at the most it saves and the least
// it costs). So the plan adds
// at least min over D >= 0 of D + g_t(X(t) - out·(S(t)+D)) at every t,
// and the bound is the largest of these. It ignores the copies back,
// queueing, congestion and that a recompute's chain may cost more, so
// real plans can only be slower; with no recompute it is weaker than
// LowerBound.
//
// The copies back bound it too (incoming, with inRate the link's one-way
// rate in, bytes per second; 0 leaves the term out). Of X(t), what no
// recompute drops is off the device at op t by swaps, whose copies back
// are issued from op t+1 on, one after the other at no more than inRate,
// and each done before its tensor's next read. A plan does best to leave
// the tensors read last, so with A_t(>u) the bytes that could be off at t
// (alive, not an operand of op t) that no op up to u reads next, w bytes
// swapped start the iteration's end at least
//
//	I_t(w) = max(0, max over u > t of (w - A_t(>u))/inRate - (S(u) - S(t+1)))
//
// late, and the plan adds at least min over r of max(g_t(r), I_t(X(t)-r)),
// r the bytes recomputes drop there. That term is what binds where
// parameters, gradients and optimizer state, which no recompute makes,
// are all read in the few ops of an optimizer step.
func RecomputeBound(in Input, out, inRate float64) Bound {
	b := Bound{OutOp: -1, InOp: -1}
	if in.Model == nil || out <= 0 {
		return b
	}
	curve := in.ResolveCurve()
	n := len(curve)
	if n == 0 || len(in.OpTimes) != n || len(in.Recomputable) != n {
		return b
	}
	start := opStarts(in.OpTimes)
	kept := frozenIdle(in.Model)
	for t, b := range EntryIdle(in.Model, in.OpTimes, out) {
		kept[t] += b
	}
	rcs := recomputeCandidates(in.Model, curve, in.Limit, 0, in.Recomputable, in.OpTimes)
	// The recompute candidates over each op, by the ops they relieve:
	// (Drop, Before).
	starts := make([][]int32, n+1)
	for x := range rcs {
		if lo := rcs[x].Drop + 1; lo < rcs[x].Before {
			starts[lo] = append(starts[lo], int32(x))
		}
	}
	rate := out / 1e6 // bytes per µs
	var alive []int32
	var pieces []piece
	share := map[trace.TensorID]int{}
	type gapKey struct {
		id   trace.TensorID
		drop int
	}
	gap := map[gapKey]int{}
	var reads *nextReads
	var late []float64 // least delay of op t's start, from the copies back of earlier ops
	if inRate > 0 {
		reads = newNextReads(in.Model)
		late = make([]float64, n+1)
	}
	for t := range n {
		if late != nil && t > 0 {
			late[t] = max(late[t], late[t-1])
		}
		alive = append(alive, starts[t]...)
		alive = slices.DeleteFunc(alive, func(x int32) bool { return rcs[x].Before <= t })
		over := curve[t] - in.Limit
		x := over
		if kept != nil {
			x -= kept[t]
		}
		y0 := float64(x) - rate*start[t] // what the link cannot have taken by t
		if over <= 0 || (y0 <= 0 && reads == nil) {
			continue
		}
		clear(share)
		for _, c := range alive {
			for _, k := range rcs[c].Kept {
				if k.From <= t {
					share[k.Tensor]++
				}
			}
		}
		// A gap made again in more than one way (inputs held or made
		// again) is one piece: the most it saves, for the least it costs.
		pieces = pieces[:0]
		clear(gap)
		for _, c := range alive {
			rc := &rcs[c]
			saved := float64(rc.Bytes)
			for _, k := range rc.Kept {
				if k.From <= t {
					saved -= float64(k.Bytes) / float64(share[k.Tensor])
				}
			}
			if saved <= 0 {
				continue
			}
			g := gapKey{rc.Tensor, rc.Drop}
			if x, ok := gap[g]; ok {
				pieces[x].bytes, pieces[x].cost = max(pieces[x].bytes, saved), min(pieces[x].cost, rc.cost)
				continue
			}
			gap[g] = len(pieces)
			pieces = append(pieces, piece{saved, rc.cost})
		}
		slices.SortFunc(pieces, func(a, b piece) int { return cmp.Compare(a.cost*b.bytes, b.cost*a.bytes) })
		if y0 > 0 {
			// D + g(y0 - rate·D) is convex in D (g is: cheapest first); its
			// least is at D = 0 or where the link takes over the rest after
			// a whole number of pieces.
			least := y0 / rate // the link alone
			var by, cost float64
			for _, pc := range pieces {
				if by+pc.bytes >= y0 {
					least = min(least, cost+pc.cost*(y0-by)/pc.bytes) // D = 0
					break
				}
				by, cost = by+pc.bytes, cost+pc.cost
				least = min(least, (y0-by)/rate+cost)
			}
			if least > b.OverheadUS {
				b.OverheadUS, b.OutOp, b.InOp = least, t, -1
			}
		}
		if reads != nil {
			var drop float64
			for _, pc := range pieces {
				drop += pc.bytes
			}
			slack := reads.slack(t, start, inRate/1e6, float64(over)-drop, late)
			if v := late[t] + incoming(float64(over), inRate/1e6, slack, pieces); v > b.OverheadUS {
				b.OverheadUS, b.OutOp, b.InOp = v, -1, t
			}
		}
	}
	if total := start[n]; total > 0 {
		b.OverheadPct = b.OverheadUS / total * 100
	}
	return b
}

// piece is a share of the bytes recomputes can drop over an op and its
// time: cost µs for bytes.
type piece struct{ bytes, cost float64 }

// incoming is min over r of max(g(r), x - r over rate less slack), with g
// the least time of recomputes that drop r bytes (pieces, cheapest per
// byte first) and at most all the pieces' bytes dropped; rate in bytes per
// µs, slack in µs (RecomputeBound's copies-back term at one op).
func incoming(x, rate, slack float64, pieces []piece) float64 {
	h := func(r float64) float64 { return (x-r)/rate - slack }
	if h(0) <= 0 {
		return 0
	}
	var by, cost float64
	for _, pc := range pieces {
		k := pc.cost / pc.bytes
		// cost + k(r-by) = h(r) where the two cross.
		r := (x/rate - slack - cost + k*by) / (k + 1/rate)
		if r <= by+pc.bytes {
			return cost + k*max(r-by, 0)
		}
		by, cost = by+pc.bytes, cost+pc.cost
	}
	return h(by)
}

// nextReads is, per storage of a memory model, the ops that read it (view
// ops aside: they move no data) and the ops that use it otherwise: what
// the copies-back term of RecomputeBound asks of op t.
type nextReads struct {
	m        *memory.Model
	reads    [][]int32
	operands [][]int32 // per op, the storages (Lifetimes index) a non-view op uses
	pool     []poolEntry
}

type poolEntry struct {
	next  int // the next op reading it; n when none does in the iteration
	bytes int64
}

func newNextReads(m *memory.Model) *nextReads {
	it := m.Iter
	n := len(it.Ops)
	nr := &nextReads{m: m, reads: make([][]int32, len(m.Lifetimes)), operands: make([][]int32, n)}
	for t := range it.Ops {
		op := &it.Ops[t]
		if layer.Classify(it, op) == layer.KindView {
			continue
		}
		for _, id := range op.In {
			if k, ok := m.Index[id]; ok {
				if r := nr.reads[k]; len(r) == 0 || r[len(r)-1] != int32(t) {
					nr.reads[k] = append(r, int32(t))
				}
				nr.operands[t] = append(nr.operands[t], k)
			}
		}
		for _, id := range op.Out {
			if k, ok := m.Index[id]; ok {
				nr.operands[t] = append(nr.operands[t], k)
			}
		}
	}
	return nr
}

// slack is min over u > t of A_t(>u)/rate + S(u) - S(t+1) (RecomputeBound),
// in µs: the time the copies back of the bytes off the device at op t have
// before they hold the step up, the tensors read last being off first;
// rate in bytes per µs, start the ops' starts (opStarts). +Inf when no
// storage could be off there.
//
// It also carries the delay forward: at least swapped bytes are off at op
// t however much recomputes drop, so op u starts at least
// late[t] + (swapped - A_t(>u))/rate - (S(u) - S(t+1)) late, and late[u]
// is raised to that.
func (nr *nextReads) slack(t int, start []float64, rate, swapped float64, late []float64) float64 {
	n := len(start) - 1
	nr.pool = nr.pool[:0]
	for k := range nr.m.Lifetimes {
		lt := &nr.m.Lifetimes[k]
		if max(lt.Alloc, 0) > t || lt.Free <= t || slices.Contains(nr.operands[t], int32(k)) {
			continue
		}
		next := n
		r := nr.reads[k]
		if x, _ := slices.BinarySearch(r, int32(t+1)); x < len(r) {
			next = int(r[x])
		}
		nr.pool = append(nr.pool, poolEntry{next, lt.Bytes})
	}
	if len(nr.pool) == 0 {
		return math.Inf(1)
	}
	slices.SortFunc(nr.pool, func(a, b poolEntry) int { return cmp.Compare(b.next, a.next) })
	// Latest read first: A(>u) is the bytes before the first entry read
	// at u.
	least := math.Inf(1)
	var after float64
	for x := 0; x < len(nr.pool); {
		u := nr.pool[x].next
		y := x
		for y < len(nr.pool) && nr.pool[y].next == u {
			y++
		}
		if u < n {
			least = min(least, after/rate+start[u]-start[t+1])
			if d := (swapped-after)/rate - (start[u] - start[t+1]); d > 0 {
				late[u] = max(late[u], late[t]+d)
			}
		}
		for ; x < y; x++ {
			after += float64(nr.pool[x].bytes)
		}
	}
	return least
}

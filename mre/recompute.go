package mre

import (
	"cmp"
	"container/heap"
	"encoding/binary"
	"errors"
	"math"
	"slices"
	"strings"

	"github.com/chameleon-go/chameleon/layer"
	"github.com/chameleon-go/chameleon/memory"
	"github.com/chameleon-go/chameleon/simulate"
	"github.com/chameleon-go/chameleon/trace"
)

// Recomputable marks the ops of a recorded iteration whose outputs may be
// dropped and made again by running the op once more: ops whose outputs
// depend only on their inputs. Left out are ops that draw random numbers
// (dropout, rand*, bernoulli, normal, uniform, multinomial, ...), whose
// output is undefined (empty*), that write into an input, a view of one or
// a persistent tensor (an output id that is also an input, an in-place
// name ending in "_", an "out" overload), collectives, and ops with no
// output. A recomputed op runs with the RNG state of the moment, so only
// ops that draw no random numbers qualify.
func Recomputable(it *trace.Iteration) []bool {
	out := make([]bool, len(it.Ops))
	for i := range it.Ops {
		out[i] = recomputable(it, &it.Ops[i])
	}
	return out
}

var nonDeterministic = []string{"dropout", "rand", "bernoulli", "normal", "uniform", "multinomial", "poisson",
	"exponential", "geometric", "cauchy", "empty", "set_", "resize", "c10d", "nccl", "all_reduce", "all_gather",
	"reduce_scatter", "broadcast_", "local_scalar", "item"}

func recomputable(it *trace.Iteration, op *trace.Op) bool {
	if len(op.Out) == 0 || strings.HasSuffix(op.Name, "_") || op.Overload == "out" || strings.HasPrefix(op.Overload, "out_") {
		return false
	}
	name := strings.ToLower(op.Name)
	for _, w := range nonDeterministic {
		if strings.Contains(name, w) {
			return false
		}
	}
	for _, o := range op.Out {
		if t := it.Tensors[o]; t == nil || t.Kind != trace.KindActivation || slices.Contains(op.In, o) {
			return false
		}
	}
	return true
}

// maxRemakeDepth is how many producers deep an input freed before a
// recompute may be made again for it (a chain of pointwise ops: GELU's
// tanh from its argument, made from the matrix product's output).
const maxRemakeDepth = 4

// maxRemakeCalls bounds the producers looked at to make one input again.
const maxRemakeCalls = 16

// rcand is a recompute candidate: an activation over one idle gap, made
// again by its producer, whose inputs all stay on the device, unchanged,
// until the recompute.
type rcand struct {
	simulate.Recompute
	cost   float64          // the producer's time, µs
	inputs []trace.TensorID // what must be resident at Before: the producer's inputs, remade ones' inputs for them
	net    int64            // bytes saved less the inputs held for it
	next   int              // the tensor's next use: Before unless a reader came first
	deep   bool             // an input is made again by a chain of producers
}

// recomputeCandidates lists the gaps of activations of at least minBytes,
// over at least one op after which the curve is over limit, whose producer
// is recomputable, writes that one output, and reads inputs unwritten from
// the producer to the recompute: on the device there, or freed before it
// and then held, or made again just before it (by their producers, from
// what is on the device, down to maxRemakeDepth producers deep). A gap
// whose inputs can be both held and made again deep is listed twice, once
// each way (rcand.deep). The list is ordered cheapest per byte first
// (stable: ties keep the order of the lifetimes and their gaps).
func recomputeCandidates(m *memory.Model, curve []int64, limit, minBytes int64, ok []bool, times []float64) []rcand {
	// The map is made here, not in opWrites, so that its header can stay
	// on the stack.
	cs := candScan{m: m, it: m.Iter, ok: ok, times: times, n: len(curve),
		over: overCounts(curve, limit), writes: map[trace.TensorID][]int32{}}
	opWrites(m.Iter, cs.writes)
	var out []rcand
	for k := range m.Lifetimes {
		out = cs.lifetime(out, &m.Lifetimes[k], minBytes)
	}
	// Cheapest per byte first.
	slices.SortStableFunc(out, func(a, b rcand) int {
		return cmp.Compare(a.cost/float64(a.net), b.cost/float64(b.net))
	})
	return out
}

// overCounts is the prefix count of the ops after which curve is over
// limit: over[t] counts those before op t (len(curve)+1 entries).
func overCounts(curve []int64, limit int64) []int32 {
	over := make([]int32, len(curve)+1)
	for t, v := range curve {
		over[t+1] = over[t]
		if v > limit {
			over[t+1]++
		}
	}
	return over
}

// opWrites lists in writes, per storage, the ops that write it, in op
// order: those that list it as an output, views aside (a view's output is
// its input's storage, unchanged).
func opWrites(it *trace.Iteration, writes map[trace.TensorID][]int32) {
	for i := range it.Ops {
		if len(it.Ops[i].Out) == 0 || layer.Classify(it, &it.Ops[i]) == layer.KindView {
			continue
		}
		for _, o := range it.Ops[i].Out {
			writes[o] = append(writes[o], int32(i))
		}
	}
}

// candScan is recomputeCandidates' state: the model and what it derives
// from it once, read-only while the lifetimes are scanned.
type candScan struct {
	m      *memory.Model
	it     *trace.Iteration
	ok     []bool    // per op: recomputable
	times  []float64 // per op: compute time, µs
	n      int       // ops
	over   []int32   // overCounts of the curve
	writes map[trace.TensorID][]int32
}

// unwritten reports whether no op in (from, to) writes id.
func (cs *candScan) unwritten(id trace.TensorID, from, to int) bool {
	for _, w := range cs.writes[id] {
		if int(w) > from && int(w) < to {
			return false
		}
	}
	return true
}

// liveAt reports whether a storage is on the device at op j anyway: the
// curve counts it at j. One it frees at j itself (Free == j, read last
// before j) is not: a recompute before j that reads it holds it (Kept), or
// the layout lays the recompute's block over it while the executor still
// keeps it for the recompute.
func liveAt(in *memory.Lifetime, j int) bool {
	return in.Tensor.Kind.Persistent() || ((in.LiveIn || in.Alloc < j) && in.Free > j)
}

// remake reports how an activation freed before op j can be made
// again there: its producer may run again and writes it alone, and
// reads storages unchanged since, each on the device at j or itself
// made again first (down to depth producers deep). It returns the ops
// to run, in order (the deepest first, each once), and the storages on
// the device they read. *calls bounds the producers looked at (wide
// ops several deep would be many).
func (cs *candScan) remake(in *memory.Lifetime, j, depth int, calls *int) ([]simulate.Remade, []trace.TensorID, bool) {
	if *calls--; *calls < 0 || depth == 0 || in.Tensor.Kind != trace.KindActivation || !in.ProducedHere() {
		return nil, nil, false
	}
	q := in.Alloc
	op := &cs.it.Ops[q]
	if !cs.ok[q] || len(op.Out) != 1 || !cs.unwritten(in.Tensor.ID, q, in.Free) {
		return nil, nil, false
	}
	var chain []simulate.Remade
	var pins []trace.TensorID
	for _, id := range op.In {
		l := cs.m.Lifetime(id)
		if l == nil || !cs.unwritten(id, q, j) {
			return nil, nil, false
		}
		if liveAt(l, j) {
			pins = appendNew(pins, id)
			continue
		}
		sub, subPins, ok := cs.remake(l, j, depth-1, calls)
		if !ok {
			return nil, nil, false
		}
		chain = appendRemade(chain, sub...)
		pins = appendNew(pins, subPins...)
	}
	return append(chain, simulate.Remade{Tensor: in.Tensor.ID, Bytes: in.Bytes, Op: q}), pins, true
}

// lifetime appends to out the candidates of lt's gaps, in order: none
// unless lt is an activation made here of at least minBytes (and one)
// whose producer is recomputable and writes it alone; then each gap of at
// least one op, with a point over the limit, and lt unwritten from its
// producer to the gap's start, gives its candidate made again one
// producer deep (else held), then, where it differs, the deep one.
func (cs *candScan) lifetime(out []rcand, lt *memory.Lifetime, minBytes int64) []rcand {
	if lt.Tensor.Kind != trace.KindActivation || !lt.ProducedHere() || lt.Bytes < max(minBytes, 1) {
		return out
	}
	p := lt.Alloc
	op := &cs.it.Ops[p]
	if !cs.ok[p] || len(op.Out) != 1 {
		return out
	}
	var inputs []trace.TensorID
	for _, id := range op.In {
		if !slices.Contains(inputs, id) {
			inputs = append(inputs, id)
		}
	}
	for u := 1; u < len(lt.Uses); u++ {
		i, j := int(lt.Uses[u-1]), int(lt.Uses[u])
		if j-i < 2 || j >= cs.n || cs.over[j]-cs.over[i+1] == 0 || !cs.unwritten(lt.Tensor.ID, p, i+1) {
			continue
		}
		// Two ways to treat an input freed before the recompute: made
		// again by its own producer when that reads what is on the
		// device, else held; or, deeper, made again by a chain of
		// producers. Each is a candidate where they differ (the
		// picker takes one gap once).
		held, okHeld := cs.gapCandidate(lt, inputs, i, j, 1)
		if okHeld {
			out = append(out, held)
		}
		if deep, ok := cs.gapCandidate(lt, inputs, i, j, maxRemakeDepth); ok && !slices.Equal(deep.Remade, held.Remade) {
			deep.deep = true
			out = append(out, deep)
		}
	}
	return out
}

// gapCandidate is the recompute of lt, dropped after op i, before op j,
// with inputs (its producer's, deduplicated) freed earlier made again up
// to depth producers deep, else held. It fails when an input is unknown
// or written between the producer and j, or when holding inputs costs as
// many bytes as dropping lt saves. The candidate's cost is the producer's
// time plus the remade ones'; its inputs are what must be resident at j.
func (cs *candScan) gapCandidate(lt *memory.Lifetime, inputs []trace.TensorID, i, j, depth int) (rcand, bool) {
	p := lt.Alloc
	var kept []simulate.Kept
	var remade []simulate.Remade
	var keptB int64
	cost := cs.times[p]
	pins := slices.Clone(inputs)
	for _, id := range inputs {
		in := cs.m.Lifetime(id)
		if in == nil || !cs.unwritten(id, p, j) {
			return rcand{}, false
		}
		if liveAt(in, j) {
			continue // on the device at j anyway
		}
		calls := maxRemakeCalls
		if chain, qin, ok := cs.remake(in, j, depth, &calls); ok {
			remade = appendRemade(remade, chain...)
			pins = appendNew(slices.DeleteFunc(pins, func(x trace.TensorID) bool { return x == id }), qin...)
			continue
		}
		// An input the curve releases inside op p itself (its last use,
		// an autograd node dropping what it saved) is held from after p.
		kept = append(kept, simulate.Kept{Tensor: id, Bytes: in.Bytes, From: max(in.Free, p+1)})
		keptB += in.Bytes
	}
	if keptB >= lt.Bytes {
		return rcand{}, false
	}
	for _, r := range remade {
		cost += cs.times[r.Op]
	}
	return rcand{
		Recompute: simulate.Recompute{Tensor: lt.Tensor.ID, Bytes: lt.Bytes, Op: p, Drop: i, Before: j, Kept: kept, Remade: remade},
		cost:      cost, inputs: pins, net: lt.Bytes - keptB, next: j,
	}, true
}

// keptFor is what of kept a recompute made before op before still holds:
// an input held from after before (the curve frees it later) is not held
// for it. A held input freed at before itself stays (liveAt). kept is
// cloned where something goes, never changed.
func keptFor(kept []simulate.Kept, before int) []simulate.Kept {
	past := func(k simulate.Kept) bool { return k.From > before }
	if !slices.ContainsFunc(kept, past) {
		return kept
	}
	return slices.DeleteFunc(slices.Clone(kept), past)
}

// appendNew appends to ids those of xs it does not hold yet.
func appendNew(ids []trace.TensorID, xs ...trace.TensorID) []trace.TensorID {
	for _, x := range xs {
		if !slices.Contains(ids, x) {
			ids = append(ids, x)
		}
	}
	return ids
}

// appendRemade appends to rs those of more whose tensor it does not hold
// yet, in order.
func appendRemade(rs []simulate.Remade, more ...simulate.Remade) []simulate.Remade {
	for _, r := range more {
		if !slices.ContainsFunc(rs, func(c simulate.Remade) bool { return c.Tensor == r.Tensor }) {
			rs = append(rs, r)
		}
	}
	return rs
}

// pickRecomputes selects recomputes that relieve points still over the
// limit, cheapest per byte saved first, until their time reaches budget µs
// or no point is left, then drops those the others make redundant
// (dearest first). A byte saved counts once per op it relieves over the
// limit, as the paper's score counts reduction points: a recompute over a
// short gap where little is over the limit saves little, however cheap
// its op. The ranking is lazy: a candidate's saving only shrinks as others
// are taken, so the best of those re-evaluated is the best of all.
//
// Recomputes chain: when a chosen recompute reads a tensor that is itself
// dropped at that time, the tensor is recomputed first, at the same op,
// so its own drop ends there (its recompute moves earlier, and so on down
// the chain); a tensor read by a chosen recompute is dropped only up to
// that read. A recompute is taken only if, with its chain, it relieves a
// point over the limit and pushes none over it.
func pickRecomputes(rcs []rcand, need []int64, budget float64) []rcand {
	order, spent := pickOrder(rcs, need)
	k, _ := slices.BinarySearchFunc(spent, budget, func(v, b float64) int {
		if v <= b {
			return -1
		}
		return 1
	})
	return pickPrefix(rcs, need, order[:k])
}

func newPicker(need []int64) *picker {
	return &picker{rem: slices.Clone(need), readers: map[trace.TensorID][]int{}, held: map[trace.TensorID]int{},
		dropped: map[trace.TensorID][]int{}}
}

// pickOrder runs the selection with no budget: the candidates taken, in
// order (indices into rcs), and the time of each prefix of them. A budget
// takes the longest prefix it pays for, so one run serves every budget.
func pickOrder(rcs []rcand, need []int64) (order []int, spent []float64) {
	ps := newPicker(need)
	h := make(rankHeap, 0, len(rcs))
	for x := range rcs {
		if _, gain, ok := ps.trial(rcs[x]); ok {
			h = append(h, ranked{x, rcs[x].cost / float64(gain)})
		}
	}
	heap.Init(&h)
	var total float64
	for h.Len() > 0 {
		top := heap.Pop(&h).(ranked)
		c, gain, ok := ps.trial(rcs[top.x])
		if !ok {
			continue
		}
		if r := rcs[top.x].cost / float64(gain); h.Len() > 0 && r > h[0].key*(1+1e-9) {
			heap.Push(&h, ranked{top.x, r}) // worth less than it was: rank it again
			continue
		}
		ps.commit(c)
		total += c.cost
		order, spent = append(order, top.x), append(spent, total)
		if !slices.ContainsFunc(ps.rem, func(v int64) bool { return v > 0 }) {
			break
		}
	}
	return order, spent
}

// pickPrefix takes the candidates of order as pickOrder took them, then
// drops those the others make redundant.
func pickPrefix(rcs []rcand, need []int64, order []int) []rcand {
	ps := newPicker(need)
	for _, x := range order {
		if c, _, ok := ps.trial(rcs[x]); ok {
			ps.commit(c)
		}
	}
	return ps.prune(need)
}

// ranked is a candidate (index x) with its cost per byte saved.
type ranked struct {
	x   int
	key float64
}

// rankHeap is a min-heap of ranked candidates, ties by index.
type rankHeap []ranked

func (h rankHeap) Len() int { return len(h) }
func (h rankHeap) Less(a, b int) bool {
	return h[a].key < h[b].key || (h[a].key == h[b].key && h[a].x < h[b].x)
}
func (h rankHeap) Swap(a, b int) { h[a], h[b] = h[b], h[a] }
func (h *rankHeap) Push(v any)   { *h = append(*h, v.(ranked)) }
func (h *rankHeap) Pop() any {
	old := *h
	v := old[len(old)-1]
	*h = old[:len(old)-1]
	return v
}

// picker is pickRecomputes' state.
type picker struct {
	rem     []int64
	chosen  []rcand
	dropped map[trace.TensorID][]int // chosen indices, per tensor
	readers map[trace.TensorID][]int // ops before which a chosen recompute reads the tensor
	held    map[trace.TensorID]int   // kept inputs: held up to this op
	// Scratch of a trial: its change to rem, as bytes over ranges of ops,
	// the ends of the ranges, and its recomputes moved earlier.
	ranges []opRange
	ends   []int
	moves  []move
}

// opRange is b bytes over the ops [lo, hi).
type opRange struct {
	lo, hi int
	b      int64
}

// chains reports whether a chosen recompute of one of inputs is dropped
// at op t: taking a recompute that reads them there moves it (chain).
func (ps *picker) chains(inputs []trace.TensorID, t int) bool {
	for _, id := range inputs {
		for _, x := range ps.dropped[id] {
			if d := ps.chosen[x]; t > d.Drop && t < d.Before {
				return true
			}
		}
	}
	return false
}

// move is a chosen recompute, x, made earlier: before op to.
type move struct{ x, to int }

// trial works out what taking c would do, with its chain: c as it would
// be taken, the bytes times ops over the limit it relieves, and whether
// it pays (relieves some and pushes no point over the limit). The change
// stays in the scratch (ranges, moves) for commit.
func (ps *picker) trial(c rcand) (rcand, int64, bool) {
	// A gap is dropped once, however many ways it may be made again.
	for _, x := range ps.dropped[c.Tensor] {
		if ps.chosen[x].Drop == c.Drop {
			return c, 0, false
		}
	}
	// Dropped only up to its first reader.
	for _, t := range ps.readers[c.Tensor] {
		if t > c.Drop && t < c.Before {
			c.Before = t
		}
	}
	if c.Before <= c.Drop+1 {
		return c, 0, false
	}
	c.Kept = keptFor(c.Kept, c.Before)
	ps.moves, ps.ranges = ps.moves[:0], ps.ranges[:0]
	ps.add(c.Drop+1, c.Before, -c.Bytes)
	if len(c.Kept) == 0 && !ps.chains(c.inputs, c.Before) {
		// Alone: the drop's gap is all it changes, and a drop pushes no
		// point over the limit.
		gain := int64(0)
		for _, r := range ps.rem[c.Drop+1 : c.Before] {
			if r > 0 {
				gain += min(r, c.Bytes)
			}
		}
		return c, gain, gain > 0
	}
	for _, k := range c.Kept {
		ps.add(max(k.From, ps.held[k.Tensor]), c.Before, k.Bytes)
	}
	ps.chain(c.inputs, c.Before)
	if ps.strands() {
		return c, 0, false
	}
	// The change is constant between the ranges' ends: sum it piece by
	// piece.
	ps.ends = ps.ends[:0]
	for _, r := range ps.ranges {
		ps.ends = append(ps.ends, r.lo, r.hi)
	}
	slices.Sort(ps.ends)
	ps.ends = slices.Compact(ps.ends)
	gain := int64(0)
	for e := 1; e < len(ps.ends); e++ {
		lo, hi := ps.ends[e-1], ps.ends[e]
		var d int64
		for _, r := range ps.ranges {
			if r.lo <= lo && hi <= r.hi {
				d += r.b
			}
		}
		for _, r := range ps.rem[lo:hi] {
			before, after := max(r, 0), max(r+d, 0)
			if after > 0 && before == 0 {
				return c, 0, false
			}
			gain += before - after
		}
	}
	return c, gain, gain > 0
}

// commit takes c, as the last trial worked it out.
func (ps *picker) commit(c rcand) {
	for _, r := range ps.ranges {
		for t := r.lo; t < r.hi; t++ {
			ps.rem[t] += r.b
		}
	}
	for _, m := range ps.moves {
		d := &ps.chosen[m.x]
		d.Before = m.to
		d.Kept = keptFor(d.Kept, m.to)
		for _, id := range d.inputs {
			ps.readers[id] = append(ps.readers[id], m.to)
		}
	}
	x := len(ps.chosen)
	ps.chosen = append(ps.chosen, c)
	ps.dropped[c.Tensor] = append(ps.dropped[c.Tensor], x)
	for _, id := range c.inputs {
		ps.readers[id] = append(ps.readers[id], c.Before)
	}
	for _, k := range c.Kept {
		ps.held[k.Tensor] = max(ps.held[k.Tensor], c.Before, k.From)
	}
}

// add changes the trial's rem by b over the ops [lo, hi).
func (ps *picker) add(lo, hi int, b int64) {
	if lo < hi {
		ps.ranges = append(ps.ranges, opRange{lo, hi, b})
	}
}

// strands reports whether the trial's moves leave a chosen recompute that
// only ran for a reader now moved away: one that the move's reader read
// before its old op, which nothing else reads there and which is not
// moved along.
func (ps *picker) strands() bool {
	moved := func(x int) bool { return slices.ContainsFunc(ps.moves, func(m move) bool { return m.x == x }) }
	for _, m := range ps.moves {
		old := ps.chosen[m.x].Before
		for _, id := range ps.chosen[m.x].inputs {
			for _, y := range ps.dropped[id] {
				if ps.chosen[y].Before != old || moved(y) {
					continue
				}
				read := false
				for z := range ps.chosen {
					if z != m.x && !moved(z) && ps.chosen[z].Before == old && slices.Contains(ps.chosen[z].inputs, id) {
						read = true
					}
				}
				if !read && !ps.natural(y) {
					return true
				}
			}
		}
	}
	return false
}

// feeds reports whether chosen[x] reads a recompute made only for it.
func (ps *picker) feeds(x int) bool {
	c := ps.chosen[x]
	for _, id := range c.inputs {
		for _, y := range ps.dropped[id] {
			if ps.chosen[y].Before == c.Before && !ps.natural(y) {
				return true
			}
		}
	}
	return false
}

// natural reports whether chosen[x] is made again for its own next use,
// not for a reader.
func (ps *picker) natural(x int) bool { return ps.chosen[x].Before == ps.chosen[x].next }

// chain moves the recompute of any of inputs dropped at op t to t, and so
// on for theirs, recording the moves and their change to the need.
func (ps *picker) chain(inputs []trace.TensorID, t int) {
	for _, id := range inputs {
		for _, x := range ps.dropped[id] {
			d := ps.chosen[x]
			for _, m := range ps.moves {
				if m.x == x {
					d.Before = min(d.Before, m.to)
				}
			}
			if t <= d.Drop || t >= d.Before {
				continue
			}
			ps.add(t, d.Before, d.Bytes) // on the device again from t
			ps.moves = append(ps.moves, move{x, t})
			ps.chain(d.inputs, t)
		}
	}
}

// prune drops chosen recomputes the others make redundant, dearest first
// (rem < 0 is slack). Those that hold inputs or are read by another stay:
// others depend on them.
func (ps *picker) prune(need []int64) []rcand {
	order := make([]int, len(ps.chosen))
	for x := range order {
		order[x] = x
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Compare(ps.chosen[b].cost, ps.chosen[a].cost) })
	keep := make([]bool, len(ps.chosen))
	for x := range keep {
		keep[x] = true
	}
	for _, x := range order {
		c := ps.chosen[x]
		if len(c.Kept) > 0 || slices.ContainsFunc(ps.readers[c.Tensor], func(t int) bool { return t > c.Drop && t <= c.Before }) ||
			ps.feeds(x) {
			continue
		}
		redundant := true
		for t := c.Drop + 1; t < c.Before && redundant; t++ {
			redundant = need[t] <= 0 || ps.rem[t]+c.Bytes <= 0
		}
		if redundant {
			keep[x] = false
			for t := c.Drop + 1; t < c.Before; t++ {
				ps.rem[t] += c.Bytes
			}
		}
	}
	var out []rcand
	for x, c := range ps.chosen {
		if keep[x] {
			out = append(out, c)
		}
	}
	return out
}

// recomputeBudgets are the recompute times tried, as shares of the
// iteration's compute time; the last takes every useful recompute.
var recomputeBudgets = []float64{0, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1e9}

// planHybrid plans swaps and recomputes together. For each recompute
// budget (from none, the swap-only plan, to every useful recompute) it
// picks the recomputes that are cheapest per byte, plans swaps for the need
// they leave with the swap planner, whose rounds simulate both, and keeps
// the fastest policy on the simulated timeline. Recompute costs compute
// time and nothing on the link; swapping costs link time and nothing on
// the compute stream while it hides; the search finds where the link stops
// hiding.
func planHybrid(in Input, curve []int64, cfg config) (*Policy, error) {
	n := len(curve)
	need := make([]int64, n)
	for t, v := range curve {
		need[t] = v - in.Limit
	}
	// No size threshold: a recompute costs no copy, and cost per byte
	// orders the small ones last.
	rcs := recomputeCandidates(in.Model, curve, in.Limit, 0, in.Recomputable, in.OpTimes)
	memo := planMemo{}
	pol, err := hybridWith(in, curve, cfg, need, rcs, memo)
	// A chain that makes a freed input again saves the bytes holding it
	// would cost, for more time; ranked by what they save, such
	// recomputes can crowd out cheaper ones that hold. The search runs
	// again without them, and the faster policy is kept.
	if shallow := slices.DeleteFunc(slices.Clone(rcs), func(c rcand) bool { return c.deep }); len(shallow) < len(rcs) {
		sp, serr := hybridWith(in, curve, cfg, need, shallow, memo)
		if serr != nil && !errors.Is(serr, ErrInfeasible) {
			return nil, serr
		}
		if serr == nil && (err != nil || sp.Sim.IterationUS < pol.Sim.IterationUS) {
			return sp, nil
		}
	}
	return pol, err
}

// planMemo holds the policies planWith made for lists of recomputes, by
// the list and the rounds: the two searches of planHybrid screen many of
// the same lists (those with no chain to leave out), and planWith is a
// pure function of them. A candidate is its gap (tensor, drop, before)
// and whether it makes its inputs again deep.
type planMemo map[string]memoPlan

type memoPlan struct {
	pol *Policy
	err error
}

// plan is planWith through the memo.
func (m planMemo) plan(in Input, curve []int64, cfg config, rcs []rcand) (*Policy, error) {
	b := binary.AppendUvarint(make([]byte, 0, 8+len(rcs)*10), uint64(cfg.rounds))
	for _, c := range rcs {
		b = binary.AppendVarint(b, int64(c.Tensor))
		b = binary.AppendUvarint(b, uint64(c.Drop))
		gap := uint64(c.Before) << 1
		if c.deep {
			gap |= 1
		}
		b = binary.AppendUvarint(b, gap)
	}
	k := string(b)
	if e, ok := m[k]; ok {
		return e.pol, e.err
	}
	pol, err := planWith(in, curve, cfg, rcs)
	m[k] = memoPlan{pol, err}
	return pol, err
}

// hybridWith is planHybrid's search over the recompute candidates rcs.
// Every budget is tried: the simulated time is not unimodal in the budget
// (a few recomputes can make the swap plan worse, more make it far
// better), so stopping early misses the best. The selection runs once per
// ranking (each budget takes a prefix of its order), and a budget whose
// recomputes alone take the iteration past the best policy so far is not
// planned: recomputes run on the compute stream, so no swap plan can make
// it faster.
//
// The strategies run in order, each screening sets of recomputes with one
// plan-simulate round: the budgets of each ranking (tryBudgets), the
// prefixes next to the fastest (tryNearPrefixes), the rankings that leave
// long gaps to the swaps (tryLinkShares); then the fastest screened sets get
// every round (refine), and the best policy recomputes more where it still
// waits (fromStall). With no policy that meets the limit, it returns the
// last ErrInfeasible met (nil when nothing was screened).
func hybridWith(in Input, curve []int64, cfg config, need []int64, rcs []rcand, memo planMemo) (*Policy, error) {
	h := hybridSearch{in: in, curve: curve, cfg: cfg, need: need, rcs: rcs, memo: memo}
	h.init()
	// Each budget takes a prefix of one of two rankings. The first takes
	// the tensors made early in the forward as readily as the late ones,
	// but only the early ones have the link to themselves before the curve
	// reaches the limit: the second, when it differs, leaves those to
	// swaps (early). The search state is made here, apart from h, so that
	// it can stay on the stack.
	order, spent := pickOrder(rcs, need)
	ps := prefixScreen{ranks: []ranking{{rcs, order, spent}}, tried: map[rankPrefix]bool{}, topUS: math.Inf(1)}
	if rest := early(rcs, need, in.OpTimes, cfg.link.D2H); len(rest) < len(rcs) {
		o, sp := pickOrder(rest, need)
		ps.ranks = append(ps.ranks, ranking{rest, o, sp})
	}
	if err := h.tryBudgets(&ps); err != nil {
		return nil, err
	}
	if err := h.tryNearPrefixes(&ps); err != nil {
		return nil, err
	}
	if len(order) > 0 {
		if err := h.tryLinkShares(); err != nil {
			return nil, err
		}
	}
	if err := h.refine(); err != nil {
		return nil, err
	}
	if h.best.pol == nil {
		return nil, h.bestErr
	}
	return h.fromStall(), nil
}

// hybridTrial is a set of recomputes screened by hybridWith.
type hybridTrial struct {
	picked []rcand
	first  float64 // the iteration after one plan-simulate round
	extra  bool    // not a budget of the first ranking
}

// hybridFound is a policy with its recomputes and its iteration after one
// round.
type hybridFound struct {
	pol    *Policy
	picked []rcand
	first  float64
}

// ranking is an order in which pickOrder takes rcs, with the time of each
// prefix of it.
type ranking struct {
	rcs   []rcand
	order []int
	spent []float64
}

// rankPrefix is the first k candidates of ranking r.
type rankPrefix struct{ r, k int }

// prefixScreen is the state of hybridWith's search over prefixes of
// rankings: the rankings, the prefixes screened (each once), and top, the
// one whose screen was fastest (topUS, +Inf while none met the limit).
type prefixScreen struct {
	ranks []ranking
	tried map[rankPrefix]bool
	top   rankPrefix
	topUS float64
}

// hybridSearch is hybridWith's state, the search over prefixes aside
// (prefixScreen).
//
// Invariants: trials holds every set screened that met the limit, in the
// order screened (until refine sorts it); best is the fastest policy found
// so far, first the fastest of the sets that are not extra.
type hybridSearch struct {
	in     Input
	curve  []int64
	cfg    config // every plan-simulate round
	screen config // one round
	need   []int64
	rcs    []rcand
	memo   planMemo
	base   float64 // the iteration's compute time, µs

	trials  []hybridTrial
	best    hybridFound
	first   hybridFound
	bestErr error
}

// init sums the op times into base and sets up the one-round screen.
func (h *hybridSearch) init() {
	for _, d := range h.in.OpTimes {
		h.base += d
	}
	h.screen = h.cfg
	h.screen.rounds = 1
}

// keep takes f as the best policy and, unless extra, as the first
// ranking's best, where it is faster than the one held.
func (h *hybridSearch) keep(f hybridFound, extra bool) {
	if h.best.pol == nil || f.pol.Sim.IterationUS < h.best.pol.Sim.IterationUS {
		h.best = f
	}
	if !extra && (h.first.pol == nil || f.pol.Sim.IterationUS < h.first.pol.Sim.IterationUS) {
		h.first = f
	}
}

// try screens picked (one plan-simulate round) and records it as a trial;
// extra: it is not a budget of the first ranking. A set that cannot meet
// the limit is skipped, its error kept in bestErr; any other error is
// returned.
func (h *hybridSearch) try(picked []rcand, extra bool) error {
	pol, err := h.memo.plan(h.in, h.curve, h.screen, picked)
	if err != nil {
		if !errors.Is(err, ErrInfeasible) {
			return err
		}
		h.bestErr = err
		return nil
	}
	h.trials = append(h.trials, hybridTrial{picked, pol.Sim.IterationUS, extra})
	h.keep(hybridFound{pol, picked, pol.Sim.IterationUS}, extra)
	return nil
}

// tryPrefix screens prefix p of ps's rankings once and reports whether it
// is the fastest so far (it becomes ps.top).
func (h *hybridSearch) tryPrefix(ps *prefixScreen, p rankPrefix, extra bool) (bool, error) {
	if ps.tried[p] {
		return false, nil
	}
	ps.tried[p] = true
	had := len(h.trials)
	if err := h.try(pickPrefix(ps.ranks[p.r].rcs, h.need, ps.ranks[p.r].order[:p.k]), extra); err != nil {
		return false, err
	}
	if len(h.trials) > had && h.trials[had].first < ps.topUS {
		ps.top, ps.topUS = p, h.trials[had].first
		return true, nil
	}
	return false, nil
}

// tryBudgets screens, for each recompute budget, the longest prefix of the
// first ranking it pays for; the second ranking is tried at the budgets
// next to the first's fastest, and at that one.
func (h *hybridSearch) tryBudgets(ps *prefixScreen) error {
	topShare := 0
	for r, rk := range ps.ranks {
		for b, share := range recomputeBudgets {
			if r > 0 && (b < topShare-1 || b > topShare+1) {
				continue
			}
			k := 0
			for k < len(rk.spent) && rk.spent[k] <= share*h.base {
				k++
			}
			fastest, err := h.tryPrefix(ps, rankPrefix{r, k}, r > 0)
			if err != nil {
				return err
			}
			if r == 0 && fastest {
				topShare = b
			}
		}
	}
	return nil
}

// tryNearPrefixes screens every prefix within nearPrefix of the fastest:
// the budgets are coarse in counts where each recompute is dear. The
// bounds follow ps.top as it moves (a nearer prefix found faster
// recentres the walk), as the prefixes are screened. Nothing is tried
// when no prefix met the limit.
func (h *hybridSearch) tryNearPrefixes(ps *prefixScreen) error {
	if math.IsInf(ps.topUS, 1) {
		return nil
	}
	for k := max(ps.top.k-nearPrefix, 0); k <= min(ps.top.k+nearPrefix, len(ps.ranks[ps.top.r].order)); k++ {
		if _, err := h.tryPrefix(ps, rankPrefix{ps.top.r, k}, true); err != nil {
			return err
		}
	}
	return nil
}

// tryLinkShares screens the rankings over the need less what the link
// could have copied out before each op and back after it, at each of
// linkShares of its rate. The budgets rank recomputes over the whole need,
// so they take the long gaps that swaps would hide for free as readily as
// the short ones swaps cannot; these leave the long gaps to the swaps up
// to the link's rate, and every useful recompute of them is tried.
// (hybridWith tries none when the first ranking takes no recompute.)
func (h *hybridSearch) tryLinkShares() error {
	n := len(h.curve)
	start := opStarts(h.in.OpTimes)
	for _, share := range linkShares {
		less := make([]int64, n)
		for t := range n {
			out := h.cfg.link.D2HShared * start[t] / 1e6
			back := h.cfg.link.H2DShared * (start[n] - start[t+1]) / 1e6
			less[t] = h.need[t] - int64(share*min(out, back))
		}
		o, _ := pickOrder(h.rcs, less)
		if err := h.try(pickPrefix(h.rcs, less, o), false); err != nil {
			return err
		}
	}
	return nil
}

// refine runs every plan-simulate round for the trials whose first round
// was fastest: refinedBudgets of the first ranking's budgets and
// refinedExtra of the others, fastest first. A trial whose recomputes
// alone take the iteration past the best policy so far is not planned
// further: recomputes run on the compute stream, so no swap plan can make
// it faster. The trials end sorted by their first round (stable).
func (h *hybridSearch) refine() error {
	slices.SortStableFunc(h.trials, func(a, b hybridTrial) int { return cmp.Compare(a.first, b.first) })
	// How many trials get every round: of the first ranking's budgets, of
	// the others.
	quota := [2]int{refinedBudgets, refinedExtra}
	var refined [2]int
	for _, tr := range h.trials {
		if h.cfg.rounds == 1 || refined == quota {
			break
		}
		i := 0
		if tr.extra {
			i = 1
		}
		if refined[i] == quota[i] {
			continue
		}
		refined[i]++
		var cost float64
		for _, c := range tr.picked {
			cost += c.cost
		}
		if h.base+cost >= h.best.pol.Sim.IterationUS {
			continue
		}
		pol, err := h.memo.plan(h.in, h.curve, h.cfg, tr.picked)
		if err != nil {
			return err // the first round met the limit: so do the rest
		}
		h.keep(hybridFound{pol, tr.picked, tr.first}, tr.extra)
	}
	return nil
}

// fromStall runs atStall from the best policy, and from the best of the
// first ranking's budgets where that is another (a start that waits longer
// may end faster), and returns the faster result (the best's on a tie).
// best must be set.
func (h *hybridSearch) fromStall() *Policy {
	out := h.atStall(h.best)
	if h.first.pol != nil && h.first.pol != h.best.pol {
		if pol := h.atStall(h.first); pol.Sim.IterationUS < out.Sim.IterationUS {
			out = pol
		}
	}
	return out
}

// atStall refines f where it still waits for copies: it recomputes more
// of what is on the device there instead, the cheapest per byte first, as
// many bytes as the link moves in the wait (addAtStall), for up to
// stallRounds rounds while that makes the iteration faster. Each round is
// screened (one plan-simulate round, against the same for the best set),
// and the set the rounds end with gets every round; it is returned when
// faster than f, else f's policy. A policy that waits less than stallFloor
// of the compute time is returned as is.
func (h *hybridSearch) atStall(f hybridFound) *Policy {
	if f.pol.Sim.StallUS < stallFloor*h.base {
		return f.pol
	}
	cur, sim, curUS := f.picked, f.pol.Sim, f.first
	for range stallRounds {
		more := addAtStall(h.rcs, h.need, cur, sim, h.cfg.link.D2HShared)
		if more == nil {
			break
		}
		pol, err := h.memo.plan(h.in, h.curve, h.screen, more)
		if err != nil || pol.Sim.IterationUS >= curUS {
			break
		}
		cur, sim, curUS = more, pol.Sim, pol.Sim.IterationUS
	}
	if len(cur) != len(f.picked) {
		if pol, err := h.memo.plan(h.in, h.curve, h.cfg, cur); err == nil && pol.Sim.IterationUS < f.pol.Sim.IterationUS {
			return pol
		}
	}
	return f.pol
}

// nearPrefix is how many recomputes either side of the fastest budget's
// planHybrid tries as budgets of their own.
const nearPrefix = 2

// early is rcs less the recomputes a swap could stand for with the link
// to itself: walking them in the order they are dropped, one whose copy
// out, queued at rate bytes per second behind those already left to
// swaps, is done before the first op of its gap over the limit (need > 0)
// is left to the swaps, unless its recompute takes less than a tenth of
// that copy's time.
func early(rcs []rcand, need []int64, times []float64, rate float64) []rcand {
	start := opStarts(times)
	idx := make([]int, len(rcs))
	for x := range idx {
		idx[x] = x
	}
	slices.SortStableFunc(idx, func(a, b int) int { return cmp.Compare(rcs[a].Drop, rcs[b].Drop) })
	leave := make([]bool, len(rcs))
	free := 0.0 // when the link is next free, µs
	for _, x := range idx {
		c := &rcs[x]
		first := c.Drop + 1
		for first < c.Before && need[first] <= 0 {
			first++
		}
		copyUS := float64(c.Bytes) / rate * 1e6
		if first == c.Before || c.cost < copyUS/10 {
			continue
		}
		if at := max(free, start[c.Drop+1]) + copyUS; at <= start[first] {
			leave[x], free = true, at
		}
	}
	var out []rcand
	for x := range rcs {
		if !leave[x] {
			out = append(out, rcs[x])
		}
	}
	return out
}

// stallFloor: a best policy that waits less than this share of the
// iteration's compute time is not refined (addAtStall).
const stallFloor = 0.005

// stallRounds bounds planHybrid's rounds that recompute more where the
// best policy waits.
const stallRounds = 4

// addAtStall is picked with recomputes of rcs added over the op where sim
// waits longest, the cheapest per byte first, until they drop the bytes a
// link of rate bytes per second moves in that wait; nil when there is no
// wait or nothing to add.
func addAtStall(rcs []rcand, need []int64, picked []rcand, sim *simulate.Result, rate float64) []rcand {
	w, wait := -1, 0.0
	for t, op := range sim.Ops {
		if op.Stall > wait {
			w, wait = t, op.Stall
		}
	}
	if w < 0 {
		return nil
	}
	type gap struct {
		id   trace.TensorID
		drop int
	}
	have := make(map[gap]bool, len(picked))
	ps := newPicker(need)
	for _, c := range picked {
		have[gap{c.Tensor, c.Drop}] = true
		if c2, _, ok := ps.trial(c); ok {
			ps.commit(c2)
		}
	}
	var at []int
	for x, c := range rcs {
		if !have[gap{c.Tensor, c.Drop}] && c.Drop < w && c.Before > w {
			at = append(at, x)
		}
	}
	slices.SortStableFunc(at, func(a, b int) int {
		return cmp.Compare(rcs[a].cost/float64(rcs[a].net), rcs[b].cost/float64(rcs[b].net))
	})
	want := int64(wait / 1e6 * rate)
	var got int64
	for _, x := range at {
		if got >= want {
			break
		}
		if c, _, ok := ps.trial(rcs[x]); ok {
			ps.commit(c)
			got += c.Bytes
		}
	}
	if got == 0 {
		return nil
	}
	return ps.chosen
}

// linkShares are the shares of the link's rate left to swaps in the
// rankings that leave long gaps to them (planHybrid).
var linkShares = []float64{0.6, 0.8, 1}

// refinedBudgets is how many budgets, the fastest after one round, get
// every plan-simulate round.
const refinedBudgets = 3

// refinedExtra is how many of the other trials get every round.
const refinedExtra = 1

// planWith plans swaps for what the recomputes rcs leave over the limit.
func planWith(in Input, curve []int64, cfg config, rcs []rcand) (*Policy, error) {
	p := &planner{cfg: cfg, simCurve: curve}
	if len(rcs) == 0 {
		return planSwaps(in, curve, p)
	}
	left := slices.Clone(curve)
	type key struct {
		id  trace.TensorID
		out int
	}
	gone := map[key]bool{}               // a dropped tensor's gap: not swapped too
	pinned := map[trace.TensorID][]int{} // a recompute's inputs: on the device at its time
	for _, c := range rcs {
		p.recomputes = append(p.recomputes, c.Recompute)
	}
	for _, h := range simulate.Held(p.recomputes) {
		for t := h.From; t < h.To; t++ {
			left[t] += h.Bytes
		}
	}
	for _, c := range rcs {
		for t := c.Drop + 1; t < c.Before; t++ {
			left[t] -= c.Bytes
		}
		gone[key{c.Tensor, c.Drop}] = true
		for _, id := range c.inputs {
			pinned[id] = append(pinned[id], c.Before)
		}
	}
	sortRecomputes(p.recomputes)
	p.readAt = func(id trace.TensorID) int {
		last := -1
		for _, t := range pinned[id] {
			last = max(last, t)
		}
		return last
	}
	// A gap a recompute reads the tensor in is swapped in pieces around the
	// reads: back by the op before the recompute (which runs at the start
	// of its op, before that op's copies back are waited for), out again
	// after the recompute's op.
	p.fit = func(cs []Candidate) []Candidate {
		var out []Candidate
		for _, c := range cs {
			if gone[key{c.Tensor, c.Out}] {
				continue
			}
			from := c.Out
			reads := slices.Sorted(slices.Values(pinned[c.Tensor]))
			for _, j := range slices.Compact(reads) {
				if j <= c.Out || j >= c.Use {
					continue
				}
				if j-1-from >= 2 {
					out = append(out, Candidate{Tensor: c.Tensor, Bytes: c.Bytes, Out: from, Use: j - 1})
				}
				from = j
			}
			if c.Use-from >= 2 {
				out = append(out, Candidate{Tensor: c.Tensor, Bytes: c.Bytes, Out: from, Use: c.Use})
			}
		}
		return out
	}
	return planSwaps(in, left, p)
}

// sortRecomputes orders recomputes by the op they run before and, before
// one op, in producer order: a chain runs its links in order.
func sortRecomputes(rcs []simulate.Recompute) {
	slices.SortFunc(rcs, func(a, b simulate.Recompute) int {
		return cmp.Or(cmp.Compare(a.Before, b.Before), cmp.Compare(a.Op, b.Op), cmp.Compare(a.Tensor, b.Tensor))
	})
}

package mre

import (
	"cmp"
	"slices"

	"github.com/chameleon-go/chameleon/layer"
	"github.com/chameleon-go/chameleon/trace"
)

// TrafficBound is the least bytes any plan under in.Limit copies to the
// device in one iteration run over and over, swaps of every kind
// together (across the iteration's end too), in the model of in.Model and
// with the recomputes it admits under in.Recomputable (nil: none; the
// candidates need in.OpTimes).
//
// A storage must be on the device at each op that reads or writes it (view
// ops aside: they move no data). Between two such ops a and b it either
// stays on the device over the ops strictly between them, or leaves and,
// when op b reads it, comes back: its bytes cross the link in. An
// activation the model may make again over a gap (a recompute candidate
// there) counts as dropped over the whole gap at no link cost, whatever
// its inputs need. A storage that outlives the iteration has a gap from
// its last use to its first in the next. Relax "stays or leaves" to a
// share of the bytes that stays, and the least traffic is the bytes of
// every gap that ends in a read less the most that can stay, where the
// bytes that stay over an op, with the bytes its own operands and the
// model's Base take, fit in the limit.
//
// That maximum is an interval packing on the line of ops: taking gaps by
// their end, each as much as the least room left over it, is optimal (cut
// the bytes into unit intervals; an optimal packing that refuses a unit
// the greedy takes holds, at the leftmost op where adding it overflows, a
// unit ending no earlier, which covers every op from there to the end of
// the refused one, so the two can trade places). So the bound is exact
// for the relaxation (less what unrolling loses, trafficCopies) and
// ignores everything else: when copies can start, the recomputes' own
// inputs and cost, the copies out, and the order on the link. Any plan, of
// the package's planner or another, copies at least this much in.
//
// It bounds traffic, not time: a plan moves at least this over the link
// each iteration, so its steady-state step takes at least the bytes over
// the link's rate in.
func TrafficBound(in Input) int64 {
	m := in.Model
	if m == nil || m.Iter == nil {
		return 0
	}
	it := m.Iter
	n := len(it.Ops)
	if n == 0 {
		return 0
	}
	view := make([]bool, n)
	for t := range it.Ops {
		view[t] = layer.Classify(it, &it.Ops[t]) == layer.KindView
	}
	// Unroll trafficCopies iterations: a storage that outlives the
	// iteration (weights, optimizer state) leaves between its last use in
	// one and its first in the next, which one iteration alone does not
	// see. In steady state the copies of K iterations carry K times an
	// iteration's bytes, and at least the least for K unrolled ones (the
	// first begins in any state), so an iteration carries at least that
	// over K.
	const copies = trafficCopies
	need := make([]int64, n)
	base := max(m.Base, 0)
	for t := range need {
		need[t] = base
	}
	var gaps []gap
	reads := func(t int, k int) bool {
		for _, id := range it.Ops[t].In {
			if x, ok := m.Index[id]; ok && int(x) == k {
				return true
			}
		}
		return false
	}
	// A gap is free where the model admits making the storage again in
	// it: a recompute candidate over any of its ops.
	drops := map[trace.TensorID][][2]int{}
	if in.Recomputable != nil && len(in.OpTimes) == n {
		for _, rc := range recomputeCandidates(m, in.ResolveCurve(), in.Limit, 0, in.Recomputable, in.OpTimes) {
			drops[rc.Tensor] = append(drops[rc.Tensor], [2]int{rc.Drop, rc.Before})
		}
	}
	dropped := func(id trace.TensorID, a, b int) bool {
		for _, d := range drops[id] {
			if d[0] < b && d[1] > a {
				return true
			}
		}
		return false
	}
	var uses []int
	for k := range m.Lifetimes {
		lt := &m.Lifetimes[k]
		uses = uses[:0]
		for _, u := range lt.Uses {
			t := int(u)
			if t < 0 || t >= n || view[t] || (len(uses) > 0 && uses[len(uses)-1] == t) {
				continue
			}
			need[t] += lt.Bytes
			uses = append(uses, t)
		}
		if len(uses) == 0 {
			continue
		}
		for i := 1; i < len(uses); i++ {
			if a, b := uses[i-1], uses[i]; b > a+1 && reads(b, k) && !dropped(lt.Tensor.ID, a, b) {
				for c := range copies {
					gaps = append(gaps, gap{c*n + a + 1, c*n + b - 1, lt.Bytes})
				}
			}
		}
		if a, b := uses[len(uses)-1], uses[0]+n; lt.LiveIn && lt.LiveOut && b > a+1 && reads(uses[0], k) {
			for c := range copies - 1 {
				gaps = append(gaps, gap{c*n + a + 1, c*n + b - 1, lt.Bytes})
			}
		}
	}
	room := make([]int64, copies*n)
	for c := range copies {
		for t := range need {
			room[c*n+t] = max(in.Limit-need[t], 0)
		}
	}
	var total int64
	for _, g := range gaps {
		total += g.bytes
	}
	return (total - packGaps(room, gaps)) / copies
}

// gap is a storage's bytes off or on the device over the ops from..to.
type gap struct {
	from, to int
	bytes    int64
}

// packGaps is the most bytes of gaps that can stay on the device, a share
// of each at most its bytes, with what stays over each op t within room[t]
// (an interval packing: TrafficBound says why taking them by their end is
// optimal). gaps is reordered.
func packGaps(room []int64, gaps []gap) int64 {
	tree := newMinTree(len(room))
	for t, v := range room {
		tree.set(t, v)
	}
	tree.build()
	slices.SortStableFunc(gaps, func(a, b gap) int { return cmp.Compare(a.to, b.to) })
	var kept int64
	for _, g := range gaps {
		if y := min(g.bytes, tree.min(g.from, g.to)); y > 0 {
			tree.add(g.from, g.to, -y)
			kept += y
		}
	}
	return kept
}

// trafficCopies is how many iterations TrafficBound unrolls: the bytes of
// the gaps across one iteration boundary, which the first unrolled one
// does not count, weigh 1/trafficCopies of what an iteration carries.
const trafficCopies = 8

// minTree is a segment tree over ops: add to a range, least of a range.
type minTree struct {
	size int
	lo   []int64 // least of the node's range, its own adds included
	adds []int64 // added to the node's whole range
}

func newMinTree(n int) *minTree {
	size := 1
	for size < n {
		size *= 2
	}
	t := &minTree{size: size, lo: make([]int64, 2*size), adds: make([]int64, 2*size)}
	for i := range t.lo[size:] {
		t.lo[size+i] = 1<<62 - 1 // past the last op: never the least
	}
	return t
}

func (t *minTree) set(i int, v int64) { t.lo[t.size+i] = v }

func (t *minTree) build() {
	for i := t.size - 1; i >= 1; i-- {
		t.lo[i] = min(t.lo[2*i], t.lo[2*i+1])
	}
}

func (t *minTree) add(l, r int, v int64) { t.addAt(1, 0, t.size-1, l, r, v) }

func (t *minTree) addAt(x, nl, nr, l, r int, v int64) {
	if r < nl || nr < l {
		return
	}
	if l <= nl && nr <= r {
		t.lo[x] += v
		t.adds[x] += v
		return
	}
	mid := (nl + nr) / 2
	t.addAt(2*x, nl, mid, l, r, v)
	t.addAt(2*x+1, mid+1, nr, l, r, v)
	t.lo[x] = min(t.lo[2*x], t.lo[2*x+1]) + t.adds[x]
}

func (t *minTree) min(l, r int) int64 { return t.minAt(1, 0, t.size-1, l, r) }

func (t *minTree) minAt(x, nl, nr, l, r int) int64 {
	if r < nl || nr < l {
		return 1<<62 - 1
	}
	if l <= nl && nr <= r {
		return t.lo[x]
	}
	mid := (nl + nr) / 2
	return min(t.minAt(2*x, nl, mid, l, r), t.minAt(2*x+1, mid+1, nr, l, r)) + t.adds[x]
}

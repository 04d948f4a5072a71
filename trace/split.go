package trace

import (
	"fmt"
	"math"
	"slices"
	"strings"
)

// An op over lists of tensors whose elements do not depend on each other (a
// fused or _foreach_ optimizer step, a multi-tensor copy, the zeroing of
// gradients, the unscaling of a mixed-precision step) can run piece by
// piece: piece i reads and writes element i of each list, and the tensors
// every piece shares (a found-inf flag, a scale, a learning rate held in a
// tensor). Run whole, such an op holds every parameter, gradient and
// optimizer state on the device at once, which sets a floor under any
// plan; run in pieces, its working set is one piece.
//
// A trace lists an op's tensors flat, its lists one after the other, so
// Divide finds the lists: for an op whose name says it is made of pieces
// (pieceRules), it tries the list counts the name allows, the largest
// first, and takes the first that makes lists of equal length whose sizes
// agree element by element: every list is either proportional to the
// first (gradients and optimizer state to their parameters) or all of one
// size (a step counter per parameter). Tensors after the lists that every
// piece shares hold a number or two (maxSharedBytes); where the trailing
// tensors are that small, sharing them is tried first. A wrong guess of a
// larger list count that divides the true one only makes pieces coarser;
// a guess that would break a true piece apart needs lists of equal sizes
// at shifted positions, which the element-by-element check refuses unless
// every tensor has the same size.

// Pieces says how one op's tensor lists divide.
type Pieces struct {
	N        int // pieces: the length of each list
	Lists    int // lists of N at the head of In
	Shared   int // tensors after them in In, listed by every piece
	OutLists int // lists of N in Out (0: the op writes in place and lists no output)
}

// pieceRule is the list counts an op name allows.
type pieceRule struct {
	prefix             string
	minLists, maxLists int
	maxShared          int
}

// pieceRules are the ops known to be made of independent pieces, by name
// prefix (after "aten::"), with the lists their schemas have: a _foreach_
// op takes one to three lists (self, other, a second operand) and maybe a
// scalar tensor; a fused optimizer step its parameters, gradients, up to
// three state lists and step counters, then up to three shared tensors
// (grad_scale, found_inf, a tensor learning rate); the mixed-precision
// unscale its gradients, found_inf and inv_scale.
var pieceRules = []pieceRule{
	{"_foreach_", 1, 3, 1},
	{"_fused_adam", 2, 6, 3},
	{"_fused_adagrad", 2, 6, 3},
	{"_fused_sgd", 2, 4, 3},
	{"_amp_foreach_non_finite_check_and_unscale", 1, 1, 2},
}

// pieceRuleOf returns the rule for an op name, ok false when the op is not
// known to be made of pieces.
func pieceRuleOf(name string) (pieceRule, bool) {
	if _, n, ok := strings.Cut(name, "::"); ok {
		name = n
	}
	for _, r := range pieceRules {
		if strings.HasPrefix(name, r.prefix) {
			return r, true
		}
	}
	return pieceRule{}, false
}

// Divide returns how op of it divides into pieces; ok is false when op is
// not one known to be made of pieces, or its lists cannot be found (see
// the comment above Pieces). Tensors it lists that it does not declare
// count as zero bytes.
func Divide(it *Iteration, op *Op) (Pieces, bool) {
	r, ok := pieceRuleOf(op.Name)
	if !ok {
		return Pieces{}, false
	}
	bytes := func(id TensorID) int64 {
		if t := it.Tensors[id]; t != nil {
			return t.Bytes
		}
		return 0
	}
	for lists := r.maxLists; lists >= r.minLists; lists-- {
		for shared := r.maxShared; shared >= 0; shared-- {
			head := len(op.In) - shared
			if head < 2*lists || head%lists != 0 || !scalars(op.In[head:], bytes) {
				continue
			}
			p := Pieces{N: head / lists, Lists: lists, Shared: shared}
			if len(op.Out)%p.N != 0 || len(op.Out)/p.N > 2 {
				continue
			}
			p.OutLists = len(op.Out) / p.N
			if p.fits(op, bytes) {
				return p, true
			}
		}
	}
	return Pieces{}, false
}

// scalars reports whether every tensor of ids holds at most a few numbers:
// what a piecewise op shares between its pieces is a flag, a scale or a
// learning rate, never a list's element.
func scalars(ids []TensorID, bytes func(TensorID) int64) bool {
	for _, id := range ids {
		if bytes(id) > maxSharedBytes {
			return false
		}
	}
	return true
}

// maxSharedBytes is the most a tensor every piece shares may hold.
const maxSharedBytes = 16

// fits checks p against op: every tensor of the lists distinct and not
// shared, and the lists agreeing element by element with the first.
func (p Pieces) fits(op *Op, bytes func(TensorID) int64) bool {
	head := op.In[:p.N*p.Lists]
	seen := make(map[TensorID]bool, len(head)+len(op.Out))
	for _, id := range head {
		if seen[id] {
			return false
		}
		seen[id] = true
	}
	for _, id := range op.In[len(head):] {
		if seen[id] {
			return false
		}
	}
	for _, id := range op.Out {
		if seen[id] {
			return false
		}
		seen[id] = true
	}
	first := head[:p.N]
	agree := func(list []TensorID) bool {
		prop, same := true, true
		a, b := float64(bytes(list[0])), float64(bytes(first[0]))
		for i := range list {
			x, y := float64(bytes(list[i])), float64(bytes(first[i]))
			prop = prop && (x == 0) == (y == 0) && math.Abs(x*b-y*a) <= 1e-9*max(x*b, y*a)
			same = same && x == a
		}
		return prop || same
	}
	for j := 1; j < p.Lists; j++ {
		if !agree(head[j*p.N : (j+1)*p.N]) {
			return false
		}
	}
	for j := range p.OutLists {
		if !agree(op.Out[j*p.N : (j+1)*p.N]) {
			return false
		}
	}
	return true
}

// Piece returns the tensors piece i of op lists, in and out, in the order
// of op's lists, the shared tensors last.
func (p Pieces) Piece(op *Op, i int) (in, out []TensorID) {
	in = make([]TensorID, 0, p.Lists+p.Shared)
	for j := range p.Lists {
		in = append(in, op.In[j*p.N+i])
	}
	in = append(in, op.In[p.N*p.Lists:]...)
	for j := range p.OutLists {
		out = append(out, op.Out[j*p.N+i])
	}
	return in, out
}

// Origin says where an op of a split iteration came from: the index of the
// op of the original iteration, and the share of that op's bytes (and so
// of its time, FLOPs and bytes moved) this op has, 1 for an op not split;
// and which of the op's pieces it is (Pieces.Piece), 0 for an op not split.
type Origin struct {
	Op    int
	Share float64
	Piece int
}

// Split returns it with every op that divides into pieces (Divide) run as
// its pieces, one op per piece, and for each op of the result its Origin.
// A piece keeps its op's name, overload, phase and module; its time, FLOPs
// and bytes moved are its share of the op's by bytes listed, and the
// recorded memory after it is the op's curve carried from the op before by
// the same share. What the recording kept past its last use (gradients
// until zero_grad) stays as recorded: a host that also releases each
// gradient after its piece records that in its own profile.
//
// it is not changed; the result shares its Tensors. An iteration with no
// such op is returned as it is.
func Split(it *Iteration) (*Iteration, []Origin) {
	var ps []Pieces
	var at []int
	for i := range it.Ops {
		if p, ok := Divide(it, &it.Ops[i]); ok {
			ps, at = append(ps, p), append(at, i)
		}
	}
	origins := make([]Origin, 0, len(it.Ops))
	if len(at) == 0 {
		for i := range it.Ops {
			origins = append(origins, Origin{Op: i, Share: 1})
		}
		return it, origins
	}
	out := *it
	out.Ops = make([]Op, 0, len(it.Ops))
	next := 0
	for i := range it.Ops {
		op := it.Ops[i]
		if next >= len(at) || at[next] != i {
			op.Seq = len(out.Ops)
			out.Ops = append(out.Ops, op)
			origins = append(origins, Origin{Op: i, Share: 1})
			continue
		}
		p := ps[next]
		next++
		before := int64(-1)
		if i > 0 {
			before = it.Ops[i-1].Mem
		}
		var total float64
		sizes := make([]float64, p.N)
		ins, outs := make([][]TensorID, p.N), make([][]TensorID, p.N)
		for k := range p.N {
			ins[k], outs[k] = p.Piece(&op, k)
			for _, ids := range [][]TensorID{ins[k], outs[k]} {
				for _, id := range ids {
					if t := it.Tensors[id]; t != nil {
						sizes[k] += float64(t.Bytes)
					}
				}
			}
			total += sizes[k]
		}
		var done float64
		for k := range p.N {
			in, o := ins[k], outs[k]
			share := 1 / float64(p.N)
			if total > 0 {
				share = sizes[k] / total
			}
			done += share
			q := op
			q.Seq, q.In, q.Out = len(out.Ops), in, o
			q.DurUS, q.FLOPs, q.IOBytes = op.DurUS*share, op.FLOPs*share, op.IOBytes*share
			if k < p.N-1 && op.Mem >= 0 && before >= 0 {
				q.Mem = before + int64(float64(op.Mem-before)*done)
			}
			out.Ops = append(out.Ops, q)
			origins = append(origins, Origin{Op: i, Share: share, Piece: k})
		}
	}
	return &out, origins
}

// HoistTrace hoists the pieces of every iteration of split (Hoist), with
// origins SplitTrace's; it returns the hoisted trace and its origins.
func HoistTrace(split *Trace, origins [][]Origin) (*Trace, [][]Origin) {
	out := *split
	out.Iterations = make([]*Iteration, len(split.Iterations))
	outOrigins := make([][]Origin, len(origins))
	for k, it := range split.Iterations {
		out.Iterations[k], outOrigins[k] = Hoist(it, origins[k])
	}
	return &out, outOrigins
}

// SplitTrace splits every iteration of tr (Split). The result shares tr's
// tensors; origins[k] is iteration k's.
func SplitTrace(tr *Trace) (out *Trace, origins [][]Origin) {
	out = &Trace{Name: tr.Name, Header: tr.Header, Iterations: make([]*Iteration, len(tr.Iterations))}
	origins = make([][]Origin, len(tr.Iterations))
	for k, it := range tr.Iterations {
		out.Iterations[k], origins[k] = Split(it)
	}
	return out, origins
}

// Split returns the kernel times of the split op sequence origins came
// from (Split of an iteration k times): each op's time is its share of the
// time of the op it came from. It refuses origins that name an op k does
// not time.
func (k *Kernels) Split(origins []Origin) (*Kernels, error) {
	out := *k
	out.Ops = make([]KernelOp, len(origins))
	for i, o := range origins {
		if o.Op < 0 || o.Op >= len(k.Ops) {
			return nil, fmt.Errorf("trace: split op %d comes from op %d; the kernel times have %d ops", i, o.Op, len(k.Ops))
		}
		op := k.Ops[o.Op]
		op.Seq, op.KernelUS = i, op.KernelUS*o.Share
		out.Ops[i] = op
	}
	return &out, nil
}

// Gradients returns the tensors of it an optimizer step reads as
// gradients, which a trace marks as activations: element i of the second
// list of a fused or _foreach_ optimizer step (Divide) whose first list
// holds parameters, of the same size as parameter i, and the list the
// mixed-precision unscale divides.
func Gradients(it *Iteration) map[TensorID]bool {
	g := map[TensorID]bool{}
	for i := range it.Ops {
		op := &it.Ops[i]
		p, ok := Divide(it, op)
		if !ok {
			continue
		}
		list := -1
		switch r, _ := pieceRuleOf(op.Name); {
		case r.prefix == "_amp_foreach_non_finite_check_and_unscale":
			list = 0
		case p.Lists >= 2 && op.Phase == PhaseOptimizer:
			list = 1
		}
		if list < 0 {
			continue
		}
		for k := range p.N {
			id := op.In[list*p.N+k]
			t := it.Tensors[id]
			if t == nil || t.Kind != KindActivation {
				continue
			}
			if list == 1 {
				if w := it.Tensors[op.In[k]]; w == nil || w.Kind != KindParam || w.Bytes != t.Bytes {
					continue
				}
			}
			g[id] = true
		}
	}
	return g
}

// Hoist returns split (Split of an iteration, origins its Origins) with
// each piece of a split op moved up to just after the last op before it
// that lists a tensor the piece lists, as a host that runs each piece of
// an optimizer step as soon as its gradient is final would (an optimizer
// step in the backward): a piece reads and writes only its own elements
// and the tensors every piece shares, so no op between its new place and
// its old one reads what it writes or writes what it reads, and every
// value each op reads is the one it read before. A piece that lists
// nothing an earlier op lists (a step counter's increment) runs just
// before the first piece that needs it. Pieces moved after one op keep
// their order (an optimizer step's pieces then run in the order the
// backward finishes their gradients, not in the step's); a moved piece
// takes the phase and module of the op it follows, and the recorded memory
// after it is that op's (a piece writes in place). An op that does not
// divide, or divides into one piece, stays where it is. The result shares
// split's Tensors; the Origins come along.
func Hoist(split *Iteration, origins []Origin) (*Iteration, []Origin) {
	n := len(split.Ops)
	count := make(map[int]int, n)
	for _, o := range origins {
		count[o.Op]++
	}
	piece := func(i int) bool { return count[origins[i].Op] > 1 }
	kin := func(i, j int) bool { return piece(i) && piece(j) && origins[i].Op == origins[j].Op }

	// Per tensor, the ops that listed it so far in runs: a run is one op,
	// or pieces of one op, which may run in any order among themselves.
	// An op depends on every op of the last run that is not its own.
	type runs struct{ last, prev []int }
	touched := make(map[TensorID]*runs, len(split.Tensors))
	const unplaced = -1
	pos := make([]int, n) // where each op is in order; unplaced: not yet
	order := make([]int, 0, n)
	moved := make([]bool, n) // put ahead of ops placed before it
	// A free piece depends on no op but free pieces (a step counter's
	// increment): it may run anywhere before the ops that need it, and
	// runs just before the first of them.
	free := make([]bool, n)
	deps := make([][]int, n)
	var place func(i, at int)
	// place puts op i at position at of order, or moves it there from
	// later (a free piece), and the free pieces it needs that are not
	// yet ahead of at just before it.
	place = func(i, at int) {
		for _, j := range deps[i] {
			if free[j] && (pos[j] == unplaced || pos[j] >= at) {
				place(j, at)
				at = pos[j] + 1
			}
		}
		from := len(order)
		if pos[i] != unplaced {
			from = pos[i]
			order = slices.Delete(order, from, from+1)
		}
		if at == len(order) && pos[i] == unplaced {
			pos[i] = at
			order = append(order, i)
			return
		}
		moved[i] = true
		order = slices.Insert(order, at, i)
		for k := at; k <= min(from, len(order)-1); k++ {
			pos[order[k]] = k
		}
	}
	for i := range split.Ops {
		pos[i] = unplaced
		op := &split.Ops[i]
		for _, ids := range [2][]TensorID{op.In, op.Out} {
			for _, id := range ids {
				r := touched[id]
				if r == nil {
					r = &runs{}
					touched[id] = r
				}
				if len(r.last) > 0 && kin(i, r.last[0]) {
					deps[i] = append(deps[i], r.prev...)
					r.last = append(r.last, i)
					continue
				}
				deps[i] = append(deps[i], r.last...)
				r.prev, r.last = r.last, []int{i}
			}
		}
		slices.Sort(deps[i])
		deps[i] = slices.Compact(deps[i])
		if !piece(i) {
			place(i, len(order))
			continue
		}
		// A piece runs after the last op it depends on and after the
		// pieces moved there before it.
		at, bound := 0, false
		for _, j := range deps[i] {
			if !free[j] {
				at, bound = max(at, pos[j]+1), true
			}
		}
		if !bound {
			free[i] = true
			continue
		}
		for at < len(order) && moved[order[at]] {
			at++
		}
		place(i, at)
	}
	for i := range split.Ops {
		if pos[i] == unplaced {
			place(i, len(order))
		}
	}
	out := *split
	out.Ops = make([]Op, n)
	outOrigins := make([]Origin, n)
	for k, i := range order {
		op := split.Ops[i]
		if moved[i] {
			before := &out.Ops[k-1]
			op.Phase, op.Module, op.Mem = before.Phase, before.Module, before.Mem
		}
		op.Seq = k
		out.Ops[k], outOrigins[k] = op, origins[i]
	}
	return &out, outOrigins
}

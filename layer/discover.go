package layer

import (
	"slices"

	"github.com/chameleon-go/chameleon/trace"
)

// anchorK is the length of the token k-grams that mark block positions. It
// has to be long enough that the layer's first few ops (a norm, which a
// transformer also runs in the middle of its layer and after the last one)
// do not pass for a layer start: 8 reaches from a norm into the projection
// that follows it.
const anchorK = 8

// minCoverage is the share of a phase's ops that k-grams occurring exactly
// once per block must cover before that count is taken as the number of
// blocks. It keeps accidental repeats (a pattern seen twice by chance) from
// passing for a layer structure, while a mixture-of-experts layer, whose
// expert loop repeats many times inside each block, still shows its
// once-per-layer part (attention, norms, router) well above it.
const minCoverage = 0.20

// Discover splits the forward and backward into the model's repeated blocks
// (its transformer layers), found from the op tokens (name and overload)
// alone, so that it works on any model and needs no module paths.
//
// A phase of L layers has many k-grams that occur exactly L times, once per
// layer, covering most of its ops; smaller structures that repeat inside a
// layer (an expert loop) occur more often, and accidental repeats cover
// little. Discover takes the smallest count whose k-grams cover at least
// minCoverage of the phase as L, which makes it immune to expert loops whose
// length changes from layer to layer. Layer boundaries are the occurrences
// of one of those k-grams; which one decides where the cycle is cut, and the
// token stream alone cannot tell (a final norm looks like the next layer's
// first norm). The rule used is the one that matches how a framework nests
// modules: the forward's first layer starts right after the prologue
// (embedding), so forward blocks start at the earliest once-per-layer
// k-gram; the backward runs the layers in reverse, so its last block ends
// right before the epilogue (embedding backward) and backward blocks end at
// the latest once-per-layer k-gram. Gradient checkpointing needs nothing
// special: the recomputed forward of a layer is part of its backward block.
//
// The result covers every op: per phase run, a prologue group (if any), one
// group per block, and an epilogue group (if any); phases other than
// forward and backward, and runs with no repetition, are one group each.
func Discover(ops []trace.Op) []Group {
	tok := tokenize(ops)
	var out []Group
	for _, r := range phaseRuns(ops) {
		var starts []int
		end := -1
		if r.Phase == trace.PhaseForward || r.Phase == trace.PhaseBackward || r.Phase == trace.PhaseUnknown {
			starts, end = findBlocks(tok[r.First:r.Last+1], r.Phase == trace.PhaseBackward)
		}
		if len(starts) < 2 {
			out = append(out, r)
			continue
		}
		if starts[0] > 0 {
			out = append(out, Group{Phase: r.Phase, First: r.First, Last: r.First + starts[0] - 1})
		}
		for j, s := range starts {
			e := end
			if j+1 < len(starts) {
				e = starts[j+1]
			}
			out = append(out, Group{Phase: r.Phase, First: r.First + s, Last: r.First + e - 1})
		}
		if r.First+end <= r.Last {
			out = append(out, Group{Phase: r.Phase, First: r.First + end, Last: r.Last})
		}
	}
	return out
}

// tokenize maps each op's name and overload to a small integer.
func tokenize(ops []trace.Op) []uint64 {
	type key struct{ name, overload string }
	vocab := make(map[key]uint64, 64)
	tok := make([]uint64, len(ops))
	for i := range ops {
		k := key{ops[i].Name, ops[i].Overload}
		v, ok := vocab[k]
		if !ok {
			v = uint64(len(vocab)) + 1
			vocab[k] = v
		}
		tok[i] = v
	}
	return tok
}

// kgramHashes returns the hash of the k-gram starting at each position
// (len(seq)-k+1 of them). A collision could only merge two k-grams' counts;
// with 64-bit multiplicative hashing over a vocabulary of a few hundred
// tokens it does not happen in practice, and a wrong count only weakens the
// choice of anchor, never breaks the grouping's invariants.
func kgramHashes(seq []uint64, k int) []uint64 {
	n := len(seq) - k + 1
	if n <= 0 {
		return nil
	}
	const mul = 0x9E3779B97F4A7C15
	h := make([]uint64, n)
	for i := range n {
		var x uint64
		for _, t := range seq[i : i+k] {
			x = (x ^ t) * mul
			x ^= x >> 29
		}
		h[i] = x
	}
	return h
}

// findBlocks finds the repeated blocks of one phase's token sequence. It
// returns the block start offsets and the end (exclusive) of the last block,
// or no starts when nothing repeats. fromEnd selects the backward rule: the
// last block is the complete one and the first is found by searching back.
func findBlocks(seq []uint64, fromEnd bool) (starts []int, end int) {
	h := kgramHashes(seq, anchorK)
	if len(h) < 2*anchorK {
		return nil, 0
	}
	count := make(map[uint64]int32, len(h))
	for _, x := range h {
		count[x]++
	}
	cnt := make([]int32, len(h))
	maxc := int32(0)
	for i, x := range h {
		cnt[i] = count[x]
		maxc = max(maxc, cnt[i])
	}
	cover := make([]int, maxc+1)
	for _, c := range cnt {
		cover[c]++
	}
	L := int32(0)
	for c := int32(2); c <= maxc; c++ {
		if float64(cover[c]) >= minCoverage*float64(len(seq)) {
			L = c
			break
		}
	}
	if L == 0 {
		return nil, 0
	}
	if !fromEnd {
		first := slices.Index(cnt, L)
		starts = occurrences(h, h[first], false)
		if len(starts) < 2 {
			return nil, 0
		}
		// The anchor is the earliest k-gram seen once per block, but a block
		// may start a little before it with ops that repeat more often (a
		// norm): move every start back while all blocks agree on the op
		// before it. The prologue stops the first block.
		for sameAt(seq, starts, -1) {
			for j := range starts {
				starts[j]--
			}
		}
		return starts, lastBlockEnd(h, cnt, L, starts)
	}
	last := len(cnt) - 1 - slices.Index(reversed(cnt), L)
	ends := occurrences(h, h[last], true)
	if len(ends) < 2 {
		return nil, 0
	}
	for j := range ends {
		ends[j] += anchorK
	}
	// Mirror image of the forward: extend every block's end while all agree
	// on the op after it; the epilogue stops the last block.
	for sameAt(seq, ends, 0) {
		for j := range ends {
			ends[j]++
		}
	}
	starts = append(starts, firstBlockStart(h, cnt, L, ends))
	starts = append(starts, ends[:len(ends)-1]...)
	return starts, ends[len(ends)-1]
}

// occurrences returns the non-overlapping positions of the k-gram x, in
// increasing order; fromEnd resolves overlaps from the end.
func occurrences(h []uint64, x uint64, fromEnd bool) []int {
	var pos []int
	if !fromEnd {
		for i, y := range h {
			if y == x && (len(pos) == 0 || i >= pos[len(pos)-1]+anchorK) {
				pos = append(pos, i)
			}
		}
		return pos
	}
	for i := len(h) - 1; i >= 0; i-- {
		if h[i] == x && (len(pos) == 0 || i+anchorK <= pos[len(pos)-1]) {
			pos = append(pos, i)
		}
	}
	slices.Reverse(pos)
	return pos
}

// sameAt reports whether seq holds one and the same token at every pos+d.
func sameAt(seq []uint64, pos []int, d int) bool {
	for _, p := range pos {
		i := p + d
		if i < 0 || i >= len(seq) || seq[i] != seq[pos[0]+d] {
			return false
		}
	}
	return true
}

func reversed(s []int32) []int32 {
	r := slices.Clone(s)
	slices.Reverse(r)
	return r
}

// lastBlockEnd finds where the forward's last block ends. The token stream
// cannot tell the last layer's end from a final norm that looks like the
// next layer's start, so it carries the next-to-last block's ending over:
// the latest once-per-block k-gram inside that block, found again in the
// last block, ends it at the same distance. A layer whose middle varies in
// length (an expert loop) keeps its end right this way. Without one, the
// last block gets the median block length.
func lastBlockEnd(h []uint64, cnt []int32, L int32, starts []int) int {
	n := len(h) + anchorK - 1
	s, prev := starts[len(starts)-1], starts[len(starts)-2]
	for q := s - anchorK; q >= prev; q-- {
		if cnt[q] != L {
			continue
		}
		for o := s; o < len(h); o++ {
			if h[o] == h[q] {
				return min(n, o+(s-q))
			}
		}
		break
	}
	return min(n, s+medianGap(starts))
}

// firstBlockStart mirrors lastBlockEnd for the backward, whose first block
// is the ambiguous one: the earliest once-per-block k-gram of the second
// block, found in the first, starts it at the same distance.
func firstBlockStart(h []uint64, cnt []int32, L int32, ends []int) int {
	e, next := ends[0], ends[1]
	for q := e; q+anchorK <= next && q < len(h); q++ {
		if cnt[q] != L {
			continue
		}
		for o := e - anchorK; o >= 0; o-- {
			if h[o] == h[q] {
				return max(0, o-(q-e))
			}
		}
		break
	}
	return max(0, e-medianGap(ends))
}

func medianGap(pos []int) int {
	gaps := make([]int, 0, len(pos)-1)
	for i := 1; i < len(pos); i++ {
		gaps = append(gaps, pos[i]-pos[i-1])
	}
	slices.Sort(gaps)
	return gaps[len(gaps)/2]
}

// Layers groups the ops into at most n groups per forward and backward
// phase whose boundaries are discovered layer boundaries: consecutive
// layers (with the prologue and epilogue) are merged into runs of nearly
// equal op counts. Phases where no repetition is found fall back to
// Uniform's cut. Other phases stay one group each. n < 1 is taken as 1.
func Layers(ops []trace.Op, n int) []Group {
	if n < 1 {
		n = 1
	}
	disc := Discover(ops)
	var out []Group
	for i := 0; i < len(disc); {
		j := i
		for j < len(disc) && disc[j].Phase == disc[i].Phase {
			j++
		}
		units := disc[i:j]
		run := Group{Phase: units[0].Phase, First: units[0].First, Last: units[len(units)-1].Last}
		switch {
		case run.Phase != trace.PhaseForward && run.Phase != trace.PhaseBackward:
			out = append(out, run)
		case len(units) == 1:
			for _, g := range Uniform(ops[run.First:run.Last+1], n) {
				out = append(out, Group{Phase: g.Phase, First: g.First + run.First, Last: g.Last + run.First})
			}
		default:
			out = append(out, merge(units, n)...)
		}
		i = j
	}
	return out
}

// merge joins consecutive units into at most n groups, cutting at the unit
// boundary closest to each of the n-1 equal-op-count cut points.
func merge(units []Group, n int) []Group {
	if len(units) <= n {
		return slices.Clone(units)
	}
	first, last := units[0].First, units[len(units)-1].Last
	total := last - first + 1
	out := make([]Group, 0, n)
	u := 0 // next unit to place
	for g := range n {
		remaining := n - g
		if remaining == 1 {
			out = append(out, Group{Phase: units[0].Phase, First: units[u].First, Last: last})
			break
		}
		target := first + (g+1)*total/n
		// the group takes units u..v-1; at least one, and leaves one per
		// group still to come.
		v := u + 1
		for v < len(units)-(remaining-1) && abs(units[v+1].First-target) <= abs(units[v].First-target) {
			v++
		}
		out = append(out, Group{Phase: units[0].Phase, First: units[u].First, Last: units[v].First - 1})
		u = v
	}
	return out
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

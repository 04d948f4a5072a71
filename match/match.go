// Package match maps the tensors a policy was planned for (in a profiled
// iteration) to the live tensors of a later iteration, where tensors have no
// stable identity: allocations move, and ids are fresh every step.
//
// A live tensor is compared with planned ones on four features, each with a
// weight (the paper's defaults): device address 0.3, call stack or module
// path 0.4, producing op type 0.2, shape 0.1. A match needs a score above
// 0.85, so with the defaults the call stack and the producer must agree, and
// the address or the shape too... in practice the address, since 0.4 + 0.2 +
// 0.1 = 0.7: a caching allocator hands a static graph the same addresses
// every step, and a tensor whose address moved is better left unswapped than
// swapped as the wrong one. Among equal scores, the earliest planned tensor
// not yet matched in this iteration wins, which pairs the j-th tensor of a
// module and producer with the j-th planned one.
package match

// Features describe one tensor at the moment it is produced.
type Features struct {
	Ptr      uint64 // device address
	Stack    uint64 // hash of the call stack / module path (Hash)
	Producer uint32 // token of the producing op
	Shape    uint64 // hash of the shape (ShapeHash)
}

// Hash hashes a call stack or module path for Features.Stack (FNV-1a, so
// hashes saved with a policy mean the same in another process).
func Hash(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h = (h ^ uint64(s[i])) * 1099511628211
	}
	return h
}

// ShapeHash hashes a shape for Features.Shape.
func ShapeHash(shape []int64) uint64 {
	h := uint64(14695981039346656037)
	for _, d := range shape {
		h = (h ^ uint64(d)) * 1099511628211
	}
	return h ^ uint64(len(shape))
}

// Config holds the feature weights and the threshold.
type Config struct {
	Ptr, Stack, Producer, Shape float64
	Threshold                   float64
	// Site, when set, makes the call site with its ordinal a must: a
	// candidate of another site or trip is never matched, whatever the
	// other features score. Without it the address, producer and shape
	// together (0.6 with the default weights) can outvote the site.
	Site bool
}

// DefaultConfig returns the paper's weights (0.3, 0.4, 0.2, 0.1) and
// threshold (0.85).
func DefaultConfig() Config {
	return Config{Ptr: 0.3, Stack: 0.4, Producer: 0.2, Shape: 0.1, Threshold: 0.85}
}

// Matcher matches live tensors against a fixed planned set. It is not safe
// for concurrent use; one iteration at a time calls Match, then Reset.
type Matcher struct {
	cfg     Config
	planned []Features
	ord     []uint32           // each planned tensor's ordinal within its bucket
	byKey   map[uint64]*bucket // (stack, producer) -> planned tensors, in order
	byPtr   map[uint64][]int32
	used    []uint32 // generation in which each planned tensor was matched
	gen     uint32
}

// bucket is the planned tensors of one call site and producer, and how many
// live tensors of that key this iteration has produced so far.
type bucket struct {
	idx  []int32
	seen uint32
	gen  uint32
}

// Key is the call site and producer of f: the tensors of one key are told
// apart by their ordinal, the order in which an iteration makes them.
func Key(f Features) uint64 { return key(f) }

func key(f Features) uint64 { return f.Stack*31 ^ uint64(f.Producer)*0x9E3779B97F4A7C15 }

// New indexes the planned tensors, taking each one's ordinal (see Match)
// to be its rank among the planned tensors of its call site and producer:
// right when every tensor the profiled iteration made at a call site is
// planned. When only some are (a checkpointed model makes each forward
// tensor twice, in forward and again in backward, and a plan may move only
// the second), use NewOrdered with the ordinals counted over all of them.
func New(cfg Config, planned []Features) *Matcher { return NewOrdered(cfg, planned, nil) }

// NewOrdered indexes the planned tensors with their ordinals: ord[i] is
// how many tensors of planned[i]'s call site and producer the profiled
// iteration made before it, the count Match keeps for live tensors. A nil
// ord takes ranks among the planned tensors, as New does.
func NewOrdered(cfg Config, planned []Features, ord []uint32) *Matcher {
	m := &Matcher{
		cfg: cfg, planned: planned,
		byKey: make(map[uint64]*bucket, len(planned)),
		byPtr: make(map[uint64][]int32, len(planned)),
		used:  make([]uint32, len(planned)),
		ord:   make([]uint32, len(planned)),
		gen:   1,
	}
	for i, f := range planned {
		b := m.byKey[key(f)]
		if b == nil {
			b = &bucket{}
			m.byKey[key(f)] = b
		}
		m.ord[i] = uint32(len(b.idx))
		if ord != nil {
			m.ord[i] = ord[i]
		}
		b.idx = append(b.idx, int32(i))
		m.byPtr[f.Ptr] = append(m.byPtr[f.Ptr], int32(i))
	}
	return m
}

// Len is the number of planned tensors.
func (m *Matcher) Len() int { return len(m.planned) }

// Reset starts a new iteration: every planned tensor can be matched again.
func (m *Matcher) Reset() { m.gen++ }

// Score is the weighted feature agreement of two tensors.
func (c Config) Score(a, b Features) float64 {
	var s float64
	if a.Ptr == b.Ptr {
		s += c.Ptr
	}
	if a.Stack == b.Stack {
		s += c.Stack
	}
	if a.Producer == b.Producer {
		s += c.Producer
	}
	if a.Shape == b.Shape {
		s += c.Shape
	}
	return s
}

// Match returns the planned tensor that live tensor f is, or -1.
//
// The call-stack feature counts as agreeing only when the call site and
// its ordinal agree: the j-th tensor a module path and producer make in this
// iteration is compared with the j-th planned one. A loop runs one call site
// many times (an MoE layer's expert loop), and without the ordinal a loop
// trip whose address was handed to another trip would match the wrong one.
// Candidates are those sharing the call site and producer, or the address.
func (m *Matcher) Match(f Features) (idx int, score float64) {
	idx = -1
	ord := ^uint32(0)
	b := m.byKey[key(f)]
	if b != nil {
		if b.gen != m.gen {
			b.gen, b.seen = m.gen, 0
		}
		ord = b.seen
		b.seen++
	}
	scan := func(cands []int32) {
		for _, c := range cands {
			if m.used[c] == m.gen {
				continue
			}
			p := m.planned[c]
			if m.ord[c] != ord || key(p) != key(f) {
				// Same site, other trip: not the same call. A candidate
				// found by its address alone, of another site or
				// producer, has an ordinal that counts other tensors.
				p.Stack = ^f.Stack
			}
			if m.cfg.Site && p.Stack != f.Stack {
				continue
			}
			s := m.cfg.Score(f, p)
			if s > score || (s == score && idx >= 0 && int(c) < idx) {
				idx, score = int(c), s
			}
		}
	}
	if b != nil {
		scan(b.idx)
	}
	scan(m.byPtr[f.Ptr])
	if idx < 0 || score <= m.cfg.Threshold {
		return -1, score
	}
	m.used[idx] = m.gen
	return idx, score
}

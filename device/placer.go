package device

import (
	"cmp"
	"math"
	"slices"

	"github.com/chameleon-go/chameleon/plan/place"
)

// placer records the repetitions of a recurring request sequence and plans
// where their blocks go (see place.go). Called with the pool's lock held.
type placer struct {
	on  bool
	rep uint32
	// clock counts the requests and frees of this repetition; opAt[i] is
	// the clock when step i began (Tick).
	clock int32
	opAt  []int32
	recs  []placeRec
	// A request's key is its step (1 + the Tick, 0 before the first) and
	// its number among the step's requests: a request more or less in one
	// step leaves the others' places alone. prevKeys are the last
	// repetition's, by request number.
	step, inStep int32
	prevKeys     []uint64
	// carried are the frees, in this repetition, of blocks the last one
	// asked for and left in use, with their keys there.
	carried []carriedFree
	// plan is, per request number, where the block goes (addr 0: served
	// as usual); placing says the repetition follows it.
	plan    []placeSpot
	planKey map[uint64]int32
	placing bool
	// following: the caller's layout is the plan (Follow); no recording.
	following bool
	// spans are, on segments (no pages), the plan's blocks' lives by
	// address, for a block with no place of its own to keep off those
	// needed soonest (pickOffPlan's counterpart); widest is the largest
	// block among them and planEnd the clock the plan was made over.
	spans   []planSpan
	widest  int64
	planEnd int32
	replans int
	gaveUp  bool
	// The pool's pages mapped, host waits and refused requests when the
	// repetition began.
	movedAt, waitsAt, failsAt, copyWaitsAt int64
	bad                                    int  // repetitions in a row that missed too many places
	deferred                               bool // a strained repetition's plan waits for the next (keepsAny)
	heldOver                               bool // the last repetition's small outlived blocks did not plan again (outlived)
	// outlives are the requests (by key) seen in use at the end of a
	// repetition: each gets places of its own, taken in turn, whatever
	// the repetition a plan is made from did with it.
	outlives map[uint64]bool
	// This repetition's requests served at their planned address, and
	// those with a plan served elsewhere.
	placed, missed int
	// Totals for Stats.
	totPlaced, totMissed, plans int64
	gaveUps                     int64 // repetitions that ended placement as not recurring
	// short counts the plans whose blocks needed more pages than the
	// budget; shortFit is the last one's share of its bytes the budget's
	// pages would have held with none moved.
	short    int64
	shortFit float64
}

type placeRec struct {
	size       int64
	addr       uintptr
	key        uint64
	start, end int32
	// reuse is the step from which the caller's schedule lets the memory
	// be reused (FreeAfterFrom), -1 when from its free.
	reuse int32
	freed bool
}

// planSpan is one interval of a planned block's life at its address.
type planSpan struct {
	addr, end uintptr
	from, to  int32
}

// carriedFree is such a free: at the clock at, reusable by the caller's
// schedule from step reuse (FreeAfterFrom; -1: from the free).
type carriedFree struct {
	key       uint64
	size      int64
	at, reuse int32
}

// placeSpot is where a request goes: addr, or for a block that outlives
// the next request for it, addr and alt in turn.
type placeSpot struct {
	addr, alt uintptr
	size      int64
	// inRep: the plan has the block freed within the repetition.
	inRep bool
}

// outlivedMin is the fewest bytes of blocks outliving a repetition, or a
// page where pages are mapped, that make the allocator plan again.
const outlivedMin = 1 << 20

// maxReplans bounds how often one run of repetitions is planned again
// because its blocks missed their places.
const maxReplans = 2

// missedShare: a repetition is planned again when more than one in
// missedShare of its requests missed their places. A few misses stay where
// they go (off the planned pages, see pickOffPlan), while every new plan
// moves pages once.
const missedShare = 50

// giveUpShare: placement stops, until the sequence changes, after a
// repetition in which more than one in giveUpShare of the requests with a
// place missed it.
const giveUpShare = 10

// overPages: a plan may use, over a repetition, up to budget/overPages
// pages more than the budget holds, each moved twice a repetition, if at
// no point it has more in use than the budget.
const overPages = 32

// maxTickGap bounds how far one Tick may skip steps ahead: a later step
// than that is no step of a repetition's clock, and its memory is not
// spent on one.
const maxTickGap = 1 << 20

// unplan forgets which pages a plan uses.
func (p *pool) unplan() {
	p.pl.spans = p.pl.spans[:0]
	for si := range p.a.segs {
		if pm := p.a.segs[si].pages; pm != nil {
			pm.planned, pm.uses = nil, nil
		}
	}
}

// Repeat marks the start of a repetition of a recurring sequence of
// requests: one training step of a sequence that stays the same, for
// example. With same false the sequence is new (or may have changed): the
// allocator forgets what it planned and records this repetition. With same
// true the repetition is expected to ask for the blocks the last one asked
// for, in the same order and sizes, and to free them at the same points:
// from the second such repetition on, each block is served at the address
// the allocator planned for it from the one before, where that range is
// free (Stats.Placed), and as usual otherwise (Stats.Missed). A
// repetition whose blocks missed their places is planned again (twice at
// most until Repeat(false)) when more than one in fifty of its requests
// missed, or when blocks it asked for of at least a page (1 MiB on
// segments) outlived it though the plan had them freed inside it (smaller
// ones lose their places instead); one
// where more than one in ten of the requests with a place missed it ends
// placement until Repeat(false) when it happens twice in a row: the
// sequence does not recur closely enough.
//
// Placement starts only after a repetition best fit served with trouble:
// pages mapped, a host wait, a request refused. Otherwise best fit stays,
// and it hands out memory no copy still uses where it can, while a
// planned block may have to wait for one on the device. A block still in
// use at the end of a repetition that the next frees before asking for it
// again (a gradient the next step's optimizer reads) is planned a place
// like the others; the plan waits for a second repetition when the first
// one recorded leaves blocks in use, to see which those are.
//
// Placement changes where blocks go, never what a block holds or which
// waits guard it: a planned block is served like any other, behind the
// events of the memory it reuses. Tick and FreeAfterFrom tell the
// allocator when memory freed behind work on another stream is, by the
// caller's schedule, done with; without them such memory counts as reused
// from its free on, and a block planned onto it makes its stream wait.
func (a *Allocator) Repeat(same bool) {
	a.p.mu.Lock()
	defer a.p.mu.Unlock()
	p := &a.p
	if p.closed {
		return
	}
	pl := &p.pl
	if pl.following {
		pl.totPlaced += int64(pl.placed)
		pl.totMissed += int64(pl.missed)
		pl.placed, pl.missed = 0, 0
		return
	}
	if !pl.on {
		pl.on = true
		p.a.index()
	}
	if !same {
		pl.plan, pl.planKey, pl.placing, pl.replans, pl.gaveUp, pl.outlives = pl.plan[:0], nil, false, 0, false, nil
		pl.bad, pl.deferred = 0, false
		p.unplan()
	}
	held := pl.heldOver
	pl.heldOver = false
	outlived := pl.placing && pl.outlived(max(p.page, outlivedMin))
	// Blocks left to outlive the plan that displaced more than a few of
	// the next repetition's: plan again after all.
	displaced := held && pl.placing && pl.missed*missedShare > len(pl.recs)
	switch {
	case !same || len(pl.recs) == 0 || pl.gaveUp:
	case pl.placing && pl.missed*giveUpShare > pl.placed+pl.missed && !displaced:
		// One such repetition may be an odd one out (a first step that
		// does more); two in a row, the sequence does not recur closely
		// enough (an MoE step routes other tokens each time), and best
		// fit serves it better.
		if pl.bad++; pl.bad >= 2 {
			pl.placing, pl.gaveUp = false, true
			pl.gaveUps++
			p.unplan()
		}
	case pl.bad > 0 && !outlived:
		pl.bad = 0
	case !pl.placing && !p.strained() && !pl.deferred:
		// Best fit served the repetition with no page moved, no host
		// wait and no request refused: it stays, for a block it hands out
		// is one no copy still uses, where a planned one may be.
	case !pl.placing && len(pl.prevKeys) == 0 && pl.keepsAny():
		// Blocks it asked for are in use at its end, and without the
		// repetition before it nothing tells whether the next one frees
		// them before asking again (gradients the next step's optimizer
		// reads) or keeps them past that: the next one will.
		pl.deferred = true
	case !pl.placing || ((pl.missed*missedShare > len(pl.recs) || outlived || displaced) && pl.replans < maxReplans):
		if pl.placing {
			pl.replans++
		}
		pl.deferred = false
		pl.placing = p.planPlacement()
		if !pl.placing {
			pl.gaveUp = true
			p.unplan()
		}
	}
	pl.movedAt, pl.waitsAt, pl.failsAt, pl.copyWaitsAt = p.pagesIn, p.syncs, p.fails, p.copyWaits
	pl.totPlaced += int64(pl.placed)
	pl.totMissed += int64(pl.missed)
	pl.placed, pl.missed = 0, 0
	pl.rep++
	pl.clock, pl.step, pl.inStep = 0, 0, 0
	pl.opAt = pl.opAt[:0]
	pl.prevKeys = pl.prevKeys[:0]
	for _, r := range pl.recs {
		pl.prevKeys = append(pl.prevKeys, r.key)
	}
	pl.recs = pl.recs[:0]
	pl.carried = pl.carried[:0]
}

// Tick tells the allocator that step i of the repetition begins: the
// clock FreeAfterFrom's steps are counted in. Steps count up from 0.
func (a *Allocator) Tick(i int) {
	a.p.mu.Lock()
	defer a.p.mu.Unlock()
	pl := &a.p.pl
	if i < 0 || i > len(pl.opAt)+maxTickGap {
		return // not a step of this repetition's clock
	}
	for pl.on && len(pl.opAt) <= i {
		pl.opAt = append(pl.opAt, pl.clock)
	}
	if pl.on && int32(i)+1 > pl.step {
		pl.step, pl.inStep = int32(i)+1, 0
	}
}

// PageShortfalls reports how many placement plans needed more pages than
// the budget holds (refused, or placed with the excess pages moved twice
// each repetition) and, for the last one, the share of its bytes the
// budget would have held with no page moved (1 with none short): a caller
// whose schedule needs that much less memory at its peak would be placed
// without moves (chameleon plans again with that headroom).
func (a *Allocator) PageShortfalls() (n int64, fit float64) {
	a.p.mu.Lock()
	defer a.p.mu.Unlock()
	if a.p.pl.short == 0 {
		return 0, 1
	}
	return a.p.pl.short, a.p.pl.shortFit
}

// FreeAfterFrom is FreeAfter for memory the caller's schedule is done with
// from step from (Tick) of the repetition on, later than its free: memory
// freed behind a copy to the host that the plan expects to finish by then.
// Planned placement lets later blocks reuse it only from then; a step past
// the repetition's last (math.MaxInt32) keeps it taken to the end, for
// memory freed against the schedule (a forced eviction), which the next
// repetition may well keep.
func (a *Allocator) FreeAfterFrom(ptr DevPtr, ev Event, s Stream, from int) error {
	a.p.mu.Lock()
	defer a.p.mu.Unlock()
	return a.p.putFrom(uintptr(ptr), ev, s, true, int32(min(max(from, -1), math.MaxInt32)))
}

// record notes a block handed out.
func (pl *placer) record(b *block) {
	if !pl.on {
		b.rec, b.rep = 0, 0
		return
	}
	pl.recs = append(pl.recs, placeRec{size: b.size, addr: b.addr, key: pl.key(), start: pl.clock, reuse: -1})
	b.rec, b.rep = int32(len(pl.recs)), pl.rep
	pl.clock++
	pl.inStep++
}

// freed notes the used block b given back, reusable from step reuse (-1:
// now).
func (pl *placer) freed(b *block, reuse int32) {
	if !pl.on {
		return
	}
	switch {
	case b.rec > 0 && b.rep == pl.rep:
		r := &pl.recs[b.rec-1]
		r.end, r.freed, r.reuse = pl.clock, true, reuse
	case b.rec > 0 && b.rep+1 == pl.rep:
		if int(b.rec) <= len(pl.prevKeys) {
			pl.carried = append(pl.carried, carriedFree{key: pl.prevKeys[b.rec-1], size: b.size, at: pl.clock, reuse: reuse})
		}
	}
	pl.clock++
}

// keepsAny reports whether a block the repetition asked for is in use at
// its end.
func (pl *placer) keepsAny() bool {
	for _, r := range pl.recs {
		if !r.freed {
			return true
		}
	}
	return false
}

func (pl *placer) key() uint64 { return uint64(pl.step)<<32 | uint64(uint32(pl.inStep)) }

// strained reports whether the repetition that just ended mapped pages,
// made the host wait, refused a request or served one on memory freed
// behind a caller's copy (its stream then waits for the copy, where a
// plan that knows when the copy is done would have put it elsewhere):
// what placement is for.
func (p *pool) strained() bool {
	pl := &p.pl
	return p.pagesIn > pl.movedAt || p.syncs > pl.waitsAt || p.fails > pl.failsAt || p.copyWaits > pl.copyWaitsAt
}

// outlived notes the requests of the repetition that just ended still in
// use at its end that the plan had freed within it, and reports whether
// they hold at least min bytes: their blocks sit on places the plan gave
// others, worth a new plan. Fewer bytes than that (a scalar or two kept
// for the next step) are not: those requests lose their planned places,
// and the next repetition plans again only if more than one in
// missedShare of its requests missed theirs.
func (pl *placer) outlived(min int64) bool {
	var bytes int64
	var keys []int32
	for _, r := range pl.recs {
		if r.freed || pl.outlives[r.key] {
			continue
		}
		if k, ok := pl.planKey[r.key]; ok && pl.plan[k].inRep {
			if pl.outlives == nil {
				pl.outlives = map[uint64]bool{}
			}
			pl.outlives[r.key] = true
			bytes += r.size
			keys = append(keys, k)
		}
	}
	if bytes > 0 && bytes < min {
		for _, k := range keys {
			pl.plan[k].addr, pl.plan[k].alt = 0, 0
		}
		pl.heldOver = true
		return false
	}
	return bytes > 0
}

// spot is where the next request of a placing repetition goes, if
// anywhere, and where else it may go.
func (pl *placer) spot(size int64) (uintptr, uintptr) {
	if !pl.placing {
		return 0, 0
	}
	k, ok := pl.planKey[pl.key()]
	if !ok || pl.plan[k].addr == 0 || pl.plan[k].size != size {
		return 0, 0
	}
	sp := pl.plan[k]
	if sp.alt != 0 && pl.rep%2 == 1 {
		return sp.alt, sp.addr
	}
	return sp.addr, sp.alt
}

// offPlanSpots bounds the free blocks pickOffSpans looks at.
const offPlanSpots = 16

// pickOffSpans is pickOffPlan on segments: among the best-fitting free
// blocks, the room for size bytes (at either end of a block) that the
// plan's blocks need again last, counted from now on the repetition's
// clock (the first room none of them needs, if there is one): the free
// block's index and the offset in it, or -1 with no plan or no fit. A block with no place of its own
// served by best fit alone lands on the place of the next planned block
// as often as not, which then misses its place and lands on another's.
func (p *pool) pickOffSpans(size int64) (int, int64) {
	pl := &p.pl
	if len(pl.spans) == 0 {
		return -1, 0
	}
	now := pl.clock
	// next is when the plan next needs [at, at+size): the soonest start
	// of a life over it still to come, in this repetition or the next.
	next := func(at uintptr) int64 {
		soon := int64(math.MaxInt64)
		lo := at - min(at, uintptr(pl.widest))
		k, _ := slices.BinarySearchFunc(pl.spans, lo, func(x planSpan, a uintptr) int { return cmp.Compare(x.addr, a) })
		for ; k < len(pl.spans) && pl.spans[k].addr < at+uintptr(size); k++ {
			sp := &pl.spans[k]
			if sp.end <= at {
				continue
			}
			t := int64(sp.from)
			switch {
			case sp.to <= now:
				t += int64(pl.planEnd) // over for now: needed next repetition
			case sp.from < now:
				t = int64(now) // its life is under way
			}
			soon = min(soon, t)
		}
		return soon
	}
	i := p.a.firstFit(size)
	best, bestOff, bestNext := -1, int64(0), int64(-1)
	for j := i; j < len(p.a.free) && j < i+offPlanSpots; j++ {
		b := p.a.free[j]
		for _, off := range [2]int64{0, b.size - size} {
			if n := next(b.addr + uintptr(off)); n > bestNext {
				best, bestOff, bestNext = j, off, n
			}
			if off == b.size-size {
				break // the block fits size exactly
			}
		}
		if bestNext == math.MaxInt64 {
			break
		}
	}
	return best, bestOff
}

// takePlanned serves need bytes at addr if that range is free and, on a
// mapped allocator, its pages fit in the budget; nil otherwise.
func (p *pool) takePlanned(addr uintptr, need int64) (*block, error) {
	i := p.a.freeHolding(addr, need)
	if i < 0 {
		return nil, nil
	}
	b := p.a.free[i]
	seg := &p.a.segs[b.seg]
	if pm := seg.pages; pm != nil {
		lo, hi := pm.span(seg, addr, need)
		if p.a.usedPages+int64(pm.unused(lo, hi)) > p.a.budget {
			return nil, nil
		}
	}
	b = p.a.takeFrom(i, int64(addr-b.addr), need)
	if p.mapper != nil {
		if err := p.back(b); err != nil {
			p.a.give(b.addr, pend{}, false)
			return nil, err
		}
	}
	return b, nil
}

// planPlacement plans the next repetitions from the one that just ended.
// It reports false when the plan's blocks need more pages over the
// repetition than the budget holds: placed, they would take pages a later
// request needs, where best fit moves pages for it instead.
func (p *pool) planPlacement() bool {
	pl := &p.pl
	end := pl.clock
	at := func(step int32) int32 {
		if int(step) < len(pl.opAt) {
			return pl.opAt[step]
		}
		return end
	}
	// carried[k]: when this repetition freed the block the last one asked
	// for as request k; what the next repetition's head of a block that
	// lives across the end will look like.
	head := make(map[uint64]carriedFree, len(pl.carried))
	for _, c := range pl.carried {
		head[c.key] = c
	}
	segs := make([]place.Placed, len(p.a.segs))
	for i, s := range p.a.segs {
		segs[i] = place.Placed{Addr: s.addr, Size: s.size}
	}
	whole := place.Once(0, end)
	var fixed []place.Placed
	// Blocks in use that this repetition did not ask for stay where they are.
	for _, b := range p.a.used {
		if b.rec == 0 || b.rep != pl.rep {
			fixed = append(fixed, place.Placed{Addr: b.addr, Size: b.size, Life: whole})
		}
	}
	if cap(pl.plan) < len(pl.recs) {
		pl.plan = make([]placeSpot, len(pl.recs))
	}
	pl.plan = pl.plan[:len(pl.recs)]
	pl.planKey = make(map[uint64]int32, len(pl.recs))
	var items []place.Item
	var idx []int
	for k, r := range pl.recs {
		pl.plan[k] = placeSpot{size: r.size}
		pl.planKey[r.key] = int32(k)
		if r.freed && !pl.outlives[r.key] {
			to := r.end + 1
			if r.reuse >= 0 {
				to = max(to, at(r.reuse))
			}
			items = append(items, place.Item{Size: r.size, Life: place.Once(r.start, to)})
			idx = append(idx, k)
			pl.plan[k].inRep = true
			continue
		}
		// In use at the end (or seen so before). A block that the next
		// repetition frees before asking for it again is placed like the
		// others, with its tail and head as its life: left where best fit
		// put it, it would wall in the blocks packed around it. Where it
		// is now stays in use until the next repetition frees it, so in
		// that one repetition a block planned onto it meanwhile misses
		// its place.
		l := place.Life{N: 2, IV: [2]place.Span{{From: r.start, To: end}, {From: 0, To: end}}}
		if c, ok := head[r.key]; ok && c.size == r.size && c.at < r.start && !r.freed {
			// Its head ends where the next repetition frees it, or later
			// where the schedule reuses it only then (a swap's copy out).
			to := c.at + 1
			if c.reuse >= 0 {
				to = max(to, at(c.reuse))
			}
			l.IV[1] = place.Span{From: 0, To: min(to, r.start)}
			items = append(items, place.Item{Size: r.size, Life: l})
			idx = append(idx, k)
			continue
		}
		// It outlives the next repetition's request for it: two places
		// of its own, taken in turn.
		items = append(items, place.Item{Size: r.size, Life: whole}, place.Item{Size: r.size, Life: whole})
		idx = append(idx, k, -1-k)
		if !r.freed {
			fixed = append(fixed, place.Placed{Addr: r.addr, Size: r.size, Life: l})
		}
	}
	var page int64
	if p.mapper != nil {
		page = p.page
	}
	addrs := place.Pack(segs, fixed, items, page)
	for i, k := range idx {
		if k < 0 {
			pl.plan[-1-k].alt = addrs[i]
		} else {
			pl.plan[k].addr = addrs[i]
		}
	}
	pl.spans, pl.widest, pl.planEnd = pl.spans[:0], 0, end
	if page == 0 {
		for i, it := range items {
			if addrs[i] == 0 {
				continue
			}
			for _, v := range it.Life.IV[:it.Life.N] {
				pl.spans = append(pl.spans, planSpan{addr: addrs[i], end: addrs[i] + uintptr(it.Size), from: v.From, to: v.To})
			}
			pl.widest = max(pl.widest, it.Size)
		}
		slices.SortFunc(pl.spans, func(x, y planSpan) int { return cmp.Compare(x.addr, y.addr) })
	}
	if page > 0 {
		// The pages the plan uses: reclaiming moves others first.
		for si := range p.a.segs {
			pm := p.a.segs[si].pages
			if pm.planned == nil {
				pm.planned = make([]bool, len(pm.mapped))
			}
			clear(pm.planned)
			pm.uses = nil
		}
		// The blocks at addresses counted from the first segment's start,
		// each segment after the pages of those before it, for place.Pages;
		// and where each block's life starts on which pages, for uses.
		var blocks []place.Placed
		type start struct {
			at         int32
			si, lo, hi int
		}
		var starts []start
		base := make([]uintptr, len(p.a.segs))
		for si := 1; si < len(p.a.segs); si++ {
			base[si] = base[si-1] + uintptr((p.a.segs[si-1].size+page-1)/page*page)
		}
		add := func(addr uintptr, size int64, l place.Life) {
			for si := range p.a.segs {
				seg := &p.a.segs[si]
				if addr >= seg.addr && addr < seg.addr+uintptr(seg.size) {
					lo, hi := seg.pages.span(seg, addr, size)
					for k := lo; k < hi; k++ {
						seg.pages.planned[k] = true
					}
					blocks = append(blocks, place.Placed{Addr: base[si] + (addr - seg.addr), Size: size, Life: l})
					for _, v := range l.IV[:l.N] {
						starts = append(starts, start{v.From, si, lo, hi})
					}
					return
				}
			}
		}
		for _, f := range fixed {
			add(f.Addr, f.Size, f.Life)
		}
		for i, it := range items {
			if addrs[i] != 0 {
				add(addrs[i], it.Size, it.Life)
			}
		}
		pages, most := place.Pages(blocks, page)
		if pages > p.a.budget {
			// Some pages must move each repetition. That is worth it
			// only for a few of them, and only if at no point the plan
			// has more pages in use than the budget: it would starve a
			// request.
			pl.short++
			pl.shortFit = min(float64(p.a.budget)/float64(most), float64(p.a.budget)/float64(pages))
			if most > p.a.budget || pages > p.a.budget+p.a.budget/overPages {
				pl.plans++
				return false
			}
			// The pages to move away are those the plan needs again
			// last: know when each is used.
			for si := range p.a.segs {
				pm := p.a.segs[si].pages
				pm.uses = make([][]int32, len(pm.mapped))
			}
			slices.SortStableFunc(starts, func(x, y start) int { return cmp.Compare(x.at, y.at) })
			for _, e := range starts {
				pm := p.a.segs[e.si].pages
				for k := e.lo; k < e.hi; k++ {
					pm.uses[k] = append(pm.uses[k], e.at)
				}
			}
		}
	}
	pl.plans++
	return true
}

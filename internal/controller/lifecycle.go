package controller

import "github.com/chameleon-go/chameleon/seq"

// lifecycle decides, iteration by iteration, which policy is in force and
// when to profile and plan. It is a pure state machine in the raft style:
// the Engine hands it what an iteration showed (observation) and gets back
// what to do (decision); it touches no device, clock or cache, so every
// transition is a table test (lifecycle_test.go).
//
// A policy in force stays until the sequence changes (drop) or too few of
// its tensors match (stale: it leaves the cache, keeps serving what it
// matches, and the next iteration is profiled to replace it, with no
// return to WARMUP). A sequence with no policy adopts a cached one, or is
// profiled once the detector leaves WARMUP, or, when it keeps coming back
// without ever holding M iterations in a row, once it has been seen M
// times: when it is expected next (fp16 skipped steps alternating with
// real ones), or when it comes in runs and one is under way (a couple of
// long sequences between short ones). A run as long as its sequence's
// last one is taken to be over: the policy of the sequence that followed
// that run is applied to the next iteration (expect), and dropped at its
// end if the iteration was another sequence's (foreign); a run that goes
// on past that length expects nothing more. A sequence whose
// planning failed is not planned again. A policy the iteration outgrew (its bytes grew and
// the executor had to force evictions past a twentieth of the planned
// swaps: a decode loop's KV cache a position longer every step) stays in
// force and in the cache while the next iteration is profiled and planned
// to replace it, again with no return to WARMUP. A policy planned on
// times measured while the executor forced evictions (the first profile
// of a sequence, taken with no policy in force: those copies share the
// device with the kernels and slow them) is planned again once, from the
// profile of an iteration it ran without forcing any (refine): the times
// its own swaps and recomputes leave the kernels.
type lifecycle struct {
	m          int     // iterations a sequence must be seen before it is planned
	memDelta   float64 // two signatures are one sequence within this byte delta
	staleMatch float64 // a policy matching fewer than this share of its swaps is stale
	seqs       []seqSeen
	last       int  // index in seqs of the latest iteration's sequence, -1
	run        int  // iterations in a row of the latest sequence
	refresh    bool // the policy in force is stale: profile the next iteration to replace it
}

// seqSeen is one sequence signature in the history, with how often it was
// seen and which one came next.
type seqSeen struct {
	key    Key
	count  int
	next   int  // index of the sequence that followed it last, -1
	failed bool // planning found no policy for it: not retried
	// refined: its policy was planned again once from a profile under it
	// (observation.refine).
	refined bool
	// runs: it has followed itself (it comes in runs of two or more).
	runs bool
	// lastRun is how long its last run was, after the sequence that
	// followed that run (-1: none yet).
	lastRun, after int
}

func newLifecycle(m int, memDelta, staleMatch float64) lifecycle {
	return lifecycle{m: m, memDelta: memDelta, staleMatch: staleMatch, last: -1}
}

// profile says whether the coming iteration is profiled in detail. policy
// says whether one is in force, next is the stage the detector expects,
// cached whether the cache holds a policy for a signature.
func (l *lifecycle) profile(policy bool, next seq.Stage, cached func(Key) bool) bool {
	if l.refresh {
		return true
	}
	var cur *seqSeen
	if l.last >= 0 {
		cur = &l.seqs[l.last]
	}
	if !policy && next != seq.Warmup && (cur == nil || !cur.failed) {
		return true
	}
	// A sequence that comes in runs too short to leave WARMUP (a batch of
	// long sequences between short ones), seen M times and with no policy:
	// the next iteration, likely the run's next, is profiled.
	if !policy && cur != nil && cur.runs && cur.count >= l.m && !cur.failed && !cached(cur.key) {
		return true
	}
	if cur == nil || cur.next < 0 {
		return false
	}
	n := &l.seqs[cur.next]
	return n.count >= l.m && !n.failed && !cached(n.key)
}

// observation is what an ended iteration showed.
type observation struct {
	key     Key  // its sequence signature
	changed bool // the detector declared a change
	// foreign: the policy in force was applied because its sequence was
	// expected (decision.expect), and the iteration was another one's.
	foreign bool
	// policy says whether a policy was in force, with its swaps and how many
	// of them were matched to live tensors.
	policy         bool
	swaps, matched int
	profiled       bool // the iteration was profiled in detail
	cached         bool // the cache holds a policy for key
	// outgrown: the iteration's bytes grew past those the policy in force
	// was planned for, and it forced evictions (see outgrew).
	outgrown bool
	// unplaced: the allocator refused to place the policy in force, its
	// blocks needing more pages than the limit holds.
	unplaced bool
	// refine: the policy in force was planned on times measured under
	// forced evictions, and this iteration ran it without forcing any.
	refine bool
}

// decision is what the Engine does after an iteration, in field order.
type decision struct {
	drop  bool // stop applying the policy in force: the sequence changed
	stale bool // the policy in force leaves the cache: too few of its tensors match
	// outgrown: the policy in force no longer holds the iteration's bytes;
	// the next iteration is profiled to replace it (counted once).
	outgrown bool
	// unplaced: the policy in force could not be placed; the next
	// iteration is profiled to replace it with a tighter one.
	unplaced bool
	// refine: the next iteration is profiled to plan the policy in force
	// again on the times it leaves the kernels (once per sequence).
	refine bool
	adopt  bool // apply the cached policy for the iteration's key; the detector adopts it
	plan   bool // plan from this iteration's profile, then report with planned
	// adoptPlanned: once planned, the detector adopts the policy (a
	// recurring sequence: no warm-up needed).
	adoptPlanned bool
	// expect is the sequence expected next: the one that followed the
	// latest sequence's last run, when this run is as long. Its cached
	// policy, if any, is applied to the next iteration in place of the one
	// in force (and dropped at its end if that turns out another sequence).
	expect *Key
}

// end records an iteration and decides what follows it.
func (l *lifecycle) end(o observation) decision {
	si := l.index(o.key)
	l.seqs[si].count++
	if l.last >= 0 {
		l.seqs[l.last].next = si
		if l.last == si {
			l.seqs[si].runs = true
		}
	}
	if l.last == si {
		l.run++
	} else {
		if l.last >= 0 {
			l.seqs[l.last].lastRun, l.seqs[l.last].after = l.run, si
		}
		l.run = 1
	}
	l.last = si
	cur := &l.seqs[si]
	var d decision
	inForce := o.policy
	if o.policy {
		switch {
		case o.changed || o.foreign:
			d.drop, inForce, l.refresh = true, false, false
		case o.swaps > 0 && float64(o.matched) < l.staleMatch*float64(o.swaps):
			d.stale = !l.refresh // leaves the cache once
			l.refresh = true
		case o.outgrown:
			d.outgrown = !l.refresh
			l.refresh = true
		case o.unplaced:
			d.unplaced = !l.refresh
			l.refresh = true
		case o.refine && !cur.refined && !l.refresh:
			cur.refined, d.refine, l.refresh = true, true, true
		}
	}
	if !inForce && o.cached {
		d.adopt, inForce = true, true
	}
	recurring := cur.count > l.m
	if (!inForce || l.refresh) && o.profiled && (!o.changed || recurring) && !cur.failed {
		l.refresh = false
		d.plan, d.adoptPlanned = true, o.changed
	}
	// A run as long as the sequence's last one is likely over: the one that
	// followed that run is expected next. Once: a run that goes on past
	// that length has shown the guess wrong, and its iterations keep their
	// own sequence's policy (a long run of real steps after skipped ones
	// alternated would otherwise run each under the other's policy).
	if !d.plan && !l.refresh && cur.after >= 0 && cur.after != si && l.run == cur.lastRun {
		k := l.seqs[cur.after].key
		d.expect = &k
	}
	return d
}

// planned reports how the planning that end asked for, for k, went: a
// sequence with no feasible policy is not planned again.
func (l *lifecycle) planned(k Key, ok bool) {
	if !ok {
		l.seqs[l.index(k)].failed = true
	}
}

// index finds the history entry of k (the policy cache's rule: same
// signature, bytes within memDelta) or adds one.
func (l *lifecycle) index(k Key) int {
	for i, s := range l.seqs {
		if k.Same(s.key, l.memDelta) {
			return i
		}
	}
	l.seqs = append(l.seqs, seqSeen{key: k, next: -1, after: -1})
	return len(l.seqs) - 1
}

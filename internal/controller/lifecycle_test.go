package controller

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/chameleon-go/chameleon/seq"
)

var (
	keyA = Key{Hash: 1, Ops: 100, Bytes: 1000}
	keyB = Key{Hash: 2, Ops: 80, Bytes: 900}
)

// history is a lifecycle that has seen the given sequences, in order.
func history(keys ...Key) lifecycle {
	l := newLifecycle(2, 0.05, 0.5)
	for _, k := range keys {
		l.end(observation{key: k})
	}
	return l
}

func TestLifecycleEnd(t *testing.T) {
	tests := []struct {
		name  string
		seen  []Key // iterations before
		fail  bool  // planning failed for the latest sequence
		stale bool  // the policy in force is already stale
		give  observation
		want  decision
	}{
		{name: "first iteration, nothing to do", give: observation{key: keyA}},
		{name: "profiled, no policy: plan", seen: []Key{keyA, keyA},
			give: observation{key: keyA, profiled: true}, want: decision{plan: true}},
		{name: "not profiled: no plan", seen: []Key{keyA, keyA},
			give: observation{key: keyA}},
		{name: "a changed sequence seen once is not planned", seen: []Key{keyA, keyA},
			give: observation{key: keyB, changed: true, profiled: true}},
		{name: "a recurring changed sequence is planned and adopted", seen: []Key{keyB, keyA, keyB, keyA},
			give: observation{key: keyB, changed: true, profiled: true}, want: decision{plan: true, adoptPlanned: true}},
		{name: "a changed sequence drops the policy", seen: []Key{keyA},
			give: observation{key: keyB, changed: true, policy: true, swaps: 4, matched: 4}, want: decision{drop: true}},
		{name: "dropped, with a cached policy for the new sequence: adopt it", seen: []Key{keyA},
			give: observation{key: keyB, changed: true, policy: true, swaps: 4, matched: 4, cached: true, profiled: true},
			want: decision{drop: true, adopt: true}},
		{name: "no policy, cached: adopt rather than plan", seen: []Key{keyA, keyA},
			give: observation{key: keyA, cached: true, profiled: true}, want: decision{adopt: true}},
		{name: "the policy matches: keep it", seen: []Key{keyA, keyA},
			give: observation{key: keyA, policy: true, swaps: 4, matched: 2, profiled: true}},
		{name: "too few matched: stale, and the profile replaces it", seen: []Key{keyA, keyA},
			give: observation{key: keyA, policy: true, swaps: 4, matched: 1, profiled: true}, want: decision{stale: true, plan: true}},
		{name: "stale but not profiled: leaves the cache, keeps serving", seen: []Key{keyA, keyA},
			give: observation{key: keyA, policy: true, swaps: 4, matched: 1}, want: decision{stale: true}},
		{name: "already stale: leaves the cache once, the profile replaces it", seen: []Key{keyA, keyA}, stale: true,
			give: observation{key: keyA, policy: true, swaps: 4, matched: 1, profiled: true}, want: decision{plan: true}},
		{name: "already stale, now matching: still replaced", seen: []Key{keyA, keyA}, stale: true,
			give: observation{key: keyA, policy: true, swaps: 4, matched: 4, profiled: true}, want: decision{plan: true}},
		{name: "outgrown: stays in force, the next iteration is profiled", seen: []Key{keyA, keyA},
			give: observation{key: keyA, policy: true, swaps: 4, matched: 4, outgrown: true}, want: decision{outgrown: true}},
		{name: "outgrown and profiled: the profile replaces it", seen: []Key{keyA, keyA},
			give: observation{key: keyA, policy: true, swaps: 4, matched: 4, outgrown: true, profiled: true},
			want: decision{outgrown: true, plan: true}},
		{name: "outgrown while already being replaced: counted once", seen: []Key{keyA, keyA}, stale: true,
			give: observation{key: keyA, policy: true, swaps: 4, matched: 4, outgrown: true, profiled: true}, want: decision{plan: true}},
		{name: "a changed sequence is dropped, not outgrown", seen: []Key{keyA},
			give: observation{key: keyB, changed: true, policy: true, swaps: 4, matched: 4, outgrown: true}, want: decision{drop: true}},
		{name: "planned under forced evictions, run without: profiled once more", seen: []Key{keyA, keyA},
			give: observation{key: keyA, policy: true, swaps: 4, matched: 4, refine: true}, want: decision{refine: true}},
		{name: "refined while stale: the refresh under way replaces it", seen: []Key{keyA, keyA}, stale: true,
			give: observation{key: keyA, policy: true, swaps: 4, matched: 4, refine: true, profiled: true}, want: decision{plan: true}},
		{name: "a changed sequence is dropped, not refined", seen: []Key{keyA},
			give: observation{key: keyB, changed: true, policy: true, swaps: 4, matched: 4, refine: true}, want: decision{drop: true}},
		{name: "a policy with no swaps is never stale", seen: []Key{keyA, keyA},
			give: observation{key: keyA, policy: true, profiled: true}},
		{name: "failed planning is not retried", seen: []Key{keyA, keyA}, fail: true,
			give: observation{key: keyA, profiled: true}},
		{name: "within the memory threshold it is the same sequence", seen: []Key{keyA, keyA}, fail: true,
			give: observation{key: Key{Hash: 1, Ops: 100, Bytes: 1040}, profiled: true}},
		{name: "beyond it another one, planned afresh", seen: []Key{keyA, keyA, {Hash: 1, Ops: 100, Bytes: 2000}}, fail: true,
			give: observation{key: keyA, profiled: true}, want: decision{plan: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := history(tt.seen...)
			if tt.fail {
				l.planned(l.seqs[l.last].key, false)
			}
			l.refresh = tt.stale
			assert.Equal(t, tt.want, l.end(tt.give))
		})
	}
}

func TestLifecycleRefresh(t *testing.T) {
	l := history(keyA, keyA)
	d := l.end(observation{key: keyA, policy: true, swaps: 4, matched: 1})
	assert.True(t, d.stale)
	assert.True(t, l.profile(true, seq.Stable, nil), "a stale policy: profile the next iteration")
	d = l.end(observation{key: keyA, policy: true, swaps: 4, matched: 1, profiled: true})
	assert.Equal(t, decision{plan: true}, d, "replaced, and dropped from the cache only once")
	assert.False(t, l.profile(true, seq.Stable, func(Key) bool { return true }), "replaced: no more profiling")

	l = history(keyA, keyA)
	l.end(observation{key: keyA, policy: true, swaps: 4, matched: 1})
	d = l.end(observation{key: keyB, changed: true, policy: true, swaps: 4, matched: 1})
	assert.Equal(t, decision{drop: true}, d)
	assert.False(t, l.refresh, "a change ends the refresh: the stale policy is gone")
}

// TestLifecycleRefine: a policy planned on times measured under forced
// evictions is planned again from the next iteration's profile, once per
// sequence, and stays in force and in the cache meanwhile.
func TestLifecycleRefine(t *testing.T) {
	l := history(keyA, keyA)
	clean := observation{key: keyA, policy: true, swaps: 4, matched: 4, refine: true}
	assert.Equal(t, decision{refine: true}, l.end(clean))
	assert.True(t, l.profile(true, seq.Stable, nil), "refining: profile the next iteration")
	prof := clean
	prof.profiled = true
	assert.Equal(t, decision{plan: true}, l.end(prof), "planned again from that profile")
	assert.Equal(t, decision{}, l.end(clean), "once per sequence, though the new policy too was planned under evictions")
	assert.False(t, l.profile(true, seq.Stable, func(Key) bool { return true }), "refined: no more profiling")
}

func TestLifecycleProfile(t *testing.T) {
	none := func(Key) bool { return false }
	all := func(Key) bool { return true }
	tests := []struct {
		name   string
		seen   []Key
		fail   bool
		policy bool
		next   seq.Stage
		cached func(Key) bool
		want   bool
	}{
		{name: "warm-up: no profile", next: seq.Warmup, cached: none},
		{name: "no policy after warm-up: profile", seen: []Key{keyA, keyA}, next: seq.GenPolicy, cached: none, want: true},
		{name: "no history yet, past warm-up: profile", next: seq.GenPolicy, cached: none, want: true},
		{name: "a policy in force (and cached): no profile", seen: []Key{keyA, keyA}, policy: true, next: seq.Stable, cached: all},
		{name: "failed sequence: no profile", seen: []Key{keyA, keyA}, fail: true, next: seq.GenPolicy, cached: none},
		{name: "the sequence expected next recurs without a policy: profile",
			seen: []Key{keyB, keyA, keyB, keyA}, policy: true, next: seq.Stable, cached: none, want: true},
		{name: "the one expected next is cached: no profile",
			seen: []Key{keyB, keyA, keyB, keyA}, policy: true, next: seq.Stable, cached: all},
		{name: "the one expected next was seen too rarely: no profile",
			seen: []Key{keyA, keyB, keyA}, policy: true, next: seq.Warmup, cached: none},
		{name: "a sequence in runs too short to leave warm-up, seen M times, a run begun: profile",
			seen: []Key{keyA, keyA, keyB, keyA}, next: seq.Warmup, cached: none, want: true},
		{name: "such a sequence with a cached policy: no profile",
			seen: []Key{keyA, keyA, keyB, keyA}, next: seq.Warmup, cached: all},
		{name: "one that never follows itself is not profiled for runs",
			seen: []Key{keyB, keyA, keyB, keyA}, next: seq.Warmup, cached: func(k Key) bool { return k == keyB }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := history(tt.seen...)
			if tt.fail {
				l.planned(l.seqs[l.last].key, false)
			}
			assert.Equal(t, tt.want, l.profile(tt.policy, tt.next, tt.cached))
		})
	}
	// The expected-next rule when that sequence's planning failed.
	l := history(keyB, keyA, keyB)
	l.planned(keyB, false)
	l.end(observation{key: keyA})
	assert.False(t, l.profile(true, seq.Stable, none), "keyB failed: not profiled again")
}

// TestOutgrew: an iteration outgrows its policy when its bytes, rising
// for three iterations in a row, grew past the profile's and it forced
// more evictions than a twentieth of the planned swaps; a policy of no
// swaps, by any eviction.
func TestOutgrew(t *testing.T) {
	assert.True(t, Outgrew(1010, 1000, 1, 0, 3))
	assert.False(t, Outgrew(1010, 1000, 1, 0, 2), "bytes that rose twice are not yet growth")
	assert.False(t, Outgrew(1000, 1000, 5, 0, 3), "the bytes did not grow: not outgrown")
	assert.False(t, Outgrew(990, 1000, 5, 0, 3))
	assert.False(t, Outgrew(1010, 1000, 0, 0, 3), "no eviction")
	assert.False(t, Outgrew(1010, 1000, 2, 40, 3), "2 evictions against 40 planned swaps")
	assert.True(t, Outgrew(1010, 1000, 3, 40, 5))
}

// TestLifecycleExpect: a sequence that comes in runs is followed, when
// its run is as long as the last one, by the sequence that followed that
// run: its policy is expected next. A policy in force for another
// sequence than the iteration's (an expectation that did not come true)
// is dropped, and the iteration's own cached one adopted.
func TestLifecycleExpect(t *testing.T) {
	l := history(keyA, keyA, keyB, keyB, keyA, keyA)
	d := l.end(observation{key: keyB, changed: true})
	assert.Nil(t, d.expect, "B's runs last two: one is not over")
	d = l.end(observation{key: keyB})
	if assert.NotNil(t, d.expect) {
		assert.Equal(t, keyA, *d.expect, "two B, then A, as last time")
	}
	d = l.end(observation{key: keyB, policy: true, foreign: true, swaps: 4, matched: 1, cached: true})
	assert.True(t, d.drop, "A's policy, applied to a B")
	assert.True(t, d.adopt)
	// The run outlasts its last one: the guess was wrong, and the B's that
	// follow keep B's policy, however long the run.
	assert.Nil(t, d.expect, "three B: A is no longer expected")
	for range 5 {
		d = l.end(observation{key: keyB, policy: true, cached: true})
		assert.False(t, d.drop)
		assert.Nil(t, d.expect, "a long run of B runs under B's policy")
	}
	// The run ends; it was eight long, so the next run of B expects A
	// after eight.
	d = l.end(observation{key: keyA, changed: true, cached: true})
	assert.True(t, d.adopt)
	for i := range 8 {
		d = l.end(observation{key: keyB, changed: i == 0, policy: i > 0, cached: true})
		if i < 7 {
			assert.Nil(t, d.expect, "B's run at %d of 8", i+1)
		}
	}
	if assert.NotNil(t, d.expect) {
		assert.Equal(t, keyA, *d.expect, "eight B, then A, as last time")
	}
	// A single sequence expects nothing.
	s := history(keyA, keyA, keyA)
	assert.Nil(t, s.end(observation{key: keyA}).expect)
}

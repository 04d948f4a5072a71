package controller

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/mre"
	"github.com/chameleon-go/chameleon/seq"
)

func newTest() *Controller {
	return New(Config{M: 2, MemDelta: 0.05, StaleMatch: 0.5, Limit: 1000})
}

// seen ends iterations of the given sequences, with no policy, acking any
// plan asked for as failed-free (none is asked for without a profile).
func seen(c *Controller, keys ...Key) {
	for _, k := range keys {
		c.End(Observation{Key: k})
	}
}

// TestCloserFit: a tighter plan for placement that found no plan under its
// limit is made again at the least share the planner's error says may be
// met, with a little room, while that is still under the peak of the
// policy in force; otherwise the policy in force stays.
func TestCloserFit(t *testing.T) {
	c := newTest()
	c.placeFit = 0.9
	wrap := func(short int64) error {
		return fmt.Errorf("plan: %w", &mre.InfeasibleError{Limit: 900, Op: 7, Shortfall: short})
	}
	next, ok := c.closerFit(wrap(20), 950)
	require.True(t, ok)
	assert.InDelta(t, 0.92*feasibleMargin, next, 1e-9)
	_, ok = c.closerFit(wrap(49), 950)
	assert.False(t, ok, "at or over the peak of the policy in force")
	_, ok = c.closerFit(errors.New("no plan"), 950)
	assert.False(t, ok, "not an infeasible limit")
	c.placeFit = 0.93
	_, ok = c.closerFit(wrap(20), 950)
	assert.False(t, ok, "no closer than the share already tried")
}

// TestInFlight: while a plan is in flight no iteration is profiled and no
// other plan is asked for; it lands applied when its sequence still runs,
// only cached when another one came meanwhile.
func TestInFlight(t *testing.T) {
	none := func(Key) bool { return false }
	c := newTest()
	seen(c, keyA, keyA)
	require.True(t, c.Begin(Start{Next: seq.GenPolicy, Cached: none}))
	r := c.End(Observation{Key: keyA, Profiled: true})
	require.NotNil(t, r.Plan)
	assert.Equal(t, Request{Key: keyA, Limit: 1000}, *r.Plan)
	assert.True(t, c.InFlight())
	assert.False(t, c.Begin(Start{Next: seq.GenPolicy, Cached: none}), "no profile while a plan is in flight")
	assert.Nil(t, c.End(Observation{Key: keyA, Profiled: true}).Plan, "nor a second plan")
	l := c.Landed(*r.Plan, Result{})
	assert.Equal(t, Landing{Apply: true, Replan: true}, l)
	assert.False(t, c.InFlight())

	// The sequence changed before the plan came back: cached, not applied.
	c = newTest()
	seen(c, keyA, keyA)
	r = c.End(Observation{Key: keyA, Profiled: true})
	require.NotNil(t, r.Plan)
	c.End(Observation{Key: keyB, Changed: true})
	l = c.Landed(*r.Plan, Result{})
	assert.False(t, l.Apply)
	assert.True(t, l.Replan, "it enters the cache all the same")

	// A failed plan: the sequence is not profiled again.
	c = newTest()
	seen(c, keyA, keyA)
	r = c.End(Observation{Key: keyA, Profiled: true})
	l = c.Landed(*r.Plan, Result{Err: errors.New("infeasible")})
	assert.Equal(t, Landing{Failed: true}, l)
	assert.False(t, c.Begin(Start{Next: seq.GenPolicy, Cached: none}))
}

// TestDrift: a drift asks for a profile of the next iteration, unless a
// plan is in flight already.
func TestDrift(t *testing.T) {
	all := func(Key) bool { return true }
	c := newTest()
	seen(c, keyA, keyA)
	s := Start{Policy: true, Next: seq.Stable, Drifted: true, Cached: all}
	assert.True(t, c.Drifting(s))
	assert.True(t, c.Begin(s))
	r := c.End(Observation{Key: keyA, Profiled: true, Cached: true, Policy: &Policy{ID: 1, Key: keyA, Targets: 4, Matched: 4}})
	require.NotNil(t, r.Plan, "planned again from the drifted iteration's profile")
	assert.False(t, c.Drifting(s), "in flight: not counted")
	assert.False(t, c.Begin(s))
}

// TestExpectedForeign: a policy applied because its sequence was expected
// is dropped at the end of an iteration of another sequence; the same key
// in force under another ID is not.
func TestExpectedForeign(t *testing.T) {
	c := newTest()
	seen(c, keyA, keyA)
	c.Expected(7)
	r := c.End(Observation{Key: keyB, Policy: &Policy{ID: 7, Key: keyA, Targets: 4, Matched: 4}})
	assert.True(t, r.Drop)
	c = newTest()
	seen(c, keyA, keyA)
	c.Expected(7)
	r = c.End(Observation{Key: keyB, Policy: &Policy{ID: 8, Key: keyA, Targets: 4, Matched: 4}})
	assert.False(t, r.Drop, "not the expected one")
}

// TestTighten: a policy of this Engine the allocator could not place is
// replaced by a plan aiming lower; its replacement drops it from the
// cache. A tighter plan that finds none leaves the policy in force and the
// share where it was, and that policy is not tightened again.
func TestTighten(t *testing.T) {
	all := func(Key) bool { return true }
	pol := &Policy{ID: 1, Key: keyA, Here: true, Targets: 4, Matched: 4, Peak: 990}
	c := newTest()
	seen(c, keyA, keyA)
	r := c.End(Observation{Key: keyA, Policy: pol, Cached: true, Shortfalls: 1, Fit: 0.95})
	assert.True(t, r.Unplaced)
	assert.InDelta(t, 0.99*0.95*placeMargin, c.PlaceFit(), 1e-9)
	require.True(t, c.Begin(Start{Policy: true, Next: seq.Stable, Cached: all}), "profiled to replace it")
	r = c.End(Observation{Key: keyA, Profiled: true, Policy: pol, Cached: true, Shortfalls: 1, Fit: 0.95})
	require.NotNil(t, r.Plan)
	assert.True(t, r.Plan.Tighten)
	assert.Equal(t, c.PlanLimit(), r.Plan.Limit)
	assert.Less(t, r.Plan.Limit, int64(1000))
	l := c.Landed(*r.Plan, Result{})
	assert.Equal(t, Landing{Apply: true, Tightened: true}, l, "its own key is replaced in the cache, not dropped")

	// No plan at the tighter share: retried closer to the peak, then kept.
	c = newTest()
	seen(c, keyA, keyA)
	c.End(Observation{Key: keyA, Policy: pol, Cached: true, Shortfalls: 1, Fit: 0.95})
	c.Begin(Start{Policy: true, Next: seq.Stable, Cached: all})
	r = c.End(Observation{Key: keyA, Profiled: true, Policy: pol, Cached: true, Shortfalls: 1, Fit: 0.95})
	require.NotNil(t, r.Plan)
	fit := c.PlaceFit()
	infeasible := &mre.InfeasibleError{Limit: r.Plan.Limit, Op: 3, Shortfall: 5}
	l = c.Landed(*r.Plan, Result{Err: infeasible})
	require.NotNil(t, l.Retry, "closer to the policy's peak")
	assert.Greater(t, l.Retry.Limit, r.Plan.Limit)
	assert.True(t, c.InFlight())
	l = c.Landed(*l.Retry, Result{Err: errors.New("still none")})
	assert.Equal(t, Landing{Failed: true}, l)
	assert.InDelta(t, 1, c.PlaceFit(), 1e-9, "back where it was before the tightening")
	assert.NotEqual(t, fit, c.PlaceFit())
	r = c.End(Observation{Key: keyA, Policy: pol, Cached: true, Shortfalls: 2, Fit: 0.9})
	assert.False(t, r.Unplaced, "that policy is not tightened again")
}

// TestShared: a policy from rank 0 lands applied without counting as a
// plan; a plan asked for with no policy in force is exchanged.
func TestShared(t *testing.T) {
	none := func(Key) bool { return false }
	c := New(Config{M: 2, MemDelta: 0.05, StaleMatch: 0.5, Limit: 1000, Ranks: true})
	seen(c, keyA, keyA)
	c.Begin(Start{Next: seq.GenPolicy, Cached: none})
	r := c.End(Observation{Key: keyA, Profiled: true})
	require.NotNil(t, r.Plan)
	assert.True(t, r.Plan.Exchange)
	assert.Equal(t, Landing{Apply: true}, c.Landed(*r.Plan, Result{Shared: true}))
}

// TestRestarted: the policy a restarted job applies from its first
// iteration settles when that iteration is its sequence, and is dropped,
// the iteration's own cached one adopted, when it is another's.
func TestRestarted(t *testing.T) {
	c := newTest()
	c.Restarted(3)
	r := c.End(Observation{Key: keyA, Cached: true, Policy: &Policy{ID: 3, Key: keyA, Targets: 4, Matched: 4}})
	assert.Equal(t, Ready{Settle: true}, r)
	r = c.End(Observation{Key: keyA, Cached: true, Policy: &Policy{ID: 3, Key: keyA, Targets: 4, Matched: 4}})
	assert.Equal(t, Ready{}, r, "settled once")

	c = newTest()
	c.Restarted(3)
	r = c.End(Observation{Key: keyB, Cached: true, Policy: &Policy{ID: 3, Key: keyA, Targets: 4, Matched: 0}})
	assert.Equal(t, Ready{Drop: true, Adopt: true}, r)
}

// TestTightenBestFit: where best fit serves the policy in force (its
// placement given up) and forced evictions under it, the next plan aims
// lower, at least bestFitStep of the policy's peak and more where the
// bytes forced out ask for it, down to minPlaceFit and no further. An
// iteration with no eviction, one that allocates more than the policy's
// profile (a decode's cache grows: Outgrew's case), a policy placed (not
// BestFit) and one from elsewhere are left as they are.
func TestTightenBestFit(t *testing.T) {
	all := func(Key) bool { return true }
	pol := &Policy{ID: 1, Key: keyA, Here: true, Targets: 4, Matched: 4, Peak: 1000}
	for _, tc := range []struct {
		name string
		obs  Observation
		pol  Policy
		want bool
		fit  float64
	}{
		{"no eviction", Observation{BestFit: true}, *pol, false, 1},
		{"placed", Observation{Evictions: 3, EvictedBytes: 10}, *pol, false, 1},
		{"from elsewhere", Observation{BestFit: true, Evictions: 3, EvictedBytes: 10}, Policy{ID: 1, Key: keyA, Targets: 4, Matched: 4, Peak: 1000}, false, 1},
		{"a few bytes", Observation{BestFit: true, Evictions: 3, EvictedBytes: 10}, *pol, true, bestFitStep * placeMargin},
		{"many bytes", Observation{BestFit: true, Evictions: 3, EvictedBytes: 80}, *pol, true, 0.92 * placeMargin},
		{"more than the floor", Observation{BestFit: true, Evictions: 3, EvictedBytes: 300}, *pol, true, minPlaceFit},
	} {
		c := newTest()
		seen(c, keyA, keyA)
		o := tc.obs
		o.Key, o.Policy, o.Cached = keyA, &tc.pol, true
		r := c.End(o)
		assert.Equal(t, tc.want, r.Unplaced, tc.name)
		assert.InDelta(t, tc.fit, c.PlaceFit(), 1e-9, tc.name)
	}
	// Above the policy's bytes, falling or not since the last iteration.
	c := newTest()
	more, most := keyA, keyA
	more.Bytes, most.Bytes = keyA.Bytes+1, keyA.Bytes+2
	seen(c, keyA, most)
	r := c.End(Observation{Key: more, Policy: pol, Cached: true, BestFit: true, Evictions: 3, EvictedBytes: 10})
	assert.False(t, r.Unplaced, "more bytes than the policy's profile")
	assert.InDelta(t, 1, c.PlaceFit(), 1e-9)

	// Evictions go on under each tighter plan: twice reaches the floor,
	// where the policy stays.
	c = newTest()
	seen(c, keyA, keyA)
	fits := []float64{}
	for range 4 {
		r := c.End(Observation{Key: keyA, Policy: pol, Cached: true, BestFit: true, Evictions: 1, EvictedBytes: 1})
		if !r.Unplaced {
			break
		}
		require.True(t, c.Begin(Start{Policy: true, Next: seq.Stable, Cached: all}))
		r = c.End(Observation{Key: keyA, Profiled: true, Policy: pol, Cached: true})
		require.NotNil(t, r.Plan)
		require.True(t, r.Plan.Tighten)
		assert.Equal(t, int64(float64(1000)*c.PlaceFit()), r.Plan.Limit)
		c.Landed(*r.Plan, Result{})
		fits = append(fits, c.PlaceFit())
	}
	assert.InDeltaSlice(t, []float64{bestFitStep * placeMargin, minPlaceFit}, fits, 1e-9)
}

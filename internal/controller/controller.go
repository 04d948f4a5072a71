// Package controller decides, iteration by iteration, which policy is in
// force, when to profile and when to plan. It is a pure state machine in
// the raft style: the Engine hands it what an iteration showed (an
// Observation) and gets back what to do (a Ready); it carries that out and
// acknowledges what came of it (Expected, Landed). The controller touches
// no device, clock, cache or goroutine, and no other code writes its
// state, so every transition is a table test.
//
// It owns the lifecycle of sequences (profile, plan, adopt, expect, stale,
// outgrown, refine, drift), the share of the limit plans aim at for
// placement (tightening), and the one plan in flight: while a plan runs on
// the Engine's worker no other is asked for, and the plan lands at an
// iteration boundary, applied when its sequence is still the one running.
package controller

import (
	"errors"

	"github.com/chameleon-go/chameleon/mre"
	"github.com/chameleon-go/chameleon/seq"
)

// Key is a sequence signature: the hash of its op names in order (stable
// across processes), its length, and the bytes its ops allocate. Two
// iterations share a policy when hash and length agree and the bytes are
// within the detection's memory threshold.
type Key struct {
	Hash  uint64 `json:"hash"`
	Ops   int    `json:"ops"`
	Bytes int64  `json:"bytes"`
}

// Same reports whether two signatures name the same sequence: equal op
// names in order and, within memDelta, the same allocated bytes.
func (k Key) Same(o Key, memDelta float64) bool {
	return k.Hash == o.Hash && k.Ops == o.Ops && seq.RelDelta(float64(k.Bytes), float64(o.Bytes)) <= memDelta
}

// Config holds the controller's settings.
type Config struct {
	M          int     // iterations a sequence must be seen before it is planned
	MemDelta   float64 // two signatures are one sequence within this byte delta
	StaleMatch float64 // a policy matching fewer than this share of its targets is stale
	Limit      int64   // the device memory limit plans are made for
	// NoPlace: the allocator places nothing, so plans are never tightened
	// for placement.
	NoPlace bool
	// Ranks: plans of a sequence with no policy in force are exchanged
	// among ranks (Request.Exchange).
	Ranks bool
}

// Policy is what the controller knows of the policy in force.
type Policy struct {
	ID  uint64 // the Engine's identity for it: two policies of one key differ
	Key Key
	// Here: planned by this Engine (not loaded from a file or taken from
	// another rank): only such policies are tightened for placement.
	Here             bool
	Targets, Matched int   // its swaps and recomputes, and how many matched live tensors
	Peak             int64 // its simulated peak, 0 when not known
	// Disturbed: planned on times measured under forced evictions.
	Disturbed bool
}

// Start is what the Engine knows as an iteration begins.
type Start struct {
	Policy bool      // a policy is in force
	Next   seq.Stage // the stage the detector expects
	// Drifted: the measured layer times drifted from the plan's twice in
	// a row: the iteration is profiled to plan again.
	Drifted bool
	Cached  func(Key) bool // whether the cache holds a policy for a signature
}

// Observation is what an ended iteration showed.
type Observation struct {
	Key      Key
	Changed  bool // the detector declared a change
	Profiled bool // the iteration was profiled in detail
	Cached   bool // the cache holds a policy for Key
	Policy   *Policy
	// Evictions counts the swap-outs the executor forced, EvictedBytes
	// their bytes.
	Evictions, EvictedBytes int64
	// BestFit: the allocator serves the policy in force by best fit, its
	// sequence's placement given up (a step that does not recur closely
	// enough to be placed: an MoE's routing, a decode's growing cache).
	BestFit bool
	// Shortfalls counts the policies the allocator found to need more
	// pages than the limit holds, Fit the share of them that fit, for the
	// latest (device.Allocator.PageShortfalls).
	Shortfalls int64
	Fit        float64
}

// Ready is what the Engine does after an iteration, in field order.
type Ready struct {
	Drop bool // stop applying the policy in force: the sequence changed
	// Stale: the policy in force leaves the cache (Uncache), too few of
	// its tensors match; the next iteration is profiled to replace it.
	Stale bool
	// Outgrown: the policy in force no longer holds the iteration's bytes;
	// the next iteration is profiled to replace it (counted once).
	Outgrown bool
	// Unplaced: the policy in force could not be placed; the next
	// iteration is profiled to replace it with a tighter one.
	Unplaced bool
	// Refine: the next iteration is profiled to plan the policy in force
	// again on the times it leaves the kernels (once per sequence).
	Refine bool
	// Drifted: a drift reported at Start was taken (counted once).
	Drifted bool
	Adopt   bool // apply the cached policy for the iteration's key; the detector adopts it
	// Settle: the policy a restarted job applied from its first iteration
	// (Restarted) held for it: the detector adopts it.
	Settle bool
	// Uncache are keys whose policies leave the cache.
	Uncache []Key
	// Expect is the sequence expected next. Its cached policy, if any, is
	// applied to the next iteration in place of the one in force (and
	// dropped at its end if that turns out another sequence); the Engine
	// says so with Expected.
	Expect *Key
	// Plan asks for a plan from this iteration's profile, to land with
	// Landed.
	Plan *Request
}

// Request is a plan the controller asks for.
type Request struct {
	Key   Key
	Limit int64 // the limit to plan under
	// Growing: the policy it replaces was outgrown: leave headroom.
	Growing bool
	// AdoptPlanned: once planned, the detector adopts the policy (a
	// recurring sequence: no warm-up needed).
	AdoptPlanned bool
	// Tighten: a replacement for placement, aiming below the limit.
	Tighten bool
	// Exchange: the ranks exchange this plan (rank 0 plans and
	// broadcasts; the others take its policy or plan on their own).
	Exchange bool
	// replaces is the policy in force when it was asked for, and its
	// peak; try counts the plans made again closer to its peak.
	replaces *Key
	peak     int64
	try      int
}

// Result is how a requested plan went.
type Result struct {
	Err error // nil: a policy; otherwise why there is none
	// Shared: the policy came from another rank, not planned here.
	Shared bool
	// Disturbed: planned on times measured under forced evictions.
	Disturbed bool
}

// Landing is what the Engine does with a plan that came back.
type Landing struct {
	// Apply: put the policy in force (its sequence is the one running).
	Apply bool
	// AdoptPlanned: the detector adopts it.
	AdoptPlanned bool
	// Uncache are keys whose policies leave the cache (those the new one
	// replaced for placement); the new one enters it.
	Uncache []Key
	// Tightened: a replacement for placement (not a replan); Replan: a
	// policy planned anew. Both false for a shared one or a failure.
	Tightened, Replan bool
	// Failed: no policy; the sequence is not planned again.
	Failed bool
	// Retry asks for the plan again, closer to the policy in force.
	Retry *Request
}

// Controller is the policy-selection state machine.
type Controller struct {
	cfg  Config
	life lifecycle
	// inflight: a plan was asked for and has not landed.
	inflight bool
	// expected is the ID of the policy last applied because its sequence
	// was expected next; while it is in force, an iteration of another
	// sequence drops it.
	expected    uint64
	expectedSet bool
	// restart: the policy in force was applied before the first iteration
	// (Restarted), not yet confirmed by it.
	restart bool
	// outgrown: the policy in force was outgrown; the next plan leaves
	// headroom for growth.
	outgrown bool
	// placeFit is the share of the limit plans aim at (1 at first),
	// fitBefore its value before the tightening under way; shortfalls the
	// allocator's count seen; unplaced the key of a policy whose tighter
	// plan found none (it stays as it is).
	placeFit, fitBefore float64
	shortfalls          int64
	unplaced            *Key
	// superseded are the keys replaced for placement, to leave the cache
	// once their replacement lands; tighten says the next plan is one.
	superseded []Key
	tighten    bool
	// lastBytes is the last iteration's bytes, grew how many iterations
	// in a row they rose.
	lastBytes int64
	grew      int
}

// New returns a controller that has seen nothing.
func New(cfg Config) *Controller {
	return &Controller{cfg: cfg, life: newLifecycle(cfg.M, cfg.MemDelta, cfg.StaleMatch), placeFit: 1}
}

// Begin says whether the coming iteration is profiled in detail. No new
// profile is taken while a plan is in flight.
func (c *Controller) Begin(s Start) bool {
	if s.Drifted && !c.inflight {
		c.life.refresh = true
	}
	if c.inflight {
		return false
	}
	return c.life.profile(s.Policy, s.Next, s.Cached)
}

// Drifting reports whether a drift reported at Begin is being acted on:
// the Engine counts it once.
func (c *Controller) Drifting(s Start) bool { return s.Drifted && !c.inflight }

// InFlight reports whether a plan was asked for and has not landed.
func (c *Controller) InFlight() bool { return c.inflight }

// Latest is the signature of the latest iteration's sequence.
func (c *Controller) Latest() (Key, bool) {
	if c.life.last < 0 {
		return Key{}, false
	}
	return c.life.seqs[c.life.last].key, true
}

// End records an iteration and decides what follows it.
func (c *Controller) End(o Observation) Ready {
	if c.lastBytes > 0 && o.Key.Bytes > c.lastBytes {
		c.grew++
	} else {
		c.grew = 0
	}
	c.lastBytes = o.Key.Bytes
	obs := observation{key: o.Key, changed: o.Changed, profiled: o.Profiled && !c.inflight, cached: o.Cached}
	p := o.Policy
	if p != nil {
		obs.policy, obs.swaps, obs.matched = true, p.Targets, p.Matched
		obs.foreign = c.expectedSet && p.ID == c.expected && !p.Key.Same(o.Key, c.cfg.MemDelta)
		obs.outgrown = Outgrew(o.Key.Bytes, p.Key.Bytes, o.Evictions, p.Targets, c.grew)
		obs.unplaced = c.unplacedNow(p, o)
		obs.refine = p.Disturbed && o.Evictions == 0
	}
	d := c.life.end(obs)
	r := Ready{Drop: d.drop, Stale: d.stale, Outgrown: d.outgrown, Unplaced: d.unplaced, Refine: d.refine, Adopt: d.adopt, Expect: d.expect}
	if d.drop {
		c.tighten = false
	}
	if c.restart {
		c.restart = false
		r.Settle = p != nil && !d.drop && c.expectedSet && p.ID == c.expected
	}
	if d.stale {
		r.Uncache = append(r.Uncache, p.Key)
	}
	if d.outgrown {
		c.outgrown = true
	}
	if d.unplaced {
		c.tighten = true
		c.superseded = append(c.superseded, p.Key)
	}
	if d.plan {
		inForce := p != nil && !d.drop
		req := &Request{Key: o.Key, Limit: c.PlanLimit(), Growing: c.outgrown, AdoptPlanned: d.adoptPlanned,
			Tighten: c.tighten, Exchange: c.cfg.Ranks && !inForce && !d.adopt}
		if inForce {
			k := p.Key
			req.replaces, req.peak = &k, p.Peak
		}
		c.inflight = true
		r.Plan = req
	}
	return r
}

// Restarted says that the policy id, of the sequence a restarted job saved
// last, is applied from its first iteration, as an expected one: dropped
// at the end of that iteration if it was another sequence's, settled
// (Ready.Settle) if not.
func (c *Controller) Restarted(id uint64) {
	c.Expected(id)
	c.restart = true
}

// Expected acknowledges that the policy id was applied for Ready.Expect.
func (c *Controller) Expected(id uint64) { c.expected, c.expectedSet = id, true }

// Landed takes the outcome of a requested plan. A policy is applied when
// its sequence is still the latest one (always, where the Engine waits for
// its plans); otherwise it only enters the cache.
func (c *Controller) Landed(req Request, res Result) Landing {
	c.inflight = false
	var l Landing
	if res.Err != nil {
		if req.Tighten && req.try < maxTightenTries {
			if next, ok := c.closerFit(res.Err, req.peak); ok {
				c.placeFit = next
				retry := req
				retry.Limit, retry.try = c.PlanLimit(), req.try+1
				c.inflight = true
				l.Retry = &retry
				return l
			}
		}
		// Not again for this sequence: the forced swap-outs of the
		// executor keep its iterations under the limit meanwhile.
		c.life.planned(req.Key, false)
		l.Failed = true
		if req.Tighten && req.replaces != nil {
			// The policy in force stays, in the cache too, and later
			// plans aim where it did.
			c.placeFit = c.fitBefore
			k := *req.replaces
			c.unplaced = &k
		}
		c.tighten, c.superseded = false, c.superseded[:0]
		return l
	}
	latest, ok := c.Latest()
	l.Apply = ok && latest.Same(req.Key, c.cfg.MemDelta)
	l.AdoptPlanned = req.AdoptPlanned && l.Apply
	if !res.Shared {
		for _, k := range c.superseded {
			if k != req.Key {
				l.Uncache = append(l.Uncache, k)
			}
		}
		c.superseded = c.superseded[:0]
		c.outgrown = false
		l.Tightened, l.Replan = req.Tighten, !req.Tighten
		c.tighten = false
	}
	return l
}

// Outgrew reports whether an iteration outgrew the policy in force: its
// allocated bytes above those of the profile the policy was planned from,
// after growing steadily (rising over the last grownFor iterations in a
// row: grew counts them), and more forced evictions than a twentieth of
// the planned swaps (any, for a policy of none). Bytes that move up and
// down (an MoE step's routing) are not growth: a new plan would not hold
// the next iteration better.
func Outgrew(bytes, plannedBytes, evictions int64, swaps, grew int) bool {
	return grew >= grownFor && bytes > plannedBytes && evictions > int64(swaps)/20
}

// grownFor is how many iterations in a row the bytes must rise before a
// policy counts as outgrown.
const grownFor = 3

// minPlaceFit is the least share of the limit a plan aims at so that the
// allocator can place it (Stats.Tightened); placeMargin is taken off each
// share that would have fit, for the packing's loss grows with the bytes.
const (
	minPlaceFit = 0.9
	placeMargin = 0.99
)

// maxTightenTries bounds the plans a tightening for placement makes
// again, each at the least share of the limit the last one's error says
// may be met, before the policy in force stays.
const maxTightenTries = 2

// feasibleMargin is the room a plan made again after an infeasible one
// aims above the least share its error says may be met.
const feasibleMargin = 1.002

// PlanLimit is the limit plans aim at: the limit, less what placement
// found it needs (placeFit).
func (c *Controller) PlanLimit() int64 {
	if c.placeFit >= 1 {
		return c.cfg.Limit
	}
	return int64(float64(c.cfg.Limit) * c.placeFit)
}

// PlaceFit is the share of the limit plans aim at.
func (c *Controller) PlaceFit() float64 { return c.placeFit }

// unplacedNow reports whether the allocator found, since the last look,
// that the blocks of the policy in force (planned by this Engine) need
// more pages than the limit holds, or, where best fit serves the policy
// (its placement given up), forced evictions under it in an iteration
// that allocated no more than the policy's profile, and lowers the
// share of the limit the next plan aims at to the share of the policy's
// simulated peak that would have fit (best fit: less the bytes forced
// out, and at least bestFitStep lower): a plan whose peak sat under the
// limit already must come down from its peak, not from the limit. The
// share goes no lower than minPlaceFit (taken once where the fit asks for
// less); it reports false once a plan there was not placed either, or for
// a policy whose tighter plan found none (see closerFit): the forced
// evictions keep its iterations under the limit then.
func (c *Controller) unplacedNow(p *Policy, o Observation) bool {
	if c.cfg.NoPlace {
		return false
	}
	var fit float64
	switch {
	case o.Shortfalls != c.shortfalls:
		c.shortfalls, fit = o.Shortfalls, o.Fit
	case o.BestFit && o.Evictions > 0 && o.Key.Bytes <= p.Key.Bytes && c.cfg.Limit > 0:
		// An iteration that allocates more than the policy's profile (a
		// decode's growing cache) is outgrowing it (Outgrew): planned
		// lower, the policy would not hold it better.
		fit = min(1-float64(o.EvictedBytes)/float64(c.cfg.Limit), bestFitStep)
	default:
		return false
	}
	if !p.Here {
		return false // a policy from a file or another rank runs as it came
	}
	if !(fit < 1) || c.placeFit <= minPlaceFit || (c.unplaced != nil && *c.unplaced == p.Key) {
		return false
	}
	c.fitBefore = c.placeFit
	c.placeFit = max(min(c.placeFit, c.peakShare(p.Peak))*fit*placeMargin, minPlaceFit)
	return true
}

// bestFitStep is the most of the policy's peak a tighter plan keeps when
// best fit (Observation.BestFit) forced evictions under it: best fit
// counts no pages it lacks, and the bytes it forced out, spread over the
// step, understate what it lacks at any one op, so the plan comes down at
// least this far (twice reaches minPlaceFit from the limit).
const bestFitStep = 0.95

// peakShare is a simulated peak as a share of the limit, 1 where it is not
// known.
func (c *Controller) peakShare(peak int64) float64 {
	if peak > 0 && c.cfg.Limit > 0 {
		return float64(peak) / float64(c.cfg.Limit)
	}
	return 1
}

// closerFit says whether a plan aiming lower for placement that found no
// plan under its limit (err) may find one closer to the policy in force
// (of simulated peak peak), and at which share of the limit: the least the
// error says may be met, with feasibleMargin's room above it, where that
// is still under the policy's own peak.
func (c *Controller) closerFit(err error, peak int64) (float64, bool) {
	var ie *mre.InfeasibleError
	if !errors.As(err, &ie) || c.cfg.Limit <= 0 || ie.Shortfall <= 0 {
		return 0, false
	}
	next := float64(ie.Limit+ie.Shortfall) / float64(c.cfg.Limit) * feasibleMargin
	if next <= c.placeFit || next >= c.peakShare(peak) {
		return 0, false
	}
	return next, true
}

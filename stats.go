package chameleon

// Stats are the Engine's running totals, grouped by the job that counts
// them; each group's fields are promoted, so s.SwapsOut reads as before.
type Stats struct {
	Iterations int
	PolicyStats
	ExecStats
	DeviceStats
	TimingStats
	HintStats
	RankStats
}

// PolicyStats count what the controller decided: plans, cache hits,
// replacements.
type PolicyStats struct {
	Replans   int // policies planned from a detailed profile (a replacement for placement: Tightened)
	CacheHits int // policies reused from the cache on a sequence seen before
	// Expected counts the cached policies applied to an iteration before
	// it ran, for the sequence expected next (a run as long as its last
	// one ended: what followed that run).
	Expected      int
	StaleDrops    int // cached policies dropped because their tensors no longer matched
	PolicyUpdates int // cached policies updated to another limit, link or device (a differential update, not a replan)
	// Outgrown counts policies an iteration outgrew: its bytes grew past
	// the profile they were planned from and it forced evictions past a
	// twentieth of the planned swaps. Each is planned again from the next
	// iteration's profile, staying STABLE (a decode loop's growing cache).
	Outgrown int
	// Tightened counts policies planned again below the limit because
	// the blocks of the one in force needed more pages than the limit
	// holds (the allocator refused to place them, or moved pages each step
	// for them; WithPlacement): each aims lower by the share that would
	// have fit, down to 90% of the limit. They are not counted in Replans.
	Tightened int
	// Refined counts policies planned again from the profile of an
	// iteration they ran without forcing an eviction, having been
	// planned on times measured under forced evictions (a sequence's
	// first profile, with no policy in force: the evictions' copies slow
	// the kernels they run beside). Once per sequence; each is in Replans.
	Refined    int
	Infeasible int // planning runs that found no plan under the limit
}

// ExecStats count what the executor moved: copies, evictions, recomputes.
type ExecStats struct {
	SwapsOut   int64 // copies to the host (planned and on demand)
	SwapsIn    int64
	OnDemandIn int64 // copies back issued at the use, not ahead of it
	Evictions  int64 // swap-outs forced by a failed allocation
	// Relocated counts the parameters and optimizer state moved on the
	// device (one copy each) to where a new policy's layout has them.
	Relocated       int64
	SwappedOutBytes int64
	SwappedInBytes  int64
	Recomputes      int64 // tensors dropped and made again by running their producer
	// KeptEvictions counts swap-outs (in SwapsOut) of tensors whose host
	// copy was still current (parameters, optimizer state, and activations
	// the plan swaps out again, that no op had written since they came
	// back): device memory released, nothing copied;
	// KeptBytes their bytes, which SwappedOutBytes does not count.
	KeptEvictions, KeptBytes int64
	// WriteBacks counts the planned copies to the host of tensors that
	// stay on the device, read on, until they leave (simulate.Swap.Early):
	// their bytes are in SwappedOutBytes, their release later in SwapsOut
	// and KeptEvictions.
	WriteBacks int64
	// Carried counts the copies back (in SwapsIn) started for tensors the
	// policy of the iteration before left on the host with a copy back due
	// that the Engine no longer issues itself: planned across the step's
	// end where another policy, or none, runs the next iteration; or
	// planned for an op that iteration never reached (it ended sooner
	// than the one the policy was planned from: a skipped step under a
	// real step's policy), a parameter or optimizer state. Each starts
	// where its policy had it (the first op for one not reached) once
	// device memory is free, ahead of its use rather than at it.
	Carried int64
}

// DeviceStats are the device allocator's and the pinned host pool's.
type DeviceStats struct {
	PeakDeviceBytes int64 // highest bytes the allocator handed out
	// DeviceBytes and HostBytes are what the Engine holds now: device memory
	// handed out (block-rounded) and pinned host buffers in use.
	DeviceBytes, HostBytes int64
	// Maps, Unmaps and HostWaits are the device allocator's (device.Stats):
	// page mappings made and undone, and the times the host waited for
	// queued work to unmap a range. All three stay flat once a policy runs
	// as planned; a host wait stalls the host's queueing of work.
	Maps, Unmaps, HostWaits int64
	// MappedPages counts the pages those maps mapped (device.Stats).
	MappedPages int64
	// Placed and Missed count the device blocks of STABLE iterations
	// served at the address planned for them (WithPlacement) and, with a
	// plan, elsewhere; Placements the plans the allocator made.
	Placed, Missed, Placements int64
	// PeakHostBytes is the most pinned host memory in use at once.
	PeakHostBytes int64
	// HostAllocs counts the pinned slabs the host pool allocated (each a
	// cudaHostAlloc on CUDA, slow: it pins the pages): flat once the pool
	// holds what a policy's swaps need at once.
	HostAllocs int64
}

// TimingStats count the timing events read and the plans they led to.
type TimingStats struct {
	// DriftReplans counts the times a logical layer's sampled time drifted
	// from its policy's (WithDriftThreshold) and the Engine planned again;
	// MeasuredPlans the policies planned on measured layer times;
	// TimedIterations the iterations whose timing events were read;
	// TimingErrors the device errors that left an iteration's times to the
	// estimator (each logged as a warning).
	DriftReplans, MeasuredPlans, TimedIterations, TimingErrors int
}

// HintStats count the host's hints (Engine.Evict, Engine.Prefetch).
type HintStats struct {
	// HintEvictions counts the tensors Evict moved off the device (copied
	// or, with a current host copy, released: in SwapsOut either way),
	// HintEvictedBytes their bytes. HintPrefetches counts the copies back
	// Prefetch started (in SwapsIn); HintDeferrals the prefetches that
	// found no free device memory at once and waited for some.
	HintEvictions, HintEvictedBytes, HintPrefetches, HintDeferrals int64
}

// RankStats count the exchanges of WithRank.
type RankStats struct {
	// With WithRank: AdoptedPolicies counts the policies rank 0 planned
	// that this rank adopted instead of planning, SharedPolicies those rank
	// 0 broadcast, RankFallbacks the exchanges after which this rank
	// planned on its own (rank 0 had no policy for its sequence, or the
	// broadcast failed or timed out).
	AdoptedPolicies, SharedPolicies, RankFallbacks int
}

// Stats returns the running totals.
func (e *Engine) Stats() Stats {
	defer e.rlock()()
	s := e.stats
	a := e.alloc.Stats()
	s.PeakDeviceBytes, s.DeviceBytes = a.PeakAllocated, a.Allocated
	s.Maps, s.Unmaps, s.HostWaits = a.Maps, a.Unmaps, a.HostWaits
	s.MappedPages = a.MappedPages
	s.Placed, s.Missed, s.Placements = a.Placed, a.Missed, a.Placements
	hs := e.pool.Stats()
	s.HostBytes, s.PeakHostBytes, s.HostAllocs = hs.Allocated, hs.PeakAllocated, hs.BackendAllocs
	return s
}

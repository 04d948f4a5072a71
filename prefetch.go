package chameleon

import (
	"errors"
	"slices"
)

// prefetchQueue holds the copies back that found no free device memory
// when they were due, in the order they came due, tried again at each op's
// Before: the policy's planned prefetches of the iteration under way
// (swap >= 0, dropped at End) and the host's Prefetch hints (swap -1,
// kept until started, used, evicted or released).
type prefetchQueue struct {
	items []prefetch
}

// prefetch is one waiting copy back.
type prefetch struct {
	t    *Tensor
	swap int32 // the policy's swap it is (policy.live), -1 for a hint
	// carried: not a hint but a copy back the policy of the iteration
	// before left due (Stats.Carried), dropped at End.
	carried bool
}

// add queues a copy back.
func (q *prefetchQueue) add(t *Tensor, swap int32) {
	q.items = append(q.items, prefetch{t: t, swap: swap})
}

// has reports whether t waits as a hint.
func (q *prefetchQueue) has(t *Tensor) bool {
	return slices.ContainsFunc(q.items, func(p prefetch) bool { return p.t == t && p.swap < 0 && !p.carried })
}

// waits reports whether t waits, as a hint, a carried copy back or a
// planned one.
func (q *prefetchQueue) waits(t *Tensor) bool {
	return slices.ContainsFunc(q.items, func(p prefetch) bool { return p.t == t })
}

// addCarried queues a carried copy back (prefetch.carried).
func (q *prefetchQueue) addCarried(t *Tensor) {
	q.items = append(q.items, prefetch{t: t, swap: -1, carried: true})
}

// forget drops t's waiting copies back.
func (q *prefetchQueue) forget(t *Tensor) {
	q.items = slices.DeleteFunc(q.items, func(p prefetch) bool { return p.t == t })
}

// endIteration drops the planned and carried copies back still waiting:
// the next iteration's policy plans its own.
func (q *prefetchQueue) endIteration() {
	q.items = slices.DeleteFunc(q.items, func(p prefetch) bool { return p.swap >= 0 || p.carried })
}

// retry starts each waiting copy back of the policy (planned) or of the
// host's hints (not planned) that fits now, in order, and forgets those no
// longer off the device; the others wait as they were. start says whether
// one was started; a planned copy's error stops the retry at once (the op
// fails), a hint's is returned with the rest kept queued.
func (q *prefetchQueue) retry(planned bool, start func(p prefetch) (bool, error)) error {
	kept := q.items[:0]
	var errs []error
	for i, p := range q.items {
		if (p.swap >= 0) != planned {
			kept = append(kept, p)
			continue
		}
		if p.t.released || p.t.state != swapped {
			continue
		}
		ok, err := start(p)
		if err != nil {
			kept = append(kept, q.items[i+1:]...)
			if p.swap >= 0 {
				clear(q.items[len(kept):])
				q.items = kept
				return err
			}
			// Still off the device: it comes back at its use.
			errs = append(errs, err)
			break
		}
		if !ok {
			kept = append(kept, p)
		}
	}
	clear(q.items[len(kept):])
	q.items = kept
	return errors.Join(errs...)
}

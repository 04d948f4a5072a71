package chameleon

import "fmt"

// The package's tests run every plan synchronously (WithSyncPlanning) so
// that a policy applies from the iteration after its profile whatever the
// machine's speed; async_test.go turns it off where planning off the step
// is what is tested.
func init() { syncByDefault = true }

// CheckOnDevice reports a tensor that holds device memory but is missing
// from the list forced evictions look in (Engine.onDevice), or a list entry
// out of place: the invariant gotDevice and leftDevice keep.
func (e *Engine) CheckOnDevice() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	for i, t := range e.onDevice {
		if !t.onDev || t.dslot != i {
			return fmt.Errorf("tensor %d: listed at %d with onDev %v, dslot %d", t.id, i, t.onDev, t.dslot)
		}
	}
	for _, t := range e.live {
		if t.state != swapped && t.state != dropped && !t.onDev {
			return fmt.Errorf("tensor %d (state %d) holds device memory but is not listed", t.id, t.state)
		}
	}
	return nil
}

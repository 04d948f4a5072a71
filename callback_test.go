package chameleon_test

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon"
)

// TestRecomputeCallbackCallsBack: an Op.Recompute callback that calls the
// Engine back is not deadlocked: a read (Stats) is served, a change
// (NewTensor, Release) is refused with ErrInCallback, and the loop goes on.
func TestRecomputeCallbackCallsBack(t *testing.T) {
	n := newClockNet(t, 8, 1<<20, 5<<20, 1e8, chameleon.WithLinkBandwidth(1e8)) // 100 MB/s: a recompute beats a swap
	var calls int
	var newErr, relErr error
	var seen chameleon.Stats
	n.recompute = func() error {
		calls++
		seen = n.eng.Stats()
		var x *chameleon.Tensor
		x, newErr = n.eng.NewTensor(1024, chameleon.Activation, "uint8", nil)
		if x != nil {
			relErr = n.eng.Release(x)
		}
		return nil
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 40 && calls == 0; i++ {
			n.step(t)
		}
		n.step(t)
	}()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("an Engine call from a recompute callback deadlocked")
	}
	require.Positive(t, calls, "no recompute ran")
	assert.ErrorIs(t, newErr, chameleon.ErrInCallback)
	assert.NoError(t, relErr)
	assert.Positive(t, seen.Iterations, "Stats served inside the callback")
	assert.Positive(t, n.eng.Stats().Recomputes)
	_, err := n.eng.NewTensor(1024, chameleon.Activation, "uint8", nil)
	assert.False(t, errors.Is(err, chameleon.ErrInCallback), "outside the callback, calls run")
}

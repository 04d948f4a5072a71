package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// The dynamic schedule switches pattern at every phase and brings every
// pattern back, so that a run of a few phases has policies to reuse.
func TestChooserSwitchesAndReturns(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3, 42} {
		c := newChooser(seed, 3, 12)
		var got []int
		for p := range 6 {
			for s := p * 12; s < (p+1)*12; s++ {
				assert.Equal(t, c(p*12), c(s), "seed %d: one pattern per phase", seed)
			}
			got = append(got, c(p*12))
		}
		assert.Equal(t, 0, got[0], "seed %d: pattern 0 first", seed)
		for p := 1; p < len(got); p++ {
			assert.NotEqual(t, got[p-1], got[p], "seed %d: phase %d switches", seed, p)
		}
		assert.ElementsMatch(t, []int{0, 1, 2}, got[:3], "seed %d: every pattern in the first three phases", seed)
		assert.Equal(t, got[:3], got[3:], "seed %d: and again", seed)
	}
}

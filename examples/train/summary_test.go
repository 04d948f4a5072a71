package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// A limited step faster than the baseline is called noise, not a
// speed-up, with the baseline's spread; a slower one gets no note.
func TestFasterNote(t *testing.T) {
	steps := func(ms ...float64) []Step {
		var s []Step
		for _, m := range ms {
			s = append(s, Step{Time: time.Duration(m * float64(time.Millisecond))})
		}
		return s
	}
	timed := steps(10, 12)
	assert.Empty(t, fasterNote(timed, 11, 11.5), "slower: no note")
	assert.Empty(t, fasterNote(timed, 11, 11), "equal: no note")
	assert.Empty(t, fasterNote(nil, 11, 5), "no timed steps: nothing to say")
	assert.Equal(t, " (within the spread of the baseline's 2 timed steps, 10.00 to 12.00 ms: noise, not a speed-up; --baseline-steps for a steadier baseline)",
		fasterNote(timed, 11, 10.5))
	n := fasterNote(timed, 11, 5.8) // the -47.1% a 3-step baseline printed
	assert.Contains(t, n, "faster than each of the baseline's 2 timed steps, 10.00 to 12.00 ms")
	assert.Contains(t, n, "not a speed-up")
	assert.Contains(t, fasterNote(steps(10), 10.5, 9), "1 timed step,")
}

package chameleon_test

import (
	"bytes"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon"
	"github.com/chameleon-go/chameleon/mre"
	"github.com/chameleon-go/chameleon/seq"
)

// gatedPlanner is the default planner, held at its first call after arm
// until open: a plan in flight for as long as a test wants.
type gatedPlanner struct {
	armed   atomic.Bool
	entered chan struct{}
	gate    chan struct{}
}

func newGatedPlanner() *gatedPlanner {
	return &gatedPlanner{entered: make(chan struct{}, 1), gate: make(chan struct{})}
}

func (g *gatedPlanner) Plan(in mre.Input, opts ...mre.Option) (*mre.Policy, error) {
	if g.armed.CompareAndSwap(true, false) {
		g.entered <- struct{}{}
		<-g.gate
	}
	return mre.Plan(in, opts...)
}

// inFlight reports whether the gated plan has started.
func (g *gatedPlanner) inFlight() bool {
	select {
	case <-g.entered:
		return true
	default:
		return false
	}
}

// TestPlanningOffTheStep: a loop keeps running STABLE iterations under its
// policy while the plan of a new sequence is in flight on the Engine's
// worker (End never waits for it), and the new policy is taken at the end
// of the first iteration after it is ready, in force from the next one.
func TestPlanningOffTheStep(t *testing.T) {
	g := newGatedPlanner()
	n := newClockNet(t, 8, 1<<20, 5<<20, 4e9, chameleon.WithSyncPlanning(false), chameleon.WithPlanner(g))
	stable := func(what string) chameleon.Result {
		t.Helper()
		for range 40 {
			r, _ := n.step(t)
			if r.Stage == seq.Stable && r.Matched > 0 && r.Evictions == 0 {
				return r
			}
		}
		t.Fatalf("%s: no STABLE iteration under a policy in 40 steps", what)
		return chameleon.Result{}
	}
	stable("sequence A")
	planned := n.eng.Stats().Replans

	// Sequence B, its plan held on the worker.
	g.armed.Store(true)
	n.layers = 6
	started := false
	for i := 0; i < 20 && !started; i++ {
		n.step(t)
		started = g.inFlight()
	}
	if !started {
		// Asked for, the plan starts when the worker gets to it, which
		// on a loaded machine can be after the steps above.
		select {
		case <-g.entered:
			started = true
		case <-time.After(time.Minute):
		}
	}
	require.True(t, started, "no plan of B started")

	// Back to A while B's plan is in flight: each End returns at once.
	n.layers = 8
	done := make(chan []chameleon.Result)
	go func() {
		var rs []chameleon.Result
		for range 6 {
			r, _ := n.step(t)
			rs = append(rs, r)
		}
		done <- rs
	}()
	var rs []chameleon.Result
	select {
	case rs = <-done:
	case <-time.After(time.Minute):
		close(g.gate)
		t.Fatal("End waited for the plan in flight")
	}
	for _, r := range rs[2:] {
		assert.Equal(t, seq.Stable, r.Stage, "iteration %d", r.Index)
		assert.Positive(t, r.Matched, "iteration %d runs A's policy", r.Index)
		assert.Zero(t, r.Evictions, "iteration %d", r.Index)
		assert.False(t, r.Planned, "iteration %d: B's plan is still held", r.Index)
	}
	assert.Equal(t, planned, n.eng.Stats().Replans, "B's plan has not landed")

	// B's plan lands at the first End after it is ready, and B adopts it.
	close(g.gate)
	n.layers = 6
	var landed chameleon.Result
	for range 400 {
		r, _ := n.step(t)
		if r.Planned {
			landed = r
			break
		}
		time.Sleep(time.Millisecond)
	}
	require.True(t, landed.Planned, "B's plan never landed")
	assert.Equal(t, planned+1, n.eng.Stats().Replans)
	r := stable("sequence B after its plan landed")
	assert.Equal(t, 12, r.Ops)
}

// TestCloseCancelsPlanInFlight: Close returns while a plan is held on the
// worker once it is let go, and leaks no goroutine (TestMain checks).
func TestCloseCancelsPlanInFlight(t *testing.T) {
	g := newGatedPlanner()
	g.armed.Store(true)
	n := newClockNet(t, 8, 1<<20, 5<<20, 4e9, chameleon.WithSyncPlanning(false), chameleon.WithPlanner(g))
	for i := 0; i < 20 && !g.inFlight(); i++ {
		n.step(t)
	}
	go func() {
		time.Sleep(10 * time.Millisecond)
		close(g.gate)
	}()
	require.NoError(t, n.eng.Close())
	r := n.eng.Begin().End()
	assert.ErrorIs(t, r.Err, chameleon.ErrClosed)
}

// BenchmarkEnd is the host time End takes per iteration of a 16-op loop
// running its policy STABLE (target: under 50 µs), idle and while the plan
// of another sequence is held in flight on the worker: planning off the
// step adds nothing to End but a look at whether the plan is ready.
func BenchmarkEnd(b *testing.B) {
	for _, held := range []bool{false, true} {
		name := "idle"
		if held {
			name = "plan-in-flight"
		}
		b.Run(name, func(b *testing.B) {
			g := newGatedPlanner()
			defer close(g.gate)
			n := newClockNet(b, 8, 64<<10, 5*64<<10, 4e9, chameleon.WithSyncPlanning(false), chameleon.WithPlanner(g), chameleon.WithMinSwapBytes(1))
			toStable := func() {
				for range 40 {
					if r, _ := n.step(b); r.Stage == seq.Stable && r.Matched > 0 {
						return
					}
				}
				b.Fatal("no STABLE iteration in 40 steps")
			}
			toStable()
			if held {
				g.armed.Store(true)
				n.layers = 6
				for i := 0; i < 20 && !g.inFlight(); i++ {
					n.step(b)
				}
				n.layers = 8
				toStable()
			}
			var took time.Duration
			steps := 0
			b.ReportAllocs()
			for b.Loop() {
				n.step(b)
				took += n.endTook
				steps++
			}
			b.ReportMetric(float64(took.Nanoseconds())/float64(steps)/1e3, "us/End")
		})
	}
}

// TestSaveWaitsForPlanInFlight: saving the policies between iterations
// waits for the plan in flight, so that the file holds it.
func TestSaveWaitsForPlanInFlight(t *testing.T) {
	g := newGatedPlanner()
	n := newClockNet(t, 8, 1<<20, 5<<20, 4e9, chameleon.WithSyncPlanning(false), chameleon.WithPlanner(g))
	g.armed.Store(true)
	for i := 0; i < 20 && !g.inFlight(); i++ {
		n.step(t)
	}
	require.Zero(t, n.eng.CachedPolicies(), "the plan is held")
	go func() {
		time.Sleep(20 * time.Millisecond)
		close(g.gate)
	}()
	var b bytes.Buffer
	require.NoError(t, n.eng.SavePolicies(&b))
	assert.Equal(t, 1, n.eng.CachedPolicies())
	assert.Contains(t, b.String(), `"swaps":[{`, "the saved file holds the plan")
}

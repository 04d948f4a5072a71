package chameleon_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon"
	"github.com/chameleon-go/chameleon/device/host"
	"github.com/chameleon-go/chameleon/internal/testtraces"
	"github.com/chameleon-go/chameleon/mre"
	"github.com/chameleon-go/chameleon/plan"
	"github.com/chameleon-go/chameleon/replay"
	"github.com/chameleon-go/chameleon/seq"
	"github.com/chameleon-go/chameleon/trace"
)

// rankRun is what one rank of runRanks did.
type rankRun struct {
	rep   *replay.Report
	stats chameleon.Stats
	err   error
}

// runRanks replays trs[i] (scaled by scale) on rank i of len(trs) ranks,
// each on its own host device at limit bytes, concurrently, exchanging
// policies over an in-process channel; opts(i) are rank i's extra options.
// A rank for which trs[i] is nil does not run (its end stays open, unused).
func runRanks(t *testing.T, trs []*trace.Trace, scale, limit int64, rounds int, opts func(rank int) []chameleon.Option) []rankRun {
	t.Helper()
	n := len(trs)
	ends := chameleon.NewLocalChannel(n)
	out := make([]rankRun, n)
	var wg sync.WaitGroup
	for i := range n {
		if trs[i] == nil {
			continue
		}
		wg.Go(func() {
			dev, err := host.New(limit)
			if err != nil {
				out[i].err = err
				return
			}
			defer dev.Close()
			o := []chameleon.Option{chameleon.WithDetection(quick()), chameleon.WithRank(i, n, ends[i]), chameleon.WithRankTimeout(time.Minute)}
			if opts != nil {
				o = append(o, opts(i)...)
			}
			rep, err := replay.Run(trs[i], dev, replay.Config{Scale: scale, Rounds: rounds, Limit: limit, Options: o})
			if rep != nil && rep.Engine != nil {
				out[i].stats = rep.Engine.Stats()
				rep.Engine.Close()
			}
			out[i].rep, out[i].err = rep, err
			if err == nil && dev.PeakAllocated() > limit {
				out[i].err = fmt.Errorf("rank %d: device peak %d above the limit %d", i, dev.PeakAllocated(), limit)
			}
		})
	}
	wg.Wait()
	for i := range n {
		if trs[i] != nil {
			require.NoError(t, out[i].err, "rank %d", i)
			assert.Zero(t, out[i].rep.FailedUses, "rank %d: %v", i, out[i].rep.Failures)
			assert.Positive(t, out[i].rep.VerifiedUses, "rank %d", i)
		}
	}
	return out
}

// raceRanks is n, or 2 under the race detector, where each rank's replay
// is ten times slower.
func raceRanks(n int) int {
	if policyRace {
		return 2
	}
	return n
}

func same(tr *trace.Trace, n int) []*trace.Trace {
	trs := make([]*trace.Trace, n)
	for i := range trs {
		trs[i] = tr
	}
	return trs
}

// relabel is a copy of tr whose ops are changed by f (the tensors are
// shared: replay reads them only).
func relabel(tr *trace.Trace, f func(op *trace.Op)) *trace.Trace {
	c := *tr
	c.Iterations = make([]*trace.Iteration, len(tr.Iterations))
	for k, it := range tr.Iterations {
		ci := *it
		ci.Ops = slices.Clone(it.Ops)
		for i := range ci.Ops {
			f(&ci.Ops[i])
		}
		c.Iterations[k] = &ci
	}
	return &c
}

func sumStats(runs []rankRun, f func(chameleon.Stats) int) int {
	n := 0
	for _, r := range runs {
		n += f(r.stats)
	}
	return n
}

// TestRanksPlanOnce: four ranks running the same trace plan it once: rank
// 0 profiles and plans, the other three adopt its policy at the same
// iteration, every rank runs the same stages and the same swaps per
// iteration, and every byte read back is the byte written.
func TestRanksPlanOnce(t *testing.T) {
	tr := testtraces.Read(t, testtraces.Small)
	const scale = 1024
	limit := replay.PeakBytes(tr) / scale * 85 / 100
	runs := runRanks(t, same(tr, 4), scale, limit, 2, nil)

	assert.Equal(t, 1, sumStats(runs, func(s chameleon.Stats) int { return s.Replans }), "one plan over all ranks")
	assert.Equal(t, 1, runs[0].stats.Replans)
	assert.Equal(t, 1, runs[0].stats.SharedPolicies)
	assert.Zero(t, runs[0].stats.AdoptedPolicies)
	wantSwaps, _ := stable(runs[0].rep)
	require.NotEmpty(t, wantSwaps)
	require.Positive(t, slices.Max(wantSwaps))
	for i, r := range runs[1:] {
		rank := i + 1
		assert.Zero(t, r.stats.Replans, "rank %d plans nothing", rank)
		assert.Equal(t, 1, r.stats.AdoptedPolicies, "rank %d adopts", rank)
		assert.Zero(t, r.stats.RankFallbacks, "rank %d", rank)
		assert.Zero(t, r.stats.StaleDrops, "rank %d: the adopted policy matches", rank)
		assert.Equal(t, runs[0].rep.Stages, r.rep.Stages, "rank %d runs rank 0's stages", rank)
		assert.Equal(t, seq.Stable.String(), r.rep.Stages[len(r.rep.Stages)-1], "rank %d", rank)
		gotSwaps, _ := stable(r.rep)
		assert.Equal(t, wantSwaps, gotSwaps, "rank %d swaps as rank 0", rank)
		adopted := slices.IndexFunc(r.rep.Results, func(x chameleon.Result) bool { return x.Adopted })
		planned := slices.IndexFunc(runs[0].rep.Results, func(x chameleon.Result) bool { return x.Planned })
		assert.Equal(t, planned, adopted, "rank %d adopts at the iteration rank 0 planned", rank)
	}
	for i, r := range runs {
		t.Logf("rank %d: stages %v, replans %d, adopted %d, shared %d, stable swaps per iteration %v, verified %d uses",
			i, r.rep.Stages, r.stats.Replans, r.stats.AdoptedPolicies, r.stats.SharedPolicies, func() []int64 { s, _ := stable(r.rep); return s }(), r.rep.VerifiedUses)
	}
}

// TestRanksRankZeroFindsNone: when rank 0's planning finds no policy, it
// broadcasts that it has none and every other rank plans on its own at
// once, without waiting its timeout.
func TestRanksRankZeroFindsNone(t *testing.T) {
	tr := testtraces.Read(t, testtraces.Small)
	const scale = 1024
	limit := replay.PeakBytes(tr) / scale * 85 / 100
	refuse := plan.PlannerFunc(func(mre.Input, ...mre.Option) (*mre.Policy, error) {
		return nil, fmt.Errorf("refused: %w", mre.ErrInfeasible)
	})
	start := time.Now()
	runs := runRanks(t, same(tr, raceRanks(4)), scale, limit, 2, func(rank int) []chameleon.Option {
		o := []chameleon.Option{chameleon.WithRankTimeout(time.Minute)}
		if rank == 0 {
			o = append(o, chameleon.WithPlanner(refuse))
		}
		return o
	})
	assert.Less(t, time.Since(start), 50*time.Second, "no rank waited its timeout")
	assert.Equal(t, 1, runs[0].stats.Infeasible)
	assert.Zero(t, runs[0].stats.SharedPolicies)
	for i, r := range runs[1:] {
		assert.Equal(t, 1, r.stats.Replans, "rank %d plans on its own", i+1)
		assert.Equal(t, 1, r.stats.RankFallbacks, "rank %d", i+1)
		assert.Zero(t, r.stats.AdoptedPolicies, "rank %d", i+1)
		assert.Equal(t, seq.Stable.String(), r.rep.Stages[len(r.rep.Stages)-1], "rank %d", i+1)
	}
}

// TestRanksRankZeroAbsent: ranks whose rank 0 never broadcasts (it
// failed before its first plan) wait their timeout once, plan on their
// own, and exchange no more; when the host closes the channel they do not
// wait at all.
func TestRanksRankZeroAbsent(t *testing.T) {
	tr := testtraces.Read(t, testtraces.Small)
	const scale = 1024
	limit := replay.PeakBytes(tr) / scale * 85 / 100
	trs := same(tr, 3)
	trs[0] = nil
	runs := runRanks(t, trs, scale, limit, 2, func(int) []chameleon.Option {
		return []chameleon.Option{chameleon.WithRankTimeout(100 * time.Millisecond)}
	})
	for _, r := range runs[1:] {
		assert.Equal(t, 1, r.stats.Replans)
		assert.Equal(t, 1, r.stats.RankFallbacks)
		assert.Equal(t, seq.Stable.String(), r.rep.Stages[len(r.rep.Stages)-1])
	}

	// A channel that fails: rank 0 plans and keeps running, another rank
	// plans on its own.
	for rank := range 2 {
		dev, err := host.New(limit)
		require.NoError(t, err)
		rep, err := replay.Run(tr, dev, replay.Config{Scale: scale, Rounds: 2, Limit: limit,
			Options: []chameleon.Option{chameleon.WithDetection(quick()), chameleon.WithRank(rank, 2, errChannel{})}})
		require.NoError(t, err)
		s := rep.Engine.Stats()
		require.NoError(t, rep.Engine.Close())
		require.NoError(t, dev.Close())
		assert.Zero(t, rep.FailedUses)
		assert.Equal(t, 1, s.Replans, "rank %d", rank)
		assert.Zero(t, s.SharedPolicies+s.AdoptedPolicies, "rank %d", rank)
		assert.Equal(t, rank, s.RankFallbacks, "rank %d", rank)
	}

	ends := chameleon.NewLocalChannel(2)
	require.NoError(t, ends[0].Close())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := ends[1].Broadcast(ctx, nil)
	assert.ErrorIs(t, err, chameleon.ErrChannelClosed)
	_, err = ends[0].Broadcast(ctx, []byte("x"))
	assert.ErrorIs(t, err, chameleon.ErrChannelClosed)
}

// TestRanksDifferentSequence: a rank whose iterations differ from rank
// 0's plans on its own: with other op names (another sequence) it sees
// that rank 0's policy is not for its sequence; with the same op names
// from other call sites it adopts the policy, finds that its tensors do
// not match (the stale check) and plans again from its own profile. The
// other ranks adopt as usual.
func TestRanksDifferentSequence(t *testing.T) {
	tr := testtraces.Read(t, testtraces.Small)
	const scale = 1024
	limit := replay.PeakBytes(tr) / scale * 85 / 100
	for _, c := range []struct {
		name    string
		f       func(op *trace.Op)
		adopted int
	}{
		{"other ops", func(op *trace.Op) { op.Name += ".other" }, 0},
		{"other call sites", func(op *trace.Op) { op.Module = "other." + op.Module }, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			trs := same(tr, 3)
			trs[2] = relabel(tr, c.f)
			runs := runRanks(t, trs, scale, limit, 2, nil)
			assert.Equal(t, 1, runs[1].stats.AdoptedPolicies)
			assert.Zero(t, runs[1].stats.Replans)
			d := runs[2].stats
			assert.Equal(t, c.adopted, d.AdoptedPolicies)
			assert.Equal(t, 1, d.Replans, "the differing rank plans on its own")
			if c.adopted > 0 {
				assert.Equal(t, 1, d.StaleDrops, "the adopted policy is found stale")
				assert.Zero(t, d.RankFallbacks)
			} else {
				assert.Equal(t, 1, d.RankFallbacks)
			}
			assert.Equal(t, seq.Stable.String(), runs[2].rep.Stages[len(runs[2].rep.Stages)-1])
			last := runs[2].rep.Results[len(runs[2].rep.Results)-1]
			assert.Positive(t, last.SwapsOut, "its own policy swaps")
			t.Logf("%s: differing rank stages %v, adopted %d, stale %d, fallbacks %d, replans %d, swaps %v",
				c.name, runs[2].rep.Stages, d.AdoptedPolicies, d.StaleDrops, d.RankFallbacks, d.Replans, func() []int64 { s, _ := stable(runs[2].rep); return s }())
		})
	}
}

// planHostPeak is the pinned memory the policy rank 0 planned holds at
// once (plan.HostPeak over the profile it was planned from), with the
// tier of the limit it met.
func planHostPeak(t *testing.T, rep *replay.Report) (peak, tier int64) {
	t.Helper()
	for _, r := range rep.Results {
		if r.Plan != nil && r.Plan.Policy != nil {
			return plan.HostPeak(r.Plan.Model.Iter, r.Plan.Swaps()), r.Plan.Planned
		}
	}
	t.Fatal("no plan")
	return 0, 0
}

// TestRanksShareHostBudget: ranks of one node share its pinned memory.
// With a share below what the unconstrained plan holds at once, rank 0
// plans again, within the share; the others adopt
// that policy; no rank pins more than its share, and every byte comes
// back. A rank with a smaller share than rank 0's fits the policy it
// adopts to its own.
func TestRanksShareHostBudget(t *testing.T) {
	tr := testtraces.Read(t, testtraces.Small)
	const scale = 1024
	limit := replay.PeakBytes(tr) / scale * 85 / 100
	free := runRanks(t, same(tr, 1), scale, limit, 2, nil)
	freePeak, freeTier := planHostPeak(t, free[0].rep)
	require.Positive(t, freePeak)
	ranks := raceRanks(4)
	share := freePeak &^ 511 // the plan may fill 90% of it: the free plan does not fit
	runs := runRanks(t, same(tr, ranks), scale, limit, 2, func(int) []chameleon.Option {
		return []chameleon.Option{chameleon.WithHostBudget(share*int64(ranks), ranks)}
	})
	assert.Equal(t, 1, sumStats(runs, func(s chameleon.Stats) int { return s.Replans }))
	peak, tier := planHostPeak(t, runs[0].rep)
	assert.LessOrEqual(t, peak, share*9/10, "the plan holds at most 90%% of the share at once")
	want, _ := stable(runs[0].rep)
	for i, r := range runs {
		assert.LessOrEqual(t, r.stats.PeakHostBytes, share, "rank %d pins within its share", i)
		assert.Positive(t, r.stats.PeakHostBytes, "rank %d swaps", i)
		assert.Equal(t, seq.Stable.String(), r.rep.Stages[len(r.rep.Stages)-1], "rank %d", i)
		got, _ := stable(r.rep)
		assert.Equal(t, want, got, "rank %d", i)
		if i > 0 {
			assert.Equal(t, 1, r.stats.AdoptedPolicies, "rank %d", i)
		}
	}
	peaks := make([]int64, ranks)
	for i, r := range runs {
		peaks[i] = r.stats.PeakHostBytes
	}
	t.Logf("unconstrained plan: %d bytes pinned at once at tier %d; share %d: plan %d bytes at tier %d, stable swaps %v; peak pinned per rank %v",
		freePeak, freeTier, share, peak, tier, want, peaks)

	// Rank 1 has a smaller share than rank 0 (no budget): the policy it
	// adopts is updated to its share.
	small := runRanks(t, same(tr, 2), scale, limit, 2, func(rank int) []chameleon.Option {
		if rank == 1 {
			return []chameleon.Option{chameleon.WithHostBudget(share, 1)}
		}
		return nil
	})
	s := small[1].stats
	assert.Equal(t, 1, s.AdoptedPolicies)
	assert.Equal(t, 1, s.PolicyUpdates+s.Replans, "the adopted policy is fitted to the share")
	assert.LessOrEqual(t, s.PeakHostBytes, share)
	got, _ := stable(small[1].rep)
	t.Logf("rank 1 with a share of %d under rank 0 without: updates %d, replans %d, stable swaps %v (rank 0: %v)",
		share, s.PolicyUpdates, s.Replans, got, func() []int64 { x, _ := stable(small[0].rep); return x }())

	dev, err := host.New(1 << 20)
	require.NoError(t, err)
	defer dev.Close()
	for _, o := range [][]chameleon.Option{
		{chameleon.WithHostBudget(0, 2)}, {chameleon.WithHostBudget(1<<20, 0)}, {chameleon.WithHostBudget(1000, 4)},
		{chameleon.WithHostBudget(1<<20, 2), chameleon.WithHostReserve(1 << 20)},
		{chameleon.WithRank(2, 2, chameleon.NewLocalChannel(2)[0])}, {chameleon.WithRank(0, 2, nil)}, {chameleon.WithRankTimeout(-1)},
	} {
		_, err := chameleon.New(dev, append([]chameleon.Option{chameleon.WithMemoryLimit(1 << 20)}, o...)...)
		assert.Error(t, err)
	}
}

// errChannel fails every broadcast.
type errChannel struct{}

func (errChannel) Broadcast(context.Context, []byte) ([]byte, error) {
	return nil, errors.New("link down")
}

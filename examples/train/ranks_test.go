package main

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/device/cuda"
	"github.com/chameleon-go/chameleon/device/cuda/nccl"
	"github.com/chameleon-go/chameleon/examples/train/compute"
)

// smallArgs is small(t)'s model on the command line, at a global batch.
func smallArgs(batch int) []string {
	return []string{"--layers", "6", "--width", "32", "--ffn", "32", "--in", "16", "--out", "8", "--teacher", "32",
		"--batch", strconv.Itoa(batch), "--seed", "7", "--min-swap", "4KiB", "--lr", "0.02"}
}

// runCommand parses args and runs them as the command does, returning its
// outcome and what it printed.
func runCommand(t *testing.T, args ...string) (*outcome, string) {
	t.Helper()
	var out, errb bytes.Buffer
	o, err := parse(args, &errb)
	require.NoError(t, err, errb.String())
	res, err := train(o, &out)
	require.NoError(t, err, out.String())
	return res, out.String()
}

// TestRanksHost is --ranks N on the host backend end to end, with the
// in-process policy channel: every rank reports the same losses, bit for
// bit; under half a rank's unlimited peak each rank swaps and holds the
// limit, and repeats its unlimited run's losses bit for bit (--verify);
// the losses are within RankTolerance of one device's at the same global
// batch; rank 0 plans and shares its policy, the others adopt it; and
// each rank's pinned memory stays within its share of --host-budget.
func TestRanksHost(t *testing.T) {
	for _, n := range []int{2, 3} {
		t.Run(fmt.Sprintf("ranks=%d", n), func(t *testing.T) {
			const share = 2 << 20
			args := append(smallArgs(384), "--ranks", strconv.Itoa(n), "--steps", "16", "--sync-planning", "--verify", "--quiet",
				"--host-budget", strconv.Itoa(n*share)+"B", "--rank-timeout", "1m")
			res, out := runCommand(t, args...)
			require.Len(t, res.Base, n)
			require.Len(t, res.Limited, n)
			require.NotNil(t, res.Ref)
			assert.Equal(t, "local", res.Channel)
			assert.Equal(t, 384/n, res.Model.Batch)

			c := res.check()
			assert.True(t, c.Agree, "rank %d's losses differ from rank 0's at step %d", c.Rank, c.Step)
			assert.True(t, c.Verified, "rank %d's limited run differs from its unlimited run at step %d", c.VerifyRank, c.VerifyStep)
			assert.True(t, c.WithinLimit)
			assert.True(t, c.Adopted)
			assert.LessOrEqual(t, c.RefDiff, RankTolerance, "ranks %v\none device %v", res.Limited[0].Losses(), res.Ref.Losses())
			l0 := res.Limited[0].Losses()
			for r, rep := range res.Limited {
				requireSameBits(t, l0, rep.Losses())
				requireSameBits(t, res.Base[r].Losses(), rep.Losses())
				st := rep.Stats
				assert.LessOrEqual(t, st.PeakDeviceBytes, res.Limit, "rank %d over the limit", r)
				assert.Positive(t, st.SwappedOutBytes, "rank %d: half the peak must force swaps", r)
				assert.LessOrEqual(t, st.PeakHostBytes, int64(share), "rank %d: pinned memory over its share", r)
				assert.Zero(t, st.RankFallbacks, "rank %d planned on its own", r)
				if r == 0 {
					assert.Positive(t, st.Replans, "rank 0 plans")
					assert.Positive(t, st.SharedPolicies, "rank 0 shares what it planned")
				} else {
					assert.Positive(t, st.AdoptedPolicies, "rank %d adopts rank 0's policy", r)
					assert.Zero(t, st.Replans, "rank %d plans nothing of its own", r)
				}
			}
			assert.Less(t, mean(l0[len(l0)-3:]), 0.7*mean(l0[:3]), "the loss must fall: %v", l0)
			for _, want := range []string{"identical on every rank, bit for bit", "every other rank adopted",
				"bitwise that of its unlimited run", "the tolerance 1e-04", "within the limit"} {
				assert.Contains(t, out, want)
			}
			assert.NotContains(t, out, "OUTSIDE")
			assert.NotContains(t, out, "OVER THE LIMIT")
			t.Logf("%d ranks: largest relative difference from one device %.3g; limit %d, peaks %d", n, c.RefDiff, res.Limit, res.Limited[n-1].Stats.PeakDeviceBytes)
		})
	}
}

// TestOneRankIsOneDevice: the rank machinery with one rank (--rank-channel
// local --ranks 1) trains exactly as one device does: the all-reduce of
// one rank is the identity.
func TestOneRankIsOneDevice(t *testing.T) {
	res, _ := runCommand(t, append(smallArgs(256), "--rank-channel", "local", "--steps", "8", "--limit", "none", "--verify", "--quiet")...)
	require.NotNil(t, res.Ref)
	requireSameBits(t, res.Ref.Losses(), res.Base[0].Losses())
}

// The all-reduce of the host backend: each rank gets the mean, summed in
// rank order, the same bits on every rank, for lengths that do not split
// evenly over the ranks.
func TestHostGroupAverages(t *testing.T) {
	for _, n := range []int{1, 2, 3, 4} {
		for _, size := range []int{1, 2, 7, 1000} {
			g := newHostGroup(n)
			bufs := make([][]float32, n)
			want := make([]float32, size)
			for r := range bufs {
				bufs[r] = make([]float32, size)
				for i := range bufs[r] {
					bufs[r][i] = compute.UniformAt(uint64(r), uint64(i), 3)
				}
			}
			for i := range want {
				var s float32
				for r := range bufs {
					s += bufs[r][i]
				}
				want[i] = s / float32(n)
			}
			var wg sync.WaitGroup
			errs := make([]error, n)
			for r := range n {
				wg.Go(func() {
					for range 3 { // the group is reused: the mean of equal buffers is itself
						if errs[r] = g.reduce(r, bufs[r]); errs[r] != nil {
							return
						}
					}
				})
			}
			wg.Wait()
			require.NoError(t, errors.Join(errs...))
			for r := range bufs {
				for i := range want {
					if n == 1 {
						break
					}
					require.Equal(t, math.Float32bits(want[i]), math.Float32bits(bufs[r][i]), "ranks %d, size %d, rank %d, element %d", n, size, r, i)
				}
			}
		}
	}
}

// A rank that fails releases the others from the all-reduce they wait in:
// TrainRanks returns the failure, not a hang, and names the rank.
func TestRanksFailureReleases(t *testing.T) {
	const n = 3
	cfg := small(t)
	cfg.Steps = 4
	cfg.Batch /= n
	cfg.Limit = cfg.UpperBoundBytes()
	g := newHostGroup(n)
	ranks := make([]Rank, n)
	for r := range ranks {
		d := newHost(t)
		ranks[r] = Rank{Dev: d, Kernels: hostKernels(d), Reduce: g.reducer(r, d)}
	}
	ranks[1].Kernels = func(device.Stream) (compute.Kernels, error) { return nil, errors.New("no kernels here") }
	done := make(chan struct{})
	var err error
	go func() {
		defer close(done)
		_, err = TrainRanks(ranks, cfg, g.abort)
	}()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("the ranks still wait for the one that failed")
	}
	require.Error(t, err)
	assert.Contains(t, err.Error(), "rank 1: no kernels here")
	assert.NotContains(t, err.Error(), "rank 0", "a rank only released is not a failure of its own")
}

// shardSeed moves Uniform's counter: a rank's rows are the global batch's.
func TestShardSeed(t *testing.T) {
	const rows, cols = 12, 5
	global := make([]float32, rows*cols)
	compute.UniformRef(global, 99, 1.5)
	for _, ranks := range []int{1, 2, 3, 4} {
		per := rows / ranks
		for r := range ranks {
			shard := make([]float32, per*cols)
			compute.UniformRef(shard, shardSeed(99, uint64(r*per*cols)), 1.5)
			assert.Equal(t, global[r*per*cols:(r+1)*per*cols], shard, "rank %d of %d", r, ranks)
		}
	}
}

// TestRealCUDARanksNCCL is the documented GPU command's path, scaled down:
// --device cuda --rank-channel nccl, one rank per GPU, the gradients
// averaged with ncclAllReduce. It runs only with CHAMELEON_CUDART set and
// libnccl found (CHAMELEON_NCCL or the places nccl.Open searches);
// CHAMELEON_TRAIN_RANKS sets the ranks (default 1, one GPU):
//
//	CGO_ENABLED=0 go test -c -o traintest ./examples/train
//	CHAMELEON_CUDART=/usr/local/cuda/lib64/libcudart.so.13 ./traintest -test.run RealCUDARanks -test.v
func TestRealCUDARanksNCCL(t *testing.T) {
	if os.Getenv(cuda.EnvLibrary) == "" {
		t.Skipf("set %s to libcudart to run on a GPU", cuda.EnvLibrary)
	}
	if _, err := nccl.Open(); err != nil {
		t.Skipf("no libnccl to average the gradients with (set CHAMELEON_NCCL): %v", err)
	}
	n := 1
	if s := os.Getenv("CHAMELEON_TRAIN_RANKS"); s != "" {
		var err error
		n, err = strconv.Atoi(s)
		require.NoError(t, err)
	}
	res, out := runCommand(t, "--device", "cuda", "--ranks", strconv.Itoa(n), "--rank-channel", "nccl",
		"--layers", "8", "--width", "512", "--batch", strconv.Itoa(8192*n), "--limit", "50%", "--steps", "12", "--verify", "--quiet")
	t.Log(out)
	c := res.check()
	assert.True(t, c.Agree)
	assert.True(t, c.Verified)
	assert.True(t, c.WithinLimit)
	assert.LessOrEqual(t, c.RefDiff, RankTolerance)
	if n > 1 {
		assert.True(t, c.Adopted)
	}
}

// TestRanksHoist: with two ranks, each gradient all-reduced and its
// parameter stepped in the backward (--hoist) learns the bits the step at
// the end learns, on every rank, under half a rank's peak.
func TestRanksHoist(t *testing.T) {
	args := append(smallArgs(384), "--ranks", "2", "--steps", "12", "--sync-planning", "--verify", "--quiet", "--rank-timeout", "1m")
	end, _ := runCommand(t, args...)
	hoisted, _ := runCommand(t, append(args, "--hoist")...)
	c := hoisted.check()
	assert.True(t, c.Agree, "rank %d's losses differ from rank 0's at step %d", c.Rank, c.Step)
	assert.True(t, c.Verified, "rank %d's limited run differs from its unlimited run at step %d", c.VerifyRank, c.VerifyStep)
	assert.True(t, c.WithinLimit)
	require.Len(t, hoisted.Limited, 2)
	for r, rep := range hoisted.Limited {
		requireSameBits(t, end.Limited[r].Losses(), rep.Losses())
		assert.Positive(t, rep.Stats.SwappedOutBytes, "rank %d: half the peak must force swaps", r)
	}
}

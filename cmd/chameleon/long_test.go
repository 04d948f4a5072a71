//go:build longreplay

package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestLongReplaysRunAsPlanned replays, timed on the host backend, the deep
// cuts the H200 ran slower than planned before the layout was part of the
// plan: llama16-bf16 at 45% of its peak and GPT-2 XL's width at its
// activation-checkpointing peak (both with recompute, the default), and
// GPT-2 XL's width at 80% swap-only. The scale keeps the GPU's
// proportions: the host's pages are CUDA's page for the full-size limit
// divided by the scale (replay.PageAtScale), and the link is the H200's
// divided by it too, so copies take the time they take on the GPU. Every
// STABLE iteration must be placed, with no forced eviction and no
// on-demand swap-in; no time is asserted (the host is shared and noisy).
// It runs in CI's long step (go test -tags longreplay).
func TestLongReplaysRunAsPlanned(t *testing.T) {
	if raceEnabled {
		t.Skip("timed replays under the race detector measure the detector")
	}
	for _, c := range []struct {
		trace, limit string
		scale        int
		flags        []string
	}{
		{filepath.Join(publicDir, "llama16-bf16"), "45%", 256, nil},
		{"../../testdata/gpt2-xl-24l", "7.36GiB", 256, nil},
		{"../../testdata/gpt2-xl-24l", "80%", 256, []string{"--recompute=false"}},
	} {
		name := filepath.Base(c.trace) + "@" + c.limit
		t.Run(name, func(t *testing.T) {
			if _, err := os.Stat(c.trace + ".jsonl.gz"); err != nil {
				t.Skipf("%s absent", c.trace)
			}
			args := append([]string{"replay", "--timing", "--quiet", "--json", "--trace", c.trace + ".jsonl.gz",
				"--kernels", c.trace + ".kernels.json.gz", "--limit", c.limit, "--scale", strconv.Itoa(c.scale), "--rounds", "4"}, c.flags...)
			var out, errb bytes.Buffer
			require.Equal(t, 0, runMain(args, &out, &errb), errb.String())
			var rep replayJSON
			require.NoError(t, json.Unmarshal(out.Bytes(), &rep))
			stable := 0
			for _, x := range rep.PerIteration {
				if x.Stage != "STABLE" {
					continue
				}
				stable++
				t.Logf("round %d iteration %d: measured %.1f ms, simulated %.1f ms, placed %d, missed %d, evictions %d, on demand %d",
					x.Round, x.Iter, x.MeasuredMS, x.SimulatedMS, x.Placed, x.Missed, x.Evictions, x.OnDemandSwapIns)
				assert.Positive(t, x.Placed, "round %d iteration %d", x.Round, x.Iter)
				assert.Zero(t, x.Evictions, "round %d iteration %d", x.Round, x.Iter)
				assert.Zero(t, x.OnDemandSwapIns, "round %d iteration %d", x.Round, x.Iter)
			}
			assert.GreaterOrEqual(t, stable, 3)
		})
	}
}

// checkPlanDoc: the long step checks that docs/plan.md is what the head
// plans (TestPlanTraces), laid-out plans included.
const checkPlanDoc = true

// runJSON runs the command args, wants exit code want, decodes its JSON
// output into v and returns what it wrote to stderr.
func runJSON(t *testing.T, want int, v any, args ...string) string {
	t.Helper()
	var out, errb bytes.Buffer
	require.Equal(t, want, runMain(args, &out, &errb), errb.String())
	require.NoError(t, json.Unmarshal(out.Bytes(), v), out.String())
	return errb.String()
}

// verifiedReplay replays with every byte verified and checks that none
// differed.
func verifiedReplay(t *testing.T, base []string) {
	t.Helper()
	var rep replayJSON
	runJSON(t, 0, &rep, append([]string{"replay", "--quiet", "--json"}, base...)...)
	assert.Zero(t, rep.FailedUses)
	assert.Positive(t, rep.VerifiedUses)
	assert.Contains(t, rep.Stages, "STABLE")
}

// TestDeepCutsSplit: at 25% of their recorded peak, llama7b-8l and llama16
// cannot be planned while their fused optimizer step runs whole (the error
// names it and says --split runs it in pieces); with --split, and with
// --hoist (each piece in the backward, right after its gradient), they
// plan with recompute, their blocks laid out within the limit, replay
// with every byte verified, and replay timed at a scale that keeps the
// GPU's proportions placed (fewer than one block in five hundred missing
// its place), with no forced eviction and no on-demand swap-in once
// STABLE; no plan beats the bound of plans with recompute, none is over
// 1.36x of it with --split or 1.29x with --hoist (llama16's 1.1x), and the
// step in the backward plans at least 5% faster.
func TestDeepCutsSplit(t *testing.T) {
	if raceEnabled {
		t.Skip("timed replays under the race detector measure the detector")
	}
	for _, name := range []string{"llama7b-8l-bf16", "llama16-bf16"} {
		t.Run(name, func(t *testing.T) {
			tr := filepath.Join(publicDir, name)
			if _, err := os.Stat(tr + ".jsonl.gz"); err != nil {
				t.Skipf("%s absent", tr)
			}
			base := []string{"--trace", tr + ".jsonl.gz", "--kernels", tr + ".kernels.json.gz", "--limit", "25%"}
			var whole planReport
			stderr := runJSON(t, 1, &whole, append([]string{"plan", "--json"}, base...)...)
			require.NotNil(t, whole.Shortfall)
			assert.Equal(t, "aten::_fused_adamw_", whole.Shortfall.Name)
			assert.True(t, whole.Shortfall.Pieces)
			assert.Contains(t, stderr, "--split runs one by one")

			var sims []float64
			for _, flag := range []string{"--split", "--hoist"} {
				args := append(slices.Clone(base), flag)
				var plan planReport
				runJSON(t, 0, &plan, append([]string{"plan", "--json"}, args...)...)
				assert.True(t, plan.Feasible)
				assert.NotEmpty(t, plan.Recomputes)
				assert.LessOrEqual(t, plan.PeakBytesAfter, plan.LimitBytes)
				require.NotNil(t, plan.Layout)
				assert.True(t, plan.Layout.Fits, "the plan's blocks fit the limit as laid out")
				bound := plan.IterationMSBase * (1 + *plan.OverheadPctBoundRecompute/100)
				t.Logf("25%% with %s: %.2f ms simulated, bound with recompute %.2f ms: %.3fx; held back up to %d bytes at %d ops",
					flag, plan.IterationMSSim, bound, plan.IterationMSSim/bound, plan.HeldBytes, plan.HeldOps)
				assert.GreaterOrEqual(t, plan.IterationMSSim, bound, "%s: no plan beats the bound of plans with recompute", flag)
				// How near: what the plans reached with write-backs and frees
				// in the next step (2373aa9: 1.16x and 1.34x with --split,
				// 1.08x and 1.26x with --hoist; 1.17x, 1.35x, 1.12x and 1.29x
				// at 46b9e66), with a little room; llama16's hoisted plan
				// within the 1.1x the design asks for.
				near := map[string]float64{"--split": 1.36, "--hoist": 1.29}[flag]
				if name == "llama16-bf16" && flag == "--hoist" {
					near = 1.1
				}
				assert.LessOrEqual(t, plan.IterationMSSim, near*bound, "%s: the plan that fits its layout stays near the bound", flag)
				sims = append(sims, plan.IterationMSSim)

				verifiedReplay(t, args)
				var rep replayJSON
				runJSON(t, 0, &rep, append([]string{"replay", "--timing", "--quiet", "--json", "--scale", "256", "--rounds", "4"}, args...)...)
				stable, placed := 0, 0
				for _, x := range rep.PerIteration {
					if x.Stage != "STABLE" {
						continue
					}
					stable++
					assert.Zero(t, x.Evictions, "%s round %d iteration %d", flag, x.Round, x.Iter)
					assert.Zero(t, x.OnDemandSwapIns, "%s round %d iteration %d", flag, x.Round, x.Iter)
					if x.Placed > 0 {
						placed++
					}
					// What the host holds longer than in the step profiled
					// is moved off the layout's places at the next step.
					assert.LessOrEqual(t, 500*x.Missed, x.Placed, "%s round %d iteration %d: %d blocks missed their places, %d placed", flag, x.Round, x.Iter, x.Missed, x.Placed)
				}
				assert.GreaterOrEqual(t, stable, 3, flag)
				assert.Equal(t, stable, placed, "%s: a layout that fits is followed every STABLE step", flag)
			}
			// Each piece of the step right after its gradient is final:
			// its weight and gradient are still on the device, and the
			// step's copies overlap the backward's compute.
			assert.Less(t, sims[1], 0.95*sims[0], "the step in the backward plans faster than at its end")
		})
	}
}

// TestFourTimesTheBatch: the design's scenario. llama16 at batch 16 and
// llama7b-8l at batch 8, recorded on the H200, plan with --split and
// recompute under the recorded peak of a quarter of their batch
// (llama16-bf16 and llama7b-8l-bf16, recorded the same day: the limits
// below), within 1.1x of the bound of plans with recompute, and replay with
// every byte verified.
func TestFourTimesTheBatch(t *testing.T) {
	for _, c := range []struct{ name, limit string }{
		{"llama16-bf16-b16", "19790896640B"},
		{"llama7b-8l-bf16-b8", "26993532416B"},
	} {
		t.Run(c.name, func(t *testing.T) {
			tr := filepath.Join("../../testdata/traces", c.name)
			base := []string{"--split", "--trace", tr + ".jsonl.gz", "--kernels", tr + ".kernels.json.gz", "--limit", c.limit}
			var p planReport
			runJSON(t, 0, &p, append([]string{"plan", "--json"}, base...)...)
			require.True(t, p.Feasible)
			require.NotNil(t, p.OverheadPctBoundRecompute)
			bound := p.IterationMSBase * (1 + *p.OverheadPctBoundRecompute/100)
			t.Logf("simulated %.2f ms, bound with recompute %.2f ms: %.3fx", p.IterationMSSim, bound, p.IterationMSSim/bound)
			assert.LessOrEqual(t, p.IterationMSSim, 1.1*bound)
			assert.LessOrEqual(t, p.PeakBytesAfter, p.LimitBytes)
			verifiedReplay(t, base)
		})
	}
}

// TestFusedStepAtEightyPercent: the GPU matrix's qwen2-7b-8l row at 80%,
// whose fused AdamW step lists 16.6 of the 17.4 GB limit, replayed timed on
// the host at the GPU's proportions with the step in pieces (--split),
// reaches STABLE with no forced eviction and no on-demand swap-in. (The
// step whole ran out of device memory at it on the H200 up to 2a593f6, in
// planned iterations whose layout did not fit; from 0db9749 the plan's
// layout fits and the H200 runs the row whole. The host replay of the step
// whole still runs out of memory there, in a warm-up iteration, before any
// plan: the host's warm-up, which swaps on demand, is not the GPU's.)
func TestFusedStepAtEightyPercent(t *testing.T) {
	if raceEnabled {
		t.Skip("timed replays under the race detector measure the detector")
	}
	tr := "../../testdata/qwen2-7b-8l"
	base := []string{"replay", "--timing", "--quiet", "--json", "--trace", tr + ".jsonl.gz", "--kernels", tr + ".kernels.json.gz",
		"--limit", "80%", "--scale", "256", "--rounds", "4"}
	var rep replayJSON
	runJSON(t, 0, &rep, append(base, "--split")...)
	stable := 0
	for _, x := range rep.PerIteration {
		if x.Stage == "STABLE" {
			stable++
			assert.Zero(t, x.Evictions, "round %d iteration %d", x.Round, x.Iter)
			assert.Zero(t, x.OnDemandSwapIns, "round %d iteration %d", x.Round, x.Iter)
		}
	}
	assert.GreaterOrEqual(t, stable, 3)
}

// TestVaryingStepsLeavePlacement: Mixtral's MoE routes other tokens to its
// experts every step, so its outputs change size from one step to the
// next and blocks miss their planned places. Once placement is given up
// for its op sequence, no later step is placed, whatever policy is
// planned again: on the H200 at c36c6fd its placed steps at 80% of the
// peak, missing 150-670 places, took 169-237 ms against 54-81 ms on best
// fit, placement resuming every few steps. Where best fit then forces
// evictions under the policy, the Engine plans it again lower
// (Stats.Tightened), as it does for a layout that needs more pages than
// the limit holds. Every byte still reads back as written.
func TestVaryingStepsLeavePlacement(t *testing.T) {
	if raceEnabled {
		t.Skip("timed replays under the race detector measure the detector")
	}
	tr := filepath.Join(publicDir, "mixtral8-eager-bf16")
	if _, err := os.Stat(tr + ".jsonl.gz"); err != nil {
		t.Skipf("%s absent", tr)
	}
	base := []string{"--trace", tr + ".jsonl.gz", "--limit", "80%", "--scale", "256", "--rounds", "4"}
	var rep replayJSON
	runJSON(t, 0, &rep, append([]string{"replay", "--timing", "--quiet", "--json", "--kernels", tr + ".kernels.json.gz"}, base...)...)
	stable, off := 0, -1
	var bestFitEvictions int64
	for k, x := range rep.PerIteration {
		if x.Stage != "STABLE" {
			continue
		}
		stable++
		t.Logf("round %d iteration %d: placed %d, missed %d, evictions %d", x.Round, x.Iter, x.Placed, x.Missed, x.Evictions)
		if off < 0 && x.Placed == 0 && x.Missed == 0 {
			off = k
		}
		if off >= 0 {
			assert.Zero(t, x.Placed+x.Missed, "round %d iteration %d: placed again after placement was given up", x.Round, x.Iter)
			bestFitEvictions += x.Evictions
		}
	}
	assert.GreaterOrEqual(t, stable, 12)
	require.GreaterOrEqual(t, off, 0, "placement never given up")
	t.Logf("forced evictions under best fit in STABLE steps: %d; policies planned again lower: %d", bestFitEvictions, rep.Tightened)
	if bestFitEvictions > 0 {
		assert.Positive(t, rep.Tightened, "best fit forced evictions under the policy, which was not planned again lower")
	}
	verifiedReplay(t, base)
}

package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/device/host"
	"github.com/chameleon-go/chameleon/examples/train/compute"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// small is a model that decodes in a few milliseconds a round, with
// weights several times a 40% limit.
func small() Config {
	steps := 14
	if testing.Short() {
		steps = 10 // past WARMUP and GEN_POLICY
	}
	return Config{Model: Model{Layers: 4, Width: 64, FFN: 128, Vocab: 64, Sessions: 3, Prompt: 4}, Steps: steps, Seed: 5, MinSwap: 1 << 10, SyncPlanning: true}
}

func hostKernels(d *host.Device) Kernels {
	return func(s device.Stream) (compute.Kernels, error) { return compute.NewHost(d, s, 2), nil }
}

func newHost(t *testing.T, opts ...host.Option) *host.Device {
	d, err := host.New(1<<30, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { d.Close() })
	return d
}

// requireSameOutputs compares every byte of every token's logits.
func requireSameOutputs(t *testing.T, want, got *Report) {
	t.Helper()
	m := want.Config.Model
	require.Len(t, want.Logits, want.Config.Steps*m.Sessions*m.Vocab*4, "every token's logits were read")
	require.Len(t, got.Logits, len(want.Logits))
	if i := firstDiff(want.Logits, got.Logits); i < len(want.Logits) {
		t.Fatalf("logits differ at byte %d (token %d, logit %d)", i, i/(4*m.Vocab), i%(4*m.Vocab)/4)
	}
	require.Equal(t, want.Tokens, got.Tokens)
}

// TestLimitKeepsOutputs: at 40% of the unlimited peak (the weights over
// twice the limit) every logit of every token is the unlimited run's, with
// the hints and without them; the weights leave the device with no copy.
func TestLimitKeepsOutputs(t *testing.T) {
	d := newHost(t)
	cfg := small()
	cfg.Limit = cfg.UpperBoundBytes(cfg.Steps)
	free, err := Run(d, hostKernels(d), cfg)
	require.NoError(t, err)
	require.Zero(t, free.Stats.SwapsOut, "the unlimited run swapped: UpperBoundBytes is not an upper bound")
	tokens := map[int32]bool{}
	for _, tok := range free.Tokens {
		tokens[tok] = true
	}
	assert.Greater(t, len(tokens), 3, "the model decodes varied tokens: %v", free.Tokens)

	limit := free.Stats.PeakDeviceBytes * 4 / 10
	require.GreaterOrEqual(t, cfg.WeightBytes(), 2*limit)
	for _, hints := range []bool{true, false} {
		c := cfg
		c.Limit, c.Hints = limit, hints
		rep, err := Run(d, hostKernels(d), c)
		require.NoError(t, err, "hints %v", hints)
		requireSameOutputs(t, free, rep)
		st := rep.Stats
		assert.LessOrEqual(t, st.PeakDeviceBytes, limit)
		assert.Positive(t, st.SwappedInBytes)
		assert.Positive(t, st.KeptEvictions, "frozen weights leave with no copy")
		if hints {
			assert.Positive(t, st.HintEvictions)
			assert.Positive(t, st.HintPrefetches)
		} else {
			assert.Zero(t, st.HintEvictions+st.HintPrefetches)
		}
		t.Logf("hints %v: %d B in, %d B out, %d released, %d on-demand, %d forced, %d hinted out, %d hinted in", hints,
			st.SwappedInBytes, st.SwappedOutBytes, st.KeptEvictions, st.OnDemandIn, st.Evictions, st.HintEvictions, st.HintPrefetches)
	}
}

// TestLimitKeepsOutputsOnALink: the same over a modeled host link, where
// copies take time and run beside the kernels.
func TestLimitKeepsOutputsOnALink(t *testing.T) {
	d := newHost(t, host.WithBandwidth(4e9, 4e9))
	cfg := small()
	cfg.Steps = 8
	cfg.Limit = cfg.UpperBoundBytes(cfg.Steps)
	cfg.Link = 4e9
	free, err := Run(d, hostKernels(d), cfg)
	require.NoError(t, err)
	cfg.Limit, cfg.Hints = free.Stats.PeakDeviceBytes/3, true
	rep, err := Run(d, hostKernels(d), cfg)
	require.NoError(t, err)
	requireSameOutputs(t, free, rep)
	assert.LessOrEqual(t, rep.Stats.PeakDeviceBytes, cfg.Limit)
}

// The command runs end to end and says the outputs matched.
func TestCommand(t *testing.T) {
	var out, errb bytes.Buffer
	code := runMain([]string{"--layers", "3", "--width", "32", "--ffn", "64", "--vocab", "32", "--sessions", "2", "--prompt", "3", "--steps", "8", "--quiet"}, &out, &errb)
	require.Equal(t, 0, code, "%s\n%s", out.String(), errb.String())
	for _, want := range []string{"bitwise those of the unlimited run", "tokens/s:", "streamed per token", "streaming bound", "within the limit", "engine:"} {
		assert.Contains(t, out.String(), want)
	}
}

// -h exits 0; an unknown flag 2, said once; every bad flag value is refused
// before any run starts.
func TestCommandLine(t *testing.T) {
	var out, errb bytes.Buffer
	assert.Equal(t, 0, runMain([]string{"-h"}, &out, &errb))
	assert.Contains(t, errb.String(), "-limit")
	assert.Empty(t, out.String())
	errb.Reset()
	assert.Equal(t, 2, runMain([]string{"--bogus"}, &out, &errb))
	assert.Equal(t, 1, strings.Count(errb.String(), "flag provided but not defined: -bogus"), errb.String())
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--limit", "abc"}, `--limit "abc"`},
		{[]string{"--limit", "40"}, "no unit"},
		{[]string{"--limit", "0%"}, "above 0%"},
		{[]string{"--limit", "150%"}, "above 100%"},
		{[]string{"--limit", "-1GiB"}, "negative"},
		{[]string{"--device", "tpu"}, "--device"},
		{[]string{"--min-swap", "x"}, "--min-swap"},
		{[]string{"--host-reserve", "x"}, "--host-reserve"},
		{[]string{"--steps", "0"}, "--steps 0"},
		{[]string{"--layers", "0"}, "Layers:0"},
		{[]string{"--vocab", "1"}, "vocab at least 2"},
		{[]string{"--host-bw", "-1"}, "negative"},
		{[]string{"extra"}, `unexpected argument "extra"`},
	}
	for _, tt := range tests {
		out.Reset()
		errb.Reset()
		assert.Equal(t, 2, runMain(tt.args, &out, &errb), "%v: %s", tt.args, errb.String())
		assert.Contains(t, errb.String(), tt.want, "%v", tt.args)
		assert.Equal(t, 1, strings.Count(errb.String(), "infer:"), "%v: one error:\n%s", tt.args, errb.String())
		assert.Empty(t, out.String(), "%v: work started before the flags were checked", tt.args)
	}
}

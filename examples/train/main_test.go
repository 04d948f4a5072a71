package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// -h exits 0; an unknown flag 2, said once; every bad flag value is refused
// before the unlimited run starts.
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
		{[]string{"--limit", "90"}, "did you mean 90%?"},
		{[]string{"--limit", "0.5"}, "did you mean 50%, 0.5 of the peak?"},
		{[]string{"--limit", "0"}, "none runs only without a limit"},
		{[]string{"--limit", "0%"}, "above 0%"},
		{[]string{"--limit", "150%"}, "above 100%"},
		{[]string{"--limit", "-1GiB"}, "negative"},
		{[]string{"--limit", "4096"}, "no unit"},
		{[]string{"--device", "tpu"}, "--device"},
		{[]string{"--min-swap", "x"}, "--min-swap"},
		{[]string{"--host-reserve", "x"}, "--host-reserve"},
		{[]string{"--tiers", "95,90"}, "--tiers"},
		{[]string{"--phase", "0"}, "--phase 0"},
		{[]string{"--patterns", "0"}, "--patterns 0"},
		{[]string{"--steps", "0"}, "--steps 0"},
		{[]string{"--layers", "0"}, "Layers:0"},
		{[]string{"extra"}, `unexpected argument "extra"`},
		{[]string{"--ranks", "0"}, "--ranks 0"},
		{[]string{"--ranks", "3"}, "--batch 1024 is not divisible by --ranks 3"},
		{[]string{"--rank-channel", "mpi"}, `--rank-channel "mpi"`},
		{[]string{"--rank-channel", "nccl"}, "want --device cuda"},
		{[]string{"--rank-timeout", "0s"}, "--rank-timeout"},
		{[]string{"--host-budget", "x"}, "--host-budget"},
		{[]string{"--ranks", "4", "--host-budget", "1KiB"}, "below one"},
		{[]string{"--ranks", "2", "--host-budget", "64MiB", "--host-reserve", "40MiB"}, "above a rank's share"},
		{[]string{"--limit-batch", "-1"}, "--limit-batch -1"},
		{[]string{"--ranks", "2", "--limit-batch", "256"}, "with --ranks 1"},
		{[]string{"--loss-chunks", "-1"}, "-1 loss chunks"},
		{[]string{"--loss-chunks", "2048"}, "2048 loss chunks for a batch of 1024"},
		{[]string{"--ranks", "4", "--loss-chunks", "512"}, "more than the 256 rows"},
		{[]string{"--limit-batch", "256", "--loss-chunks", "512"}, "more than the 256 rows of --limit-batch"},
	}
	for _, tt := range tests {
		out.Reset()
		errb.Reset()
		assert.Equal(t, 2, runMain(tt.args, &out, &errb), "%v: %s", tt.args, errb.String())
		assert.Contains(t, errb.String(), tt.want, "%v", tt.args)
		assert.Equal(t, 1, strings.Count(errb.String(), "train:"), "%v: one error:\n%s", tt.args, errb.String())
		assert.Empty(t, out.String(), "%v: work started before the flags were checked", tt.args)
	}
}

func TestParseLimit(t *testing.T) {
	for s, want := range map[string]int64{"50%": 500, "100%": 1000, "2KiB": 2048, "1e3B": 1000, "none": 0, " 25% ": 250} {
		got, err := parseLimit(s, 1000)
		assert.NoError(t, err, s)
		assert.Equal(t, want, got, s)
	}
}

// --limit-batch: four times the batch trains under the peak of the batch
// a quarter its size, with the same losses bit for bit as without a limit,
// and the summary compares the time per sample.
func TestLimitBatch(t *testing.T) {
	var out, errb bytes.Buffer
	code := runMain([]string{"--quiet", "--verify", "--batch", "1024", "--limit-batch", "256", "--limit", "100%", "--steps", "14"}, &out, &errb)
	assert.Equal(t, 0, code, errb.String()+out.String())
	assert.Contains(t, out.String(), "unlimited run at batch 256, the limit's base")
	assert.Contains(t, out.String(), "per sample: ")
	assert.Contains(t, out.String(), "(4.00x the batch)")
	assert.Contains(t, out.String(), "bitwise", out.String())
}

package replay_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon"
	"github.com/chameleon-go/chameleon/device/host"
	"github.com/chameleon-go/chameleon/internal/testtraces"
	"github.com/chameleon-go/chameleon/replay"
	"github.com/chameleon-go/chameleon/seq"
)

// TestReplayRecompute: with the ops that may run again handed a Recompute,
// the Engine's policies drop tensors and make them again, and every use,
// and every input of every recompute, reads the bytes last written. The
// clock makes an iteration take 5 µs, so that at the traces scaled sizes
// the link cannot hide what must leave and recompute pays. Every public
// trace with a backward pass, but dynseq, whose lengths change too often
// for a policy to form in two rounds of its iterations with this detection,
// and the models recorded in testdata.
func TestReplayRecompute(t *testing.T) {
	for _, c := range []struct {
		name  string
		scale int64
		pct   float64
	}{
		{testtraces.Small, 1024, 0.85}, {"llama16-bf16.jsonl.gz", 4096, 0.6}, {"mixtral8-eager-bf16.jsonl.gz", 4096, 0.8},
		{"llama16-fp16-scaler.jsonl.gz", 4096, 0.6}, {"llama16-lora.jsonl.gz", 4096, 0.6},
		{"llama7b-8l-bf16.jsonl.gz", 4096, 0.6}, {"llama16-bf16-ckpt.jsonl.gz", 1024, 0.85},
		// In testdata: tensors a recompute reads are swapped around the read.
		{"gpt2-24l.jsonl.gz", 4096, 0.45}, {"qwen2-12l.jsonl.gz", 4096, 0.55},
		{"qwen2-7b-8l.jsonl.gz", 1024, 0.85}, {"gpt2-xl-24l.jsonl.gz", 1024, 0.6},
	} {
		t.Run(c.name, func(t *testing.T) {
			if raceEnabled && c.name != testtraces.Small {
				t.Skip("under the race detector, the bundled trace only")
			}
			t.Parallel() // each trace on a device of its own
			tr := testtraces.Read(t, c.name)
			limit := int64(float64(replay.PeakBytes(tr)/c.scale) * c.pct)
			dev, err := host.New(limit)
			require.NoError(t, err)
			defer dev.Close()
			var now int64
			clock := func() time.Time { now += 5e3; return time.Unix(0, now) }
			d := seq.DefaultConfig()
			d.M, d.N = 2, 1
			rep, err := replay.Run(tr, dev, replay.Config{Scale: c.scale, Rounds: 2, Limit: limit, Recompute: true,
				Options: []chameleon.Option{chameleon.WithDetection(d), chameleon.WithClock(clock)}})
			if rep != nil && rep.Engine != nil {
				defer rep.Engine.Close()
			}
			require.NoError(t, err)
			assert.Zero(t, rep.FailedUses, rep.Failures)
			planned := 0
			for _, r := range rep.Results {
				if r.Plan != nil {
					planned += len(r.Plan.Recomputes())
				}
			}
			t.Logf("%s: %d recomputes planned, %d run, %d uses verified, %d evictions", c.name, planned, rep.Recomputes, rep.VerifiedUses, rep.Evictions)
			assert.Positive(t, planned, "recompute pays here")
			assert.Positive(t, rep.Recomputes, "and runs")
			assert.LessOrEqual(t, dev.PeakAllocated(), limit)
		})
	}
}

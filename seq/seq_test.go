package seq_test

import (
	"bytes"
	"log/slog"
	"testing"
	"testing/quick"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/internal/testtraces"
	"github.com/chameleon-go/chameleon/seq"
	"github.com/chameleon-go/chameleon/trace"
)

func sharedTrace(t testing.TB, name string) *trace.Trace { return testtraces.Read(t, name) }

// observe runs Encode+Detect over the trace's iterations, rounds times.
func observe(t testing.TB, tr *trace.Trace, cfg seq.Config, rounds int) []seq.Result {
	t.Helper()
	d, err := seq.NewDetector(cfg)
	require.NoError(t, err)
	e := seq.NewEncoder(nil)
	var out []seq.Result
	for range rounds {
		for _, it := range tr.Iterations {
			out = append(out, d.Observe(seq.EncodeIteration(e, it)))
		}
	}
	return out
}

func TestStaticTraceReachesStable(t *testing.T) {
	for _, name := range []string{"llama16-bf16.jsonl.gz", "llama7b-8l-bf16.jsonl.gz", "llama16-bf16-ckpt.jsonl.gz"} {
		t.Run(name, func(t *testing.T) {
			res := observe(t, sharedTrace(t, name), seq.DefaultConfig(), 3)
			for i, r := range res {
				assert.False(t, r.Changed, "iteration %d flagged: %s", i, r.Reason)
				want := seq.Warmup
				if i >= 5 {
					want = seq.GenPolicy
				}
				if i >= 8 {
					want = seq.Stable
				}
				assert.Equal(t, want, r.Stage, "iteration %d", i)
			}
		})
	}
}

func TestSmallBundledTrace(t *testing.T) {
	tr, err := trace.ReadFile("../testdata/llama4-small.jsonl.gz")
	require.NoError(t, err)
	cfg := seq.DefaultConfig()
	cfg.M, cfg.N = 2, 1
	res := observe(t, tr, cfg, 2)
	stages := make([]seq.Stage, len(res))
	for i, r := range res {
		assert.False(t, r.Changed)
		assert.InDelta(t, 1.0, r.Similarity, 1e-12)
		stages[i] = r.Stage
	}
	assert.Equal(t, []seq.Stage{seq.Warmup, seq.Warmup, seq.GenPolicy, seq.Stable, seq.Stable, seq.Stable}, stages)
}

func TestScalerSkippedStepsFlagged(t *testing.T) {
	tr := sharedTrace(t, "llama16-fp16-scaler.jsonl.gz")
	res := observe(t, tr, seq.DefaultConfig(), 1)
	for i, r := range res {
		lenChanged := i > 0 && len(tr.Iterations[i].Ops) != len(tr.Iterations[i-1].Ops)
		assert.Equal(t, lenChanged, r.Changed, "iteration %d: %s", i, r.Reason)
		if lenChanged {
			assert.Less(t, r.Similarity, 0.95, "iteration %d", i)
			assert.Greater(t, r.LengthDelta, 0.05, "iteration %d", i)
			assert.Equal(t, seq.Warmup, r.Stage)
		}
	}
}

func TestDynseqLengthChangesFlagged(t *testing.T) {
	tr := sharedTrace(t, "llama16-bf16-dynseq.jsonl.gz")
	res := observe(t, tr, seq.DefaultConfig(), 1)
	for i, r := range res {
		// Same op names every iteration: only the memory rule can see it.
		assert.InDelta(t, 1.0, r.Similarity, 1e-12)
		assert.Zero(t, r.LengthDelta)
		seqChanged := i > 0 && tr.Iterations[i].SeqLen != tr.Iterations[i-1].SeqLen
		assert.Equal(t, seqChanged, r.Changed, "iteration %d (seq %d): %s", i, tr.Iterations[i].SeqLen, r.Reason)
		if seqChanged {
			assert.Greater(t, r.MemoryDelta, 0.05)
			assert.Contains(t, r.Reason, "allocated bytes")
		}
	}
}

func TestMixtralJudgedByThresholds(t *testing.T) {
	// Tokens per expert move every step, but the op sequence is the same
	// and, with top-2 routing, the routed rows (so the bytes) are too: the
	// 5% rules call it unchanged.
	tr := sharedTrace(t, "mixtral8-eager-bf16.jsonl.gz")
	res := observe(t, tr, seq.DefaultConfig(), 1)
	for i, r := range res {
		assert.False(t, r.Changed, "iteration %d: %s", i, r.Reason)
		assert.LessOrEqual(t, r.MemoryDelta, 0.05)
	}
	// The same iterations against a tighter memory rule still pass: the
	// shape changes do not move the totals at all.
	cfg := seq.DefaultConfig()
	cfg.MaxMemoryDelta = 0.001
	for i, r := range observe(t, tr, cfg, 1) {
		assert.False(t, r.Changed, "iteration %d: %s", i, r.Reason)
	}
}

func TestDebugLogNamesHashAndReason(t *testing.T) {
	tr := sharedTrace(t, "llama16-fp16-scaler.jsonl.gz")
	var buf bytes.Buffer
	cfg := seq.DefaultConfig()
	cfg.Logger = slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	observe(t, &trace.Trace{Iterations: tr.Iterations[2:4]}, cfg, 1)
	out := buf.String()
	assert.Contains(t, out, "hash=")
	assert.Contains(t, out, "length 4174 -> 6087")
	assert.True(t, seq.DebugEnabled("foo, seqchange", "seqchange"))
	assert.False(t, seq.DebugEnabled("foo", "seqchange"))
}

func encode(tokens []uint8) seq.Profile {
	e := seq.NewEncoder(nil)
	for _, t := range tokens {
		e.RecordToken(seq.Token(t%16), 1)
	}
	return e.Finish()
}

func TestSimilarityProperties(t *testing.T) {
	self := func(a []uint8) bool {
		p := encode(a)
		return p.Len == 0 || assert.InDelta(t, 1, seq.Similarity(&p, &p), 1e-9)
	}
	symmetric := func(a, b []uint8) bool {
		pa, pb := encode(a), encode(b)
		s := seq.Similarity(&pa, &pb)
		return s >= 0 && s <= 1 && s == seq.Similarity(&pb, &pa)
	}
	require.NoError(t, quick.Check(self, nil))
	require.NoError(t, quick.Check(symmetric, nil))
}

func TestSimilarityIsOrderSensitive(t *testing.T) {
	// Same multiset of ops, different order: counts alone would say 1.
	a := encode([]uint8{1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4})
	b := encode([]uint8{1, 3, 2, 4, 1, 3, 2, 4, 1, 3, 2, 4})
	assert.Less(t, seq.Similarity(&a, &b), 0.5)
}

func TestEncodeDoesNotAllocate(t *testing.T) {
	e := seq.NewEncoder(nil)
	names := []string{"aten::mm", "aten::add", "aten::mul", "aten::view"}
	for _, n := range names {
		e.Record(n, "default", 0)
	}
	e.Finish()
	for range 4096 {
		e.Record("aten::mm", "default", 0) // grow the buffer once
	}
	e.Finish()
	allocs := testing.AllocsPerRun(1000, func() {
		for _, n := range names {
			e.Record(n, "default", 64)
		}
	})
	assert.Zero(t, allocs)
}

func TestVocabIsStable(t *testing.T) {
	v := seq.NewVocab()
	a := v.Token("aten::mm", "default")
	b := v.Token("aten::mm", "out")
	assert.NotEqual(t, a, b)
	assert.Equal(t, a, v.Token("aten::mm", "default"))
	n, o := v.Name(b)
	assert.Equal(t, "aten::mm", n)
	assert.Equal(t, "out", o)
}

func TestConfigValidate(t *testing.T) {
	cfg := seq.DefaultConfig()
	cfg.M = 0
	_, err := seq.NewDetector(cfg)
	assert.Error(t, err)
	cfg = seq.DefaultConfig()
	cfg.MinSimilarity = 2
	assert.Error(t, cfg.Validate())
}

func TestAdoptSkipsWarmup(t *testing.T) {
	d, err := seq.NewDetector(seq.DefaultConfig())
	require.NoError(t, err)
	p := encode([]uint8{1, 2, 3})
	assert.Equal(t, seq.Warmup, d.Observe(p).Stage)
	d.Adopt()
	assert.Equal(t, seq.Stable, d.Observe(p).Stage)
}

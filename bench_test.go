package chameleon_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/chameleon-go/chameleon/match"
	"github.com/chameleon-go/chameleon/seq"
	"github.com/chameleon-go/chameleon/trace"
)

// benchTrace loads a shared trace, or the bundled small one when the shared
// traces are not beside the checkout.
func benchTrace(b *testing.B, name string) *trace.Trace {
	b.Helper()
	p := filepath.Join("..", "shared", "traces", name)
	if _, err := os.Stat(p); err != nil {
		p = filepath.Join("testdata", "llama4-small.jsonl.gz")
	}
	tr, err := trace.ReadFile(p)
	if err != nil {
		b.Fatal(err)
	}
	return tr
}

// BenchmarkEncode is the lightweight profile's cost per recorded op
// (target: under 20 ns, 0 allocations).
func BenchmarkEncode(b *testing.B) {
	it := benchTrace(b, "llama16-bf16-ckpt.jsonl.gz").Iterations[0]
	e := seq.NewEncoder(nil)
	seq.EncodeIteration(e, it) // fill the vocabulary and grow buffers
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		op := &it.Ops[n]
		e.Record(op.Name, op.Overload, 4096)
		n++
		if n == len(it.Ops) {
			n = 0
			e.Finish()
		}
	}
}

// BenchmarkDetect is Detect's cost per iteration of the 5687-op
// checkpointed trace (target: under 20 µs): comparing the closed profile
// with the previous one and advancing the stage machine.
func BenchmarkDetect(b *testing.B) {
	tr := benchTrace(b, "llama16-bf16-ckpt.jsonl.gz")
	e := seq.NewEncoder(nil)
	ps := []seq.Profile{seq.EncodeIteration(e, tr.Iterations[0]), seq.EncodeIteration(e, tr.Iterations[1])}
	d, err := seq.NewDetector(seq.DefaultConfig())
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		d.Observe(ps[i&1])
		i++
	}
	b.ReportMetric(float64(ps[0].Len), "ops/iter")
}

// BenchmarkEncodeFinish is closing an iteration's profile (once per
// iteration): building the sparse bigram vector.
func BenchmarkEncodeFinish(b *testing.B) {
	it := benchTrace(b, "llama16-bf16-ckpt.jsonl.gz").Iterations[0]
	e := seq.NewEncoder(nil)
	b.ReportAllocs()
	for b.Loop() {
		for i := range it.Ops {
			e.RecordToken(seq.Token(i%97), 0)
		}
		e.Finish()
	}
	b.ReportMetric(float64(len(it.Ops)), "ops/iter")
}

// BenchmarkMatch is the cost of matching one produced tensor of a live
// iteration against the planned ones (target: under 200 ns per op).
func BenchmarkMatch(b *testing.B) {
	tr := benchTrace(b, "llama16-bf16.jsonl.gz")
	v := seq.NewVocab()
	planned := match.ProducedTensors(tr.Iterations[1], v)
	live := match.ProducedTensors(tr.Iterations[3], v)
	feats := make([]match.Features, len(planned))
	for i, p := range planned {
		feats[i] = p.Features
	}
	m := match.New(match.DefaultConfig(), feats)
	b.ReportAllocs()
	i, hits := 0, 0
	for b.Loop() {
		if k, _ := m.Match(live[i].Features); k >= 0 {
			hits++
		}
		if i++; i == len(live) {
			i = 0
			m.Reset()
		}
	}
	b.ReportMetric(float64(len(live))/float64(len(tr.Iterations[3].Ops)), "tensors/op")
}

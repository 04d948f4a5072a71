package chameleon_test

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/chameleon-go/chameleon"
	"github.com/chameleon-go/chameleon/device/host"
	"github.com/chameleon-go/chameleon/match"
	"github.com/chameleon-go/chameleon/memory"
	"github.com/chameleon-go/chameleon/plan"
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

// engineLoop drives an Engine through a synthetic chain of ops: op i reads
// the previous op's output and writes a fresh tensor; tensors are released
// after their last use.
type engineLoop struct {
	eng        *chameleon.Engine
	it         *chameleon.Iteration
	ops, i     int
	prev, prv2 *chameleon.Tensor
	op         chameleon.Op
	names      []string
}

func newEngineLoop(b *testing.B, limit int64, ops int) (*engineLoop, func()) {
	dev, err := host.New(limit)
	if err != nil {
		b.Fatal(err)
	}
	d := seq.DefaultConfig()
	d.M, d.N = 1, 1
	eng, err := chameleon.New(dev, chameleon.WithMemoryLimit(limit), chameleon.WithDetection(d))
	if err != nil {
		b.Fatal(err)
	}
	l := &engineLoop{eng: eng, ops: ops, names: []string{"aten::mm", "aten::add", "aten::mul", "aten::silu"}}
	l.op.In = make([]*chameleon.Tensor, 0, 1)
	l.op.Out = make([]*chameleon.Tensor, 1)
	l.it = eng.Begin()
	return l, func() { eng.Close(); dev.Close() }
}

func (l *engineLoop) step(b *testing.B, size int64) {
	t, err := l.eng.NewTensor(size, chameleon.Activation, "bfloat16", nil)
	if err != nil {
		b.Fatal(err)
	}
	l.op.Name = l.names[l.i%len(l.names)]
	l.op.Module = "model.layers.0"
	l.op.In = l.op.In[:0]
	if l.prev != nil {
		l.op.In = append(l.op.In, l.prev)
	}
	l.op.Out[0] = t
	if err := l.it.Before(&l.op); err != nil {
		b.Fatal(err)
	}
	if err := l.it.After(&l.op); err != nil {
		b.Fatal(err)
	}
	if l.prv2 != nil {
		l.eng.Release(l.prv2)
	}
	l.prv2, l.prev = l.prev, t
	if l.i++; l.i == l.ops {
		l.eng.Release(l.prv2)
		l.eng.Release(l.prev)
		l.prv2, l.prev, l.i = nil, nil, 0
		l.it.End()
		l.it = l.eng.Begin()
	}
}

// BenchmarkEngineOp is the Engine's cost per op in STABLE when no swap is
// due: NewTensor for the output, Before, After (encode, match) and Release
// (target: under 1 µs and 0 allocations).
func BenchmarkEngineOp(b *testing.B) {
	l, done := newEngineLoop(b, 64<<20, 1000)
	defer done()
	for range 5 * l.ops {
		l.step(b, 4096)
	}
	if l.eng.Stage() != seq.Stable {
		b.Fatalf("stage %s, want STABLE", l.eng.Stage())
	}
	b.ReportAllocs()
	for b.Loop() {
		l.step(b, 4096)
	}
}

// BenchmarkEngineOpSwapping is the same chain under a limit that forces a
// swap out and back for most ops (host backend, no link model): the cost
// of the executor's bookkeeping and copies per op.
func BenchmarkEngineOpSwapping(b *testing.B) {
	l, done := newEngineLoop(b, 5*32<<10, 200)
	defer done()
	for range 5 * l.ops {
		l.step(b, 64<<10)
	}
	b.ReportAllocs()
	before := l.eng.Stats()
	n := 0
	for b.Loop() {
		l.step(b, 64<<10)
		n++
	}
	after := l.eng.Stats()
	b.ReportMetric(float64(after.SwapsOut-before.SwapsOut)/float64(n), "swaps/op")
}

// BenchmarkPlanMake is the planning path an Engine runs at the end of a
// profiled iteration (plan.Make with its defaults: model, 32 uniform groups,
// estimates, limit tiers, plan, executor-order simulation), on llama16-bf16
// at 80% of its peak.
func BenchmarkPlanMake(b *testing.B) {
	tr := benchTrace(b, "llama16-bf16.jsonl.gz")
	k := min(1, len(tr.Iterations)-1)
	it := tr.Iterations[k]
	in := plan.Input{Iter: it, LiveOut: memory.LiveOutFromTrace(tr, k)}
	pre, err := plan.Prepare(in)
	if err != nil {
		b.Fatal(err)
	}
	in.Limit = slices.Max(pre.Model.Curve) * 8 / 10
	b.ReportAllocs()
	var r *plan.Result
	for b.Loop() {
		if r, err = plan.Make(in); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(r.Exec.OverheadPct(), "overhead_pct")
	b.ReportMetric(float64(len(r.Swaps())), "swaps")
}

// BenchmarkSplit is trace.Split of llama16's iteration 1: its fused AdamW
// step of 735 tensors divided into 147 pieces, the rest copied.
func BenchmarkSplit(b *testing.B) {
	tr := benchTrace(b, "llama16-bf16.jsonl.gz")
	it := tr.Iterations[min(1, len(tr.Iterations)-1)]
	b.ReportAllocs()
	var s *trace.Iteration
	for b.Loop() {
		s, _ = trace.Split(it)
	}
	b.ReportMetric(float64(len(s.Ops)-len(it.Ops)), "ops_added")
}

// BenchmarkForcedEviction is the host time of a forced eviction when most
// tensors are off the device: N tensors of 4 KiB made one after another
// under a 1 MiB limit, each that does not fit pushing an idle one out
// (issue: victims scanned every live tensor; now only those on the
// device). Reported per eviction, at 20,000 and 100,000 live tensors of
// 4 KiB, and at 1,000,000 of 512 bytes (2,048 on the device at once; 4 KiB
// ones would pin 4 GB of host memory): the cost follows the tensors on the
// device, not the live ones.
func BenchmarkForcedEviction(b *testing.B) {
	for _, c := range []struct {
		n    int
		size int64
	}{{20_000, 4 << 10}, {100_000, 4 << 10}, {1_000_000, 512}} {
		n := c.n
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			var evictions int64
			var took time.Duration
			for b.Loop() {
				dev, err := host.New(1 << 20)
				if err != nil {
					b.Fatal(err)
				}
				eng, err := chameleon.New(dev, chameleon.WithMemoryLimit(1<<20), chameleon.WithPlacement(false))
				if err != nil {
					b.Fatal(err)
				}
				start := time.Now()
				for range n {
					if _, err := eng.NewTensor(c.size, chameleon.Persistent, "uint8", nil); err != nil {
						b.Fatal(err)
					}
				}
				took += time.Since(start)
				evictions += eng.Stats().Evictions
				eng.Close()
				dev.Close()
			}
			b.ReportMetric(float64(took.Nanoseconds())/float64(max(evictions, 1)), "ns/eviction")
		})
	}
}

package layer

import (
	"path/filepath"
	"testing"
)

// BenchmarkGroupEstimate is the planning-time cost of grouping and timing
// one iteration as the Engine runs it: Layers (which discovers the layer
// boundaries) and the default estimator on the
// 5687-op gradient-checkpointed llama16 iteration (llama4-small when the
// shared traces are absent).
func BenchmarkGroupEstimate(b *testing.B) {
	path := repoFile(b, "testdata/llama4-small.jsonl.gz")
	if dir := tracesDir(); dir != "" && fileExists(filepath.Join(dir, "llama16-bf16-ckpt.jsonl.gz")) {
		path = filepath.Join(dir, "llama16-bf16-ckpt.jsonl.gz")
	}
	it := loadTrace(b, path).Iterations[0]
	est := Default()
	b.ReportAllocs()
	for b.Loop() {
		_ = Layers(it.Ops, 32)
		_ = est.Estimate(it)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(it.Ops)), "ns/trace-op")
}

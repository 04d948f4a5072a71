package mre

import (
	"errors"
	"os"
	"testing"

	"github.com/chameleon-go/chameleon/layer"
	"github.com/chameleon-go/chameleon/memory"
	"github.com/chameleon-go/chameleon/simulate"
	"github.com/chameleon-go/chameleon/trace"
)

// benchInput loads iteration 1 of a public trace at pct of its recorded
// peak, skipping when the traces are absent.
func benchInput(b testing.TB, name string, pct float64) Input {
	b.Helper()
	path := "../../shared/traces/" + name
	if _, err := os.Stat(path); err != nil {
		b.Skipf("%s absent", path)
	}
	tr, err := trace.ReadFile(path)
	if err != nil {
		b.Fatal(err)
	}
	it := tr.Iterations[1]
	m := memory.Build(it, memory.LiveOutFromTrace(tr, 1))
	in := Input{Model: m, OpTimes: layer.OpCount{}.Estimate(it), Groups: layer.Uniform(it.Ops, 32)}
	in.Curve = in.ResolveCurve()
	var peak int64
	for _, v := range in.Curve {
		peak = max(peak, v)
	}
	in.Limit = int64(float64(peak) * pct)
	return in
}

// BenchmarkPlanSimulate plans and simulates the 5687-op llama16-bf16-ckpt
// iteration. At 70% of its peak no swap-only plan exists (the tensors in use
// at the loss backward, parameters and optimizer state alone are ~92% of
// the peak), so that case measures the path to ErrInfeasible; at 95% a
// plan is found and simulated.
func BenchmarkPlanSimulate(b *testing.B) {
	b.Run("70pct", func(b *testing.B) { benchPlan(b, benchInput(b, "llama16-bf16-ckpt.jsonl.gz", 0.70)) })
	b.Run("95pct", func(b *testing.B) { benchPlan(b, benchInput(b, "llama16-bf16-ckpt.jsonl.gz", 0.95)) })
}

// benchPlan reports overhead_pct -1 when the limit is infeasible.
func benchPlan(b *testing.B, in Input) {
	b.ReportAllocs()
	overhead := -1.0
	for b.Loop() {
		p, err := Plan(in)
		if err != nil && !errors.Is(err, ErrInfeasible) {
			b.Fatal(err)
		}
		if err == nil {
			overhead = p.Sim.OverheadPct()
		}
	}
	b.ReportMetric(overhead, "overhead_pct")
}

// BenchmarkPlanSimulateLlama16 is the same on llama16-bf16 at 70%, where
// a plan exists.
func BenchmarkPlanSimulateLlama16(b *testing.B) {
	benchPlan(b, benchInput(b, "llama16-bf16.jsonl.gz", 0.70))
}

// BenchmarkPlanRecompute plans swaps and recomputes together on the
// 5687-op llama16-bf16-ckpt iteration at 80% of its peak (target: under
// 100 ms on one core) and, the deeper cut that tries the most budgets, on
// llama16-bf16 at 45%.
func BenchmarkPlanRecompute(b *testing.B) {
	for _, c := range []struct {
		name string
		file string
		pct  float64
	}{{"ckpt-80pct", "llama16-bf16-ckpt.jsonl.gz", 0.80}, {"llama16-45pct", "llama16-bf16.jsonl.gz", 0.45}} {
		b.Run(c.name, func(b *testing.B) {
			in := benchInput(b, c.file, c.pct)
			in.Recomputable = Recomputable(in.Model.Iter)
			benchPlan(b, in)
		})
	}
}

// BenchmarkTrafficBound bounds the traffic of the 3706-op llama16-bf16
// iteration at 40% of its peak, swaps alone and with recompute (which
// lists the recompute candidates first), reporting the bound in MiB: 14.6
// and 14.2 ms a call on the 2-core dev machine, 8 steps unrolled.
func BenchmarkTrafficBound(b *testing.B) {
	for _, recompute := range []bool{false, true} {
		name := map[bool]string{false: "swaps", true: "recompute"}[recompute]
		b.Run(name, func(b *testing.B) {
			in := benchInput(b, "llama16-bf16.jsonl.gz", 0.40)
			if recompute {
				in.Recomputable = Recomputable(in.Model.Iter)
			}
			b.ReportAllocs()
			var bound int64
			for b.Loop() {
				bound = TrafficBound(in)
			}
			b.ReportMetric(float64(bound)/(1<<20), "bound_MiB")
		})
	}
}

// BenchmarkRecomputeBound: the bound of plans with recompute on llama16-bf16
// at 40%, with the copies back counted and without (inRate 0).
func BenchmarkRecomputeBound(b *testing.B) {
	link := simulate.H200()
	for _, back := range []bool{false, true} {
		name := map[bool]string{false: "out", true: "out+back"}[back]
		b.Run(name, func(b *testing.B) {
			in := benchInput(b, "llama16-bf16.jsonl.gz", 0.40)
			in.Recomputable = Recomputable(in.Model.Iter)
			rate := 0.0
			if back {
				rate = link.H2D
			}
			b.ReportAllocs()
			var bound Bound
			for b.Loop() {
				bound = RecomputeBound(in, link.D2H, rate)
			}
			b.ReportMetric(bound.OverheadPct, "bound_pct")
		})
	}
}

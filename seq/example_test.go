package seq_test

import (
	"fmt"

	"github.com/chameleon-go/chameleon/seq"
)

// Encode each iteration's ops, then let Detect compare it with the last:
// three identical iterations, then one that skips the optimizer.
func ExampleDetector() {
	cfg := seq.DefaultConfig()
	cfg.M, cfg.N = 2, 1
	det, _ := seq.NewDetector(cfg)
	enc := seq.NewEncoder(nil)
	step := []string{"aten::embedding", "aten::mm", "aten::relu", "aten::mm", "aten::mm", "aten::_fused_adamw_"}
	for i := range 5 {
		ops := step
		if i == 4 {
			ops = step[:5] // a skipped optimizer step
		}
		for _, name := range ops {
			enc.Record(name, "default", 1<<20)
		}
		r := det.Observe(enc.Finish())
		fmt.Printf("%d %-10s changed=%v\n", i, r.Stage, r.Changed)
	}
	// Output:
	// 0 WARMUP     changed=false
	// 1 WARMUP     changed=false
	// 2 GEN_POLICY changed=false
	// 3 STABLE     changed=false
	// 4 WARMUP     changed=true
}

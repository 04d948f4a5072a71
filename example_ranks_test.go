package chameleon_test

import (
	"fmt"
	"sync"
	"time"

	"github.com/chameleon-go/chameleon"
	"github.com/chameleon-go/chameleon/device/host"
	"github.com/chameleon-go/chameleon/seq"
	"github.com/chameleon-go/chameleon/trace"
)

// Four data-parallel ranks, one Engine each, run the same training loop:
// rank 0 profiles and plans, the others adopt its policy over the channel
// (here the in-process one; a job of several processes passes its own
// broadcast, e.g. over NCCL), and the node's pinned memory is shared
// between them. Each rank checks every activation it reads back.
func ExampleWithRank() {
	const (
		ranks    = 4
		layers   = 8
		actBytes = 64 << 10
		limit    = 320 << 10
	)
	ends := chameleon.NewLocalChannel(ranks)
	var wg sync.WaitGroup
	report := make([]string, ranks)
	for rank := range ranks {
		wg.Go(func() {
			dev, _ := host.New(limit)
			defer dev.Close()
			eng, err := chameleon.New(dev, chameleon.WithMemoryLimit(limit),
				chameleon.WithDetection(seq.Config{M: 2, N: 1}),
				chameleon.WithRank(rank, ranks, ends[rank]), chameleon.WithRankTimeout(time.Minute),
				chameleon.WithHostBudget(4<<20, ranks)) // 4 MiB of pinned memory on the node, 1 MiB a rank
			if err != nil {
				report[rank] = err.Error()
				return
			}
			defer eng.Close()
			intact := true
			var swaps int64
			for step := range 8 {
				it := eng.Begin()
				saved := make([]*chameleon.Tensor, layers)
				for l := range layers { // forward: each layer saves an activation
					saved[l], _ = eng.NewTensor(actBytes, chameleon.Activation, "uint8", []int64{actBytes})
					op := chameleon.Op{Name: "aten::mm", Module: fmt.Sprintf("layers.%d", l), Phase: trace.PhaseForward, Out: saved[l : l+1]}
					it.Before(&op)
					ptr, v := saved[l].Ptr(), byte(step*layers+l)
					dev.Launch(eng.ComputeStream(), func() {
						for i, b := 0, dev.Bytes(ptr, actBytes); i < len(b); i++ {
							b[i] = v
						}
					})
					it.After(&op)
				}
				for l := layers - 1; l >= 0; l-- { // backward: reads them in reverse
					op := chameleon.Op{Name: "aten::mm_backward", Module: fmt.Sprintf("layers.%d", l), Phase: trace.PhaseBackward, In: saved[l : l+1]}
					it.Before(&op)
					got := make([]byte, actBytes)
					dev.ReadDevice(got, saved[l].Ptr())
					intact = intact && got[0] == byte(step*layers+l) && got[actBytes-1] == byte(step*layers+l)
					it.After(&op)
					eng.Release(saved[l])
				}
				res := it.End()
				swaps = res.SwapsOut
			}
			st := eng.Stats()
			report[rank] = fmt.Sprintf("rank %d: %s, planned %d, adopted %d, swaps per step %d, intact %v, pinned within its share %v",
				rank, eng.Stage(), st.Replans, st.AdoptedPolicies, swaps, intact, st.PeakHostBytes <= 1<<20)
		})
	}
	wg.Wait()
	for _, r := range report {
		fmt.Println(r)
	}
	// Output:
	// rank 0: STABLE, planned 1, adopted 0, swaps per step 3, intact true, pinned within its share true
	// rank 1: STABLE, planned 0, adopted 1, swaps per step 3, intact true, pinned within its share true
	// rank 2: STABLE, planned 0, adopted 1, swaps per step 3, intact true, pinned within its share true
	// rank 3: STABLE, planned 0, adopted 1, swaps per step 3, intact true, pinned within its share true
}

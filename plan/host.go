package plan

import (
	"fmt"

	"github.com/chameleon-go/chameleon/memory"
	"github.com/chameleon-go/chameleon/mre"
	"github.com/chameleon-go/chameleon/simulate"
	"github.com/chameleon-go/chameleon/trace"
)

// HostCurve is the pinned host memory a policy's swaps hold during each op
// of it, in the host pool's blocks (memory.RoundBytes). A swapped tensor's
// host buffer is held from the op after which it is copied out (written
// back, for a swap that is Early) through the
// op that waits for it back (over the iteration's end for a swap that
// wraps). A parameter or optimizer state keeps its host copy after it
// comes back, until an op writes it (lists it in Out), so its buffer is
// held through the next op at or after its use that writes it, and all
// iteration long when no op does. A tensor's swaps share one buffer.
func HostCurve(it *trace.Iteration, swaps []simulate.Swap) []int64 {
	n := len(it.Ops)
	curve := make([]int64, n)
	if n == 0 || len(swaps) == 0 {
		return curve
	}
	byTensor := map[trace.TensorID][]int{}
	var order []trace.TensorID
	for i, s := range swaps {
		if _, ok := byTensor[s.Tensor]; !ok {
			order = append(order, s.Tensor)
		}
		byTensor[s.Tensor] = append(byTensor[s.Tensor], i)
	}
	// Ops that write each swapped persistent tensor, in order.
	writes := map[trace.TensorID][]int{}
	for t := range it.Ops {
		for _, id := range it.Ops[t].Out {
			if tt := it.Tensors[id]; tt != nil && tt.Kind.Persistent() && byTensor[id] != nil {
				writes[id] = append(writes[id], t)
			}
		}
	}
	held := make([]bool, n)
	for _, id := range order {
		clear(held)
		var bytes int64
		persistent := false
		if tt := it.Tensors[id]; tt != nil {
			persistent = tt.Kind.Persistent()
		}
		for _, i := range byTensor[id] {
			s := swaps[i]
			bytes = max(bytes, memory.RoundBytes(s.Bytes))
			if s.Out < 0 || s.Out >= n || s.Use < 0 || s.Use >= n {
				continue // Make validates swaps elsewhere; count none of a malformed one
			}
			end := s.Use
			if persistent {
				end = nextWrite(writes[id], s.Use, n)
			}
			if end < 0 {
				for t := range held {
					held[t] = true
				}
				continue
			}
			// From Out (a write-back: the op after which it is copied) to
			// end, going round the iteration's end when end comes first.
			start := s.Out
			if s.Early && s.CopyAfter >= 0 && s.CopyAfter < n {
				start = s.CopyAfter
			}
			for t := start; ; t = (t + 1) % n {
				held[t] = true
				if t == end {
					break
				}
			}
		}
		for t, h := range held {
			if h {
				curve[t] += bytes
			}
		}
	}
	return curve
}

// nextWrite is the first op of ws (sorted) at or after from, going round
// the iteration's end; -1 when ws is empty.
func nextWrite(ws []int, from, n int) int {
	if len(ws) == 0 {
		return -1
	}
	for _, w := range ws {
		if w >= from {
			return w
		}
	}
	return ws[0] % n
}

// HostPeak is the most pinned host memory the swaps hold at once
// (HostCurve's maximum).
func HostPeak(it *trace.Iteration, swaps []simulate.Swap) int64 {
	var peak int64
	for _, b := range HostCurve(it, swaps) {
		peak = max(peak, b)
	}
	return peak
}

// HostLimitError says that a tier's policy holds more pinned host memory
// at once than WithHostLimit allows. It wraps mre.ErrInfeasible, so Make
// tries the next tier of the limit.
type HostLimitError struct {
	Peak, Limit int64
	Op          int // an op at which Peak is held
}

func (e *HostLimitError) Error() string {
	return fmt.Sprintf("the swaps hold %d bytes of pinned host memory at op %d, above the host limit of %d bytes", e.Peak, e.Op, e.Limit)
}

func (e *HostLimitError) Unwrap() error { return mre.ErrInfeasible }

// checkHost refuses swaps that hold more than limit bytes of pinned host
// memory at once (limit 0: no limit).
func checkHost(it *trace.Iteration, swaps []simulate.Swap, limit int64) error {
	if limit <= 0 {
		return nil
	}
	op, peak := -1, int64(0)
	for t, b := range HostCurve(it, swaps) {
		if b > peak {
			op, peak = t, b
		}
	}
	if peak > limit {
		return &HostLimitError{Peak: peak, Limit: limit, Op: op}
	}
	return nil
}

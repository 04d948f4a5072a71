package layer

import (
	"fmt"
	"slices"

	"github.com/chameleon-go/chameleon/trace"
)

// layoutOps move data between layouts: their kernels read or write with a
// stride, which keeps them well below the bandwidth a contiguous
// elementwise kernel reaches.
var layoutOps = map[string]bool{
	"cat": true, "stack": true, "clone": true, "contiguous": true, "copy_": true, "copy": true,
	"slice_backward": true, "constant_pad_nd": true, "pad": true,
	"repeat": true, "repeat_interleave": true, "tril": true, "triu": true, "flip": true, "roll": true,
	"unfold": true, "unfold_backward": true, "as_strided_scatter": true, "slice_scatter": true, "select_scatter": true,
}

// reduceOps reduce along a dimension: norms, sums, softmaxes.
var reduceOps = map[string]bool{
	"sum": true, "mean": true, "var": true, "std": true, "var_mean": true, "norm": true, "linalg_vector_norm": true,
	"amax": true, "amin": true, "max": true, "min": true, "argmax": true, "argmin": true, "prod": true,
	"cumsum": true, "logsumexp": true, "softmax": true, "_softmax": true, "_log_softmax": true,
	"_softmax_backward_data": true, "_log_softmax_backward_data": true, "topk": true, "sort": true,
	"native_layer_norm": true, "native_layer_norm_backward": true, "_fused_rms_norm": true, "_fused_rms_norm_backward": true,
	"native_group_norm": true, "native_group_norm_backward": true, "native_batch_norm": true, "native_batch_norm_backward": true,
}

// scatterOps write through indices (most sort them first) or select by a
// mask: their time follows the index count more than the bytes.
var scatterOps = map[string]bool{
	"index_put": true, "index_put_": true, "_index_put_impl_": true, "index_add": true, "index_add_": true,
	"scatter": true, "scatter_": true, "scatter_add": true, "scatter_add_": true, "scatter_reduce": true,
	"index_copy": true, "index_copy_": true, "index_fill_": true, "masked_fill": true, "masked_fill_": true,
	"masked_scatter": true, "masked_select": true, "nonzero": true, "embedding_dense_backward": true,
	"embedding_backward": true,
}

// Efficiency bounds of a fitted kind: a kernel cannot beat its roofline,
// and below minEff the kind is a launch-bound sliver the floor prices.
const (
	maxEff = 1.0
	minEff = 0.02
)

// priorEff is the efficiency of a kind the fitting iteration does not run.
var priorEff = [numKinds]float64{
	KindView: 1, KindMatmul: 0.9, KindAttention: 0.8, KindAttnBwd: 0.7, KindConv: 0.5, KindOptimizer: 0.38,
	KindMemory: 0.7, KindLayout: 0.3, KindReduce: 0.6, KindGather: 0.4, KindScatter: 0.1, KindDeclared: 0.5, KindUnknown: 1,
}

// Fitting thresholds: an op whose roofline time is under sigUS is priced
// mostly by its launch and per-call overheads, so a kind's efficiency is
// fitted on its ops above it when they exist; a kind whose ops take less
// than minShare of the kernel time keeps its prior.
const (
	sigUS    = 10.0
	minShare = 0.002
)

// Fit returns the cost model of dev whose per-kind efficiencies and launch
// floor explain kernelUS, the measured kernel time of each op of it (an
// optrace-kernels file's kernel_us). The model has two parameters per op
// kind (forward and backward) and the launch floor, nothing per op name:
// it carries to models it was not fitted on as far as their ops fall in the
// same kinds.
//
// The floor is the median kernel time of the ops whose roofline time is
// under half a microsecond (launch-bound ops). Each kind's efficiency is its
// ops' roofline time over their measured time above the floor, summed over
// the kind (so that the kind's total is matched) and over its ops above
// sigUS where it has any, bounded to [minEff, maxEff]; a kind that takes
// under minShare of the kernel time keeps a prior.
func Fit(it *trace.Iteration, kernelUS []float64, dev Device) (*CostModel, error) {
	if len(kernelUS) != len(it.Ops) {
		return nil, fmt.Errorf("layer: fit: %d kernel times for %d ops", len(kernelUS), len(it.Ops))
	}
	m := &CostModel{Device: dev, Eff: priorEff, HostBound: 0.7, LaunchUS: 1}
	roof := make([]float64, len(it.Ops))
	kinds := make([]OpKind, len(it.Ops))
	var small []float64
	var total float64
	for i := range it.Ops {
		k, r := m.roofline(it, &it.Ops[i])
		kinds[i], roof[i] = k, r
		total += kernelUS[i]
		if k != KindView && k != KindUnknown && r < 0.5 && kernelUS[i] > 0 {
			small = append(small, kernelUS[i])
		}
	}
	if len(small) > 0 {
		slices.Sort(small)
		m.LaunchUS = small[len(small)/2]
	}
	// sums per kind, [backward?][roofline over sigUS?]
	var num, den, share [2][2][numKinds]float64
	for i, k := range kinds {
		if k == KindView || k == KindUnknown || kernelUS[i] <= 0 {
			continue
		}
		b, s := 0, 0
		if it.Ops[i].Phase == trace.PhaseBackward {
			b = 1
		}
		if roof[i] >= sigUS {
			s = 1
		}
		num[b][s][k] += roof[i]
		den[b][s][k] += max(kernelUS[i]-m.LaunchUS, 0)
		share[b][0][k] += kernelUS[i] / total
	}
	eff := func(b int, k OpKind) (float64, bool) {
		if share[b][0][k] < minShare {
			return 0, false
		}
		if num[b][1][k] <= 0 || den[b][1][k] <= 0 {
			return 0, false
		}
		return min(maxEff, max(minEff, num[b][1][k]/den[b][1][k])), true
	}
	for k := range numKinds {
		f, okf := eff(0, k)
		b, okb := eff(1, k)
		switch {
		case okf && okb:
			m.Eff[k], m.EffBwd[k] = f, b
		case okf:
			m.Eff[k] = f
		case okb:
			m.Eff[k] = b
		}
	}
	return m, nil
}

// roofline returns an op's kind and its roofline time at full efficiency,
// microseconds.
func (m *CostModel) roofline(it *trace.Iteration, op *trace.Op) (OpKind, float64) {
	kind, flops, bytes := Work(it, op)
	peak := m.Device.FLOPS
	if kind == KindMatmul || kind == KindConv {
		if t := firstInput(it, op); t != nil && (t.DType == "float32" || t.DType == "float") {
			peak = m.Device.FLOPS32
		}
	}
	return kind, 1e6 * max(flops/peak, bytes/m.Device.Bandwidth)
}

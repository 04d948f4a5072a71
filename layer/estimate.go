package layer

import (
	"math"
	"strings"

	"github.com/chameleon-go/chameleon/trace"
)

// OpKind is how the cost model prices an op.
type OpKind uint8

// Op kinds. Each has its own efficiency factor, because a GEMM, an attention
// kernel and an elementwise kernel reach very different shares of the
// device's peak.
const (
	KindView      OpKind = iota // metadata only (view, transpose, detach): no kernel
	KindMatmul                  // mm, addmm, bmm, linear, baddbmm: FLOP-bound
	KindAttention               // fused attention forward
	KindAttnBwd                 // fused attention backward
	KindConv                    // convolution
	KindOptimizer               // fused and foreach optimizer steps: bandwidth-bound over many tensors
	KindMemory                  // elementwise ops and casts: bandwidth-bound, contiguous
	KindLayout                  // strided copies (cat, clone, slice and select backward, padding): bandwidth-bound, strided
	KindReduce                  // reductions and softmaxes: bandwidth-bound, with a reduction tree
	KindGather                  // indexed reads (embedding, index, index_select, losses over indices)
	KindScatter                 // indexed writes and selections (embedding backward, index_put, index_add, nonzero)
	KindDeclared                // an op the model does not know, priced by its declared FLOPs/IOBytes
	KindUnknown                 // an op the model cannot price: gets the average weight
	numKinds
)

var kindNames = [...]string{"view", "matmul", "attention", "attention_bwd", "conv", "optimizer", "memory", "layout", "reduce", "gather", "scatter", "declared", "unknown"}

// String names the kind.
func (k OpKind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "kind?"
}

// Device holds the constants of the roofline.
type Device struct {
	// FLOPS is the dense 16-bit matrix throughput, FLOP/s.
	FLOPS float64
	// FLOPS32 is the fp32 matrix throughput, FLOP/s.
	FLOPS32 float64
	// Bandwidth is the effective device-memory bandwidth, bytes/s.
	Bandwidth float64
}

// H200 is the measured NVIDIA H200: ~790 TFLOP/s bf16 matmul, 51 TFLOP/s
// fp32 SGEMM, ~4.0 TB/s effective HBM bandwidth.
var H200 = Device{FLOPS: 790e12, FLOPS32: 51e12, Bandwidth: 4.0e12}

// CostModel is a roofline estimator: every op costs a launch floor plus the
// larger of its FLOPs over the device's throughput and its bytes over the
// bandwidth, divided by the efficiency of its kind (and phase). Shapes come
// from the iteration's tensors, so it follows sequence-length and
// expert-load changes that no per-token average can.
//
// The per-op times are then fitted to the measured iteration time. When the
// device model accounts for the whole iteration (a GPU-bound step) they are
// scaled proportionally. When it accounts for much less (a host-bound step:
// many small ops, host syncs), the timeline is the host's: every op costs
// the host a dispatch time besides its kernel, HostRatio times as long for
// an op that launches a kernel as for one that only makes a view, with the
// dispatch time chosen so that the ops sum to the iteration time.
type CostModel struct {
	Device Device
	// Eff is the share of the roofline each kind reaches; a zero entry is
	// taken as 1.
	Eff [numKinds]float64
	// EffBwd is Eff in the backward, where a nonzero entry overrides Eff:
	// a backward kernel reads contiguous gradients where the forward reads
	// transposed and broadcast views, and on the recorded models the same
	// kind reaches a share 10-40% higher there.
	EffBwd [numKinds]float64
	// TokenEff refines Eff per op token ("aten::cat.default", or with its
	// phase, "bwd:aten::cat.default"); optional. The default model has
	// none: per-token constants fitted on one model do not carry to
	// another better than the kinds do (docs/estimation.md).
	TokenEff map[string]float64
	// LaunchUS is the time of the smallest kernel, microseconds.
	LaunchUS float64
	// HostBound is the ratio of modeled kernel time to iteration time
	// below which the step is taken as host-bound (see the type comment).
	HostBound float64
	// HostRatio is how many times a view's host time an op that launches a
	// kernel costs the host in a host-bound step; zero is taken as
	// DefaultHostRatio.
	HostRatio float64
}

// DefaultHostRatio is CostModel.HostRatio's default: an op that launches a
// kernel goes through the dispatcher, the allocator and the launch, several
// times a view's metadata-only call (5 is where the host-bound mixtral8
// trace's group times come closest; 2-6 all beat op-count spreading there).
const DefaultHostRatio = 5

// DefaultCostModel is the cost model fitted (Fit) to the kernel times of
// one profiled iteration of llama16-bf16 on the H200 (the optrace-kernels
// file of that trace): one efficiency per op kind and phase, and the launch
// floor, each bounded to what the device can do. docs/estimation.md shows
// how it and the same model fitted on the other profiled traces carry over
// to the traces they were not fitted on.
func DefaultCostModel() *CostModel {
	return &CostModel{
		Device:    H200,
		Eff:       defaultEff,
		EffBwd:    defaultEffBwd,
		LaunchUS:  defaultLaunchUS,
		HostBound: 0.7,
		HostRatio: DefaultHostRatio,
	}
}

// The constants of DefaultCostModel: Fit on llama16-bf16's kernels file
// (TestDefaultIsFitted checks them against a fresh fit).
var (
	defaultLaunchUS = 0.99
	defaultEff      = [numKinds]float64{
		KindView: 1, KindMatmul: 0.988, KindAttention: 0.931, KindAttnBwd: 0.763, KindConv: 0.5, KindOptimizer: 0.386,
		KindMemory: 0.689, KindLayout: 0.298, KindReduce: 0.734, KindGather: 0.4, KindScatter: 0.118, KindDeclared: 0.5, KindUnknown: 1,
	}
	defaultEffBwd = [numKinds]float64{
		KindMatmul: 0.971, KindMemory: 0.837, KindLayout: 0.379, KindReduce: 0.726,
	}
)

// Default returns the default estimator.
func Default() Estimator { return DefaultCostModel() }

var viewOps = map[string]bool{
	"view": true, "_unsafe_view": true, "t": true, "transpose": true, "permute": true,
	"expand": true, "unsqueeze": true, "squeeze": true, "slice": true, "select": true,
	"as_strided": true, "detach": true, "alias": true, "reshape": true, "_reshape_alias": true,
	"lift_fresh": true, "split": true, "split_with_sizes": true, "chunk": true, "unbind": true,
	"narrow": true, "diagonal": true, "expand_as": true, "view_as": true, "numpy_T": true,
	"empty": true, "empty_like": true, "empty_strided": true, "_local_scalar_dense": true,
}

var matmulOps = map[string]bool{
	"mm": true, "addmm": true, "bmm": true, "baddbmm": true, "linear": true, "matmul": true,
	"_addmm_activation": true,
}

// Classify returns the op's kind from its name and tensors.
func Classify(it *trace.Iteration, op *trace.Op) OpKind {
	ns, name, ok := strings.Cut(op.Name, "::")
	if !ok {
		name = ns
	}
	switch {
	case ns == "profiler" || viewOps[name]:
		return KindView
	case matmulOps[name]:
		return KindMatmul
	case strings.Contains(name, "attention") || strings.Contains(name, "flash_attn"):
		if strings.HasSuffix(name, "_backward") {
			return KindAttnBwd
		}
		return KindAttention
	case strings.Contains(name, "convolution") || strings.HasPrefix(name, "conv"):
		return KindConv
	case strings.HasPrefix(name, "_fused_") || strings.HasPrefix(name, "_foreach_"):
		return KindOptimizer
	}
	if ns != "aten" && (op.FLOPs > 0 || op.IOBytes > 0) {
		return KindDeclared
	}
	if aliasesOnly(op) && !strings.HasSuffix(name, "_") {
		return KindView // an unlisted view: its results are its inputs' storages
	}
	if ns != "aten" {
		return KindUnknown
	}
	if len(op.In) == 0 && len(op.Out) == 0 {
		return KindUnknown
	}
	switch name {
	case "nll_loss_backward", "nll_loss2d_backward":
		return KindMemory // a dense write of the logits' gradient
	case "nll_loss_forward", "nll_loss2d_forward":
		return KindReduce // one reduction over the picked entries
	}
	switch {
	case layoutOps[name]:
		return KindLayout
	case reduceOps[name]:
		return KindReduce
	case scatterOps[name]:
		return KindScatter
	case gatherOps[name]:
		return KindGather
	}
	return KindMemory
}

func aliasesOnly(op *trace.Op) bool {
	if len(op.Out) == 0 {
		return false
	}
	for _, o := range op.Out {
		found := false
		for _, i := range op.In {
			if i == o {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// gatherOps read only the rows their indices pick, not their whole float
// inputs (an embedding table, the logits of a loss): their bytes are the
// outputs and the indices.
var gatherOps = map[string]bool{
	"embedding": true, "nll_loss_forward": true, "nll_loss_backward": true, "nll_loss2d_forward": true,
	"index": true, "index_select": true, "gather": true, "take": true,
}

func isFloat(dt string) bool {
	switch dt {
	case "float32", "float", "float16", "half", "bfloat16", "float64", "double":
		return true
	}
	return false
}

var dtypeSize = map[string]int64{
	"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2, "float64": 8, "double": 8,
	"int64": 8, "long": 8, "int32": 4, "int": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
}

// numel is the element count of a storage: its shape's product when known,
// otherwise its bytes over the element size.
func numel(t *trace.Tensor) float64 {
	if t == nil {
		return 0
	}
	if len(t.Shape) > 0 {
		n := int64(1)
		for _, d := range t.Shape {
			n *= d
		}
		if sz, ok := dtypeSize[t.DType]; !ok || n*sz <= t.Bytes || t.Bytes == 0 {
			return float64(n)
		}
	}
	if sz, ok := dtypeSize[t.DType]; ok {
		return float64(t.Bytes / sz)
	}
	return float64(t.Bytes) / 2
}

// Work returns an op's kind, FLOPs and bytes moved.
//
// Matmul FLOPs are 2*sqrt(|A|*|B|*|C|) (divided by the batch for bmm): the
// product of the three element counts is (m*k*n)^2 whatever views and
// transposes the operands went through, since only storages are recorded.
// Attention FLOPs are 4*|Q|*S_k forward (two GEMMs), 2.5 times that
// backward. Bytes are the storages read and written; an in-place op counts
// its storage twice (read and write).
func Work(it *trace.Iteration, op *trace.Op) (kind OpKind, flops, bytes float64) {
	kind = Classify(it, op)
	tensor := func(k int, ids []trace.TensorID) *trace.Tensor {
		if k < len(ids) {
			return it.Tensors[ids[k]]
		}
		return nil
	}
	switch kind {
	case KindView, KindUnknown:
		return kind, 0, 0
	case KindDeclared:
		return kind, op.FLOPs, op.IOBytes
	}
	_, name, _ := strings.Cut(op.Name, "::")
	gather := gatherOps[name]
	for _, id := range op.In {
		if t := it.Tensors[id]; t != nil && (!gather || !isFloat(t.DType)) {
			bytes += float64(t.Bytes)
		}
	}
	for _, id := range op.Out {
		if t := it.Tensors[id]; t != nil {
			bytes += float64(t.Bytes)
		}
	}
	switch kind {
	case KindMatmul:
		ins := op.In
		if len(ins) == 3 && (strings.HasSuffix(op.Name, "addmm") || strings.HasSuffix(op.Name, "baddbmm")) {
			ins = ins[1:]
		}
		a, b, c := tensor(0, ins), tensor(1, ins), tensor(0, op.Out)
		if a == nil || b == nil || c == nil {
			return kind, 0, bytes
		}
		p := numel(a) * numel(b) * numel(c)
		batch := 1.0
		if strings.HasSuffix(op.Name, "bmm") && len(c.Shape) >= 3 {
			for _, d := range c.Shape[:len(c.Shape)-2] {
				batch *= float64(d)
			}
		}
		flops = 2 * math.Sqrt(p/batch)
	case KindAttention, KindAttnBwd:
		q, k := tensor(0, op.In), tensor(1, op.In)
		if kind == KindAttnBwd {
			q, k = tensor(1, op.In), tensor(2, op.In)
		}
		if q != nil && k != nil && len(k.Shape) >= 2 {
			flops = 4 * numel(q) * float64(k.Shape[len(k.Shape)-2])
			if kind == KindAttnBwd {
				flops *= 2.5
			}
		}
	case KindConv:
		x, w, y := tensor(0, op.In), tensor(1, op.In), tensor(0, op.Out)
		if x != nil && w != nil && y != nil && len(w.Shape) > 0 && w.Shape[0] > 0 {
			flops = 2 * numel(y) * numel(w) / float64(w.Shape[0])
		}
	}
	return kind, flops, bytes
}

func (m *CostModel) eff(k OpKind) float64 {
	if e := m.Eff[k]; e > 0 {
		return e
	}
	return 1
}

// Kernel returns the modeled kernel time of one op in microseconds, and
// whether the model could price it (false for unknown ops).
func (m *CostModel) Kernel(it *trace.Iteration, op *trace.Op) (float64, bool) {
	return m.kernel(it, op, nil)
}

// effKey identifies an op token within its phase without building a string.
type effKey struct {
	name, overload string
	phase          trace.Phase
}

// kernel is Kernel with an optional cache of per-token efficiencies, which
// spares Estimate two string concatenations and map lookups per op.
func (m *CostModel) kernel(it *trace.Iteration, op *trace.Op, cache map[effKey]float64) (float64, bool) {
	kind, flops, bytes := Work(it, op)
	switch kind {
	case KindView:
		return 0, true
	case KindUnknown:
		return 0, false
	}
	peak := m.Device.FLOPS
	if kind == KindMatmul || kind == KindConv {
		if t := firstInput(it, op); t != nil && (t.DType == "float32" || t.DType == "float") {
			peak = m.Device.FLOPS32
		}
	}
	key := effKey{op.Name, op.Overload, op.Phase}
	e, ok := cache[key]
	if !ok {
		e = m.eff(kind)
		if op.Phase == trace.PhaseBackward && m.EffBwd[kind] > 0 {
			e = m.EffBwd[kind]
		}
		if te, ok := m.TokenEff[phaseKey(op)]; ok && te > 0 {
			e = te
		} else if te, ok := m.TokenEff[tokenKey(op)]; ok && te > 0 {
			e = te
		}
		if cache != nil {
			cache[key] = e
		}
	}
	tc := flops / (peak * e)
	tm := bytes / (m.Device.Bandwidth * e)
	return m.LaunchUS + 1e6*max(tc, tm), true
}

func firstInput(it *trace.Iteration, op *trace.Op) *trace.Tensor {
	if len(op.In) == 0 {
		return nil
	}
	return it.Tensors[op.In[0]]
}

// Estimate implements Estimator.
func (m *CostModel) Estimate(it *trace.Iteration) []float64 {
	out := make([]float64, len(it.Ops))
	known := make([]bool, len(it.Ops))
	var sum float64
	var nk int
	cache := make(map[effKey]float64, 64)
	for i := range it.Ops {
		out[i], known[i] = m.kernel(it, &it.Ops[i], cache)
		if known[i] && out[i] > 0 {
			sum += out[i]
			nk++
		}
	}
	// An op the model cannot price gets the average of those it can.
	avg := m.LaunchUS
	if nk > 0 {
		avg = sum / float64(nk)
	}
	for i := range out {
		if !known[i] {
			out[i] = avg
			sum += avg
		}
	}
	target := it.TimeMS * 1000
	if target > 0 && sum < m.HostBound*target {
		m.hostBound(it, out, sum, target)
		return out
	}
	fit(out, sum, target, 0)
	return out
}

// hostBound spreads a host-bound step's time: each op keeps its kernel time
// and adds the host's dispatch time, HostRatio times as long for an op that
// launches a kernel as for a view.
func (m *CostModel) hostBound(it *trace.Iteration, t []float64, sum, target float64) {
	ratio := m.HostRatio
	if ratio <= 0 {
		ratio = DefaultHostRatio
	}
	w := make([]float64, len(t))
	var ws float64
	for i := range it.Ops {
		w[i] = ratio
		if Classify(it, &it.Ops[i]) == KindView {
			w[i] = 1
		}
		ws += w[i]
	}
	h := (target - sum) / ws
	for i := range t {
		t[i] += h * w[i]
	}
}

// fit makes the per-op times sum to target (microseconds): proportional
// scaling when the model explains at least hostBound of it, otherwise every
// op takes max(t, h) with h found by bisection.
func fit(t []float64, sum, target, hostBound float64) {
	if target <= 0 || len(t) == 0 {
		return
	}
	if sum <= 0 {
		for i := range t {
			t[i] = target / float64(len(t))
		}
		return
	}
	if sum >= hostBound*target {
		s := target / sum
		for i := range t {
			t[i] *= s
		}
		return
	}
	lo, hi := 0.0, target/float64(len(t))+maxOf(t)
	total := func(h float64) float64 {
		var s float64
		for _, x := range t {
			s += max(x, h)
		}
		return s
	}
	for range 60 {
		mid := (lo + hi) / 2
		if total(mid) < target {
			lo = mid
		} else {
			hi = mid
		}
	}
	h := (lo + hi) / 2
	var s float64
	for i := range t {
		t[i] = max(t[i], h)
		s += t[i]
	}
	for i := range t {
		t[i] *= target / s
	}
}

func maxOf(t []float64) float64 {
	m := 0.0
	for _, x := range t {
		m = max(m, x)
	}
	return m
}

// Tokens is the learned per-token estimator: each op token (name and
// overload) weighs its mean time in one profiled iteration, applied to
// another. It is exact when shapes do not change and blind when they do.
type Tokens struct {
	Weight map[string]float64
	// Mean is the weight of a token the profile did not see.
	Mean float64
}

// LearnTokens learns per-token weights from the per-op times measuredUS of
// a profiled iteration.
func LearnTokens(it *trace.Iteration, measuredUS []float64) *Tokens {
	sum := map[string]float64{}
	n := map[string]float64{}
	var all float64
	for i := range it.Ops {
		if i >= len(measuredUS) {
			break
		}
		k := tokenKey(&it.Ops[i])
		sum[k] += measuredUS[i]
		n[k]++
		all += measuredUS[i]
	}
	t := &Tokens{Weight: make(map[string]float64, len(sum))}
	for k, s := range sum {
		t.Weight[k] = s / n[k]
	}
	if len(it.Ops) > 0 {
		t.Mean = all / float64(min(len(it.Ops), len(measuredUS)))
	}
	return t
}

func tokenKey(op *trace.Op) string { return op.Name + "." + op.Overload }

// phaseKey is the token within its phase: a backward GEMM reads transposed
// operands and a backward elementwise op often works in fp32, so the same
// token reaches a different share of the roofline in each phase.
func phaseKey(op *trace.Op) string { return op.Phase.String() + ":" + tokenKey(op) }

// Estimate implements Estimator.
func (t *Tokens) Estimate(it *trace.Iteration) []float64 {
	out := make([]float64, len(it.Ops))
	var sum float64
	for i := range it.Ops {
		w, ok := t.Weight[tokenKey(&it.Ops[i])]
		if !ok {
			w = t.Mean
		}
		out[i] = w
		sum += w
	}
	fit(out, sum, it.TimeMS*1000, 0)
	return out
}

// GroupTimes sums per-op times into per-group times.
func GroupTimes(groups []Group, perOp []float64) []float64 {
	out := make([]float64, len(groups))
	for g, gr := range groups {
		for i := gr.First; i <= gr.Last && i < len(perOp); i++ {
			out[g] += perOp[i]
		}
	}
	return out
}

package pytorch

import (
	"bytes"
	"compress/gzip"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/trace"
)

const (
	etFile     = "testdata/llama4-small.et.json.gz"
	kinetoFile = "testdata/llama4-small.kineto.json.gz"
	// ../shared/traces relative to the module root.
	sharedDir = "../../../shared/traces"
)

func loadReal(t *testing.T) *Result {
	t.Helper()
	res, err := LoadFiles(etFile, kinetoFile)
	require.NoError(t, err)
	return res
}

func TestRealFiles(t *testing.T) {
	res := loadReal(t)
	tr := res.Trace
	require.Len(t, tr.Iterations, 1)
	it := tr.Iterations[0]
	assert.Equal(t, Format, tr.Header.Format)
	assert.Equal(t, "NVIDIA H200", tr.Header.Device)
	assert.Equal(t, "1.1.1-chakra.0.0.4", res.Schema)
	require.Len(t, it.Ops, 882)
	assert.Equal(t, 882, res.MatchedOps, "every top-level op has its Kineto cpu_op")
	assert.Zero(t, res.UnattributedKernelUS, "every kernel was launched under a top-level op")
	assert.InDelta(t, 3489.9, res.KernelUS, 0.1)

	assert.Equal(t, "aten::embedding", it.Ops[0].Name)
	assert.Equal(t, "aten::_fused_adamw_", it.Ops[len(it.Ops)-1].Name)
	phaseCount := map[trace.Phase]int{}
	for i, op := range it.Ops {
		assert.Equal(t, i, op.Seq)
		phaseCount[op.Phase]++
		oi := res.Ops[i]
		if oi.Kernels > 0 {
			assert.Equal(t, oi.KernelUS, op.DurUS)
		} else {
			assert.Equal(t, oi.CPUDurUS, op.DurUS)
		}
		if op.Phase == trace.PhaseBackward && op.Name != "aten::ones_like" {
			assert.NotEmpty(t, op.Module, "backward op %d", i)
		}
	}
	assert.Equal(t, map[trace.Phase]int{trace.PhaseForward: 285, trace.PhaseBackward: 595, trace.PhaseOptimizer: 2}, phaseCount)

	// The grad seed of loss.backward() runs on the main thread and is bwd;
	// the next op runs on the autograd thread.
	k := slices.IndexFunc(it.Ops, func(op trace.Op) bool { return op.Phase == trace.PhaseBackward })
	assert.Equal(t, "aten::ones_like", it.Ops[k].Name)
	assert.Equal(t, "aten::nll_loss_backward", it.Ops[k+1].Name)
	assert.Equal(t, "#NllLossBackward0", it.Ops[k+1].Module)

	// cross_entropy_loss returns the loss only; the log_softmax result and
	// nll_loss's total weight it makes inside and saves for backward become
	// its outputs too, read by the backward ops.
	ce := slices.IndexFunc(it.Ops, func(op trace.Op) bool { return op.Name == "aten::cross_entropy_loss" })
	nllb := slices.IndexFunc(it.Ops, func(op trace.Op) bool { return op.Name == "aten::nll_loss_backward" })
	lsb := slices.IndexFunc(it.Ops, func(op trace.Op) bool { return op.Name == "aten::_log_softmax_backward_data" })
	out := it.Ops[ce].Out
	require.Len(t, out, 3)
	logp := out[slices.IndexFunc(out, func(id trace.TensorID) bool { return it.Tensors[id].Bytes == 1024*32000*4 })]
	assert.Contains(t, it.Ops[lsb].In, logp)
	assert.Contains(t, it.Ops[nllb].In, logp)
	for _, id := range out {
		assert.Equal(t, trace.KindActivation, it.Tensors[id].Kind)
	}

	// Overloads come from op_schema.
	over := map[string]bool{}
	for _, op := range it.Ops {
		if op.Name == "aten::to" {
			over[op.Overload] = true
		}
	}
	assert.Equal(t, map[string]bool{"dtype": true, "device": true, "dtype_layout": true}, over)

	// In-place grad accumulation keeps the id of the storage it adds into.
	for _, op := range it.Ops {
		if op.Name == "aten::add_" {
			require.NotEmpty(t, op.Out)
			assert.Equal(t, op.In[0], op.Out[0])
		}
	}

	// Every op's refs name known tensors; ids are unique per allocation, so
	// a tensor is produced by at most one op.
	producer := map[trace.TensorID]int{}
	for i, op := range it.Ops {
		for _, id := range append(slices.Clone(op.In), op.Out...) {
			require.NotNil(t, it.Tensor(id), "op %d ref %d", i, id)
		}
		for _, id := range op.Out {
			if !slices.Contains(op.In, id) {
				_, dup := producer[id]
				assert.False(t, dup, "tensor %d produced twice", id)
				producer[id] = i
			}
		}
	}

	// Memory: the curve starts at the allocated bytes after the embedding
	// and peaks at the backward's largest allocation.
	require.True(t, it.HasMem())
	assert.Equal(t, int64(737233408), it.Ops[0].Mem)
	assert.Equal(t, int64(1323298304), it.PeakBytes)
	// The profiled step spans 80.7 ms for 3.49 ms of kernels: host-bound
	// under the profiler, so the iteration is timed by its kernels and
	// the span is kept as its wall time.
	assert.InDelta(t, 80.72, it.WallMS, 0.01)
	assert.InDelta(t, 3.49, it.TimeMS, 0.01)
}

func TestRealHostBoundWarns(t *testing.T) {
	res := loadReal(t)
	require.Len(t, res.Warnings, 1)
	assert.Contains(t, res.Warnings[0], "llama4-small.kineto.json.gz: the profiled step spans 80.7 ms but its kernels take 3.49 ms (4%)")
	assert.Contains(t, res.Warnings[0], "iteration 0 is planned on its kernel timeline (3.49 ms)")
	assert.InDelta(t, 80.72, res.SpanMS, 0.01)
}

func TestPlainAndGzipAgree(t *testing.T) {
	plain := func(path string) []byte {
		f, err := os.Open(path)
		require.NoError(t, err)
		defer f.Close()
		zr, err := gzip.NewReader(f)
		require.NoError(t, err)
		b, err := io.ReadAll(zr)
		require.NoError(t, err)
		return b
	}
	tr, err := ImportReaders(bytes.NewReader(plain(etFile)), "et.json", bytes.NewReader(plain(kinetoFile)), "kineto.json")
	require.NoError(t, err)
	gz, err := Import(etFile, kinetoFile)
	require.NoError(t, err)
	assert.Equal(t, gz.Iterations[0].Ops, tr.Iterations[0].Ops)
	assert.Equal(t, "et.json", tr.Name)
}

func TestRealMismatched(t *testing.T) {
	// The ET against a Kineto profile of other operators: the hand-made one.
	_, err := Load(openFile(t, etFile), "llama4-small.et.json.gz", bytes.NewReader(smallKineto(0)), "other.kineto.json")
	require.ErrorIs(t, err, ErrMismatched)
	assert.Contains(t, err.Error(), "other.kineto.json")
}

func TestRealTruncated(t *testing.T) {
	b, err := os.ReadFile(kinetoFile)
	require.NoError(t, err)
	for _, cut := range []int{len(b) - 1, len(b) - 8, len(b) / 3} {
		_, err := Load(openFile(t, etFile), "et", bytes.NewReader(b[:cut]), "llama4-small.kineto.json.gz")
		require.Error(t, err)
		assert.Contains(t, err.Error(), "llama4-small.kineto.json.gz")
	}
}

func openFile(t *testing.T, path string) io.Reader {
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return bytes.NewReader(b)
}

// TestAgreesWithOptrace compares the import with the optrace recording of
// the same model (llama4-small.jsonl.gz).
//
// The recorders see different levels. The optrace recorder is a
// TorchDispatchMode below autograd: it sees what composite operators
// decompose into (aten::linear is aten::t + aten::mm + views, aten::to is
// aten::_to_copy, scaled_dot_product_attention is
// _scaled_dot_product_cudnn_attention, reshape/narrow are view/slice...).
// The ET's top-level ops are the composites themselves. So op counts are
// compared per (name, phase) on the names both define alike: names the
// optrace recorder sees (not composites) that no ET composite of that phase
// decomposes into. In-place variants are folded into their base name
// (autograd accumulates gradients with add_, out of place under a dispatch
// mode), and detach is left out (autograd and the dispatch mode detach
// saved tensors in their own bookkeeping).
func TestAgreesWithOptrace(t *testing.T) {
	opPath := filepath.Join(sharedDir, "llama4-small.jsonl.gz")
	if _, err := os.Stat(opPath); err != nil {
		t.Skipf("%s absent: %v", opPath, err)
	}
	ot, err := trace.ReadFile(opPath)
	require.NoError(t, err)
	res, err := LoadFiles(filepath.Join(sharedDir, "llama4-small.et.json.gz"), filepath.Join(sharedDir, "llama4-small.kineto.json.gz"))
	require.NoError(t, err)
	it := res.Trace.Iterations[0]

	// The ET tree, to know what each composite decomposes into.
	f, err := os.Open(etFile)
	require.NoError(t, err)
	defer f.Close()
	r, closeFn, err := decompress(f, etFile)
	require.NoError(t, err)
	doc, err := readET(r, etFile)
	require.NoError(t, err)
	require.NoError(t, closeFn())
	b := &builder{doc: doc, etName: etFile}
	require.NoError(t, b.walk())
	phases := b.phases()

	type key struct {
		name  string
		phase trace.Phase
	}
	seen := map[string]bool{}
	for _, o := range ot.Iterations {
		for _, op := range o.Ops {
			seen[op.Name] = true
		}
	}
	composite := func(name string) bool { return !seen[name] && !seen[base(name)] }
	// What the dispatch mode sees of a composite: its aten descendants,
	// through nested composites, down to the first non-composite.
	decomposed := map[key]bool{}
	children := map[int64][]int{}
	for i, n := range doc.nodes {
		if n.hasParent && n.parent != n.id {
			children[n.parent] = append(children[n.parent], i)
		}
	}
	var visit func(i int, ph trace.Phase)
	visit = func(i int, ph trace.Phase) {
		for _, c := range children[doc.nodes[i].id] {
			n := doc.nodes[c]
			if !isAten(n.name) {
				continue
			}
			decomposed[key{base(n.name), ph}] = true
			if composite(n.name) {
				visit(c, ph)
			}
		}
	}
	for k, i := range b.tops {
		if composite(doc.nodes[i].name) {
			visit(i, phases[k])
		}
	}

	for iter, o := range ot.Iterations {
		et, opc := map[key]int{}, map[key]int{}
		for _, op := range it.Ops {
			et[key{base(op.Name), op.Phase}]++
		}
		for _, op := range o.Ops {
			opc[key{base(op.Name), op.Phase}]++
		}
		compared, equal := 0, 0
		for k, n := range et {
			if composite(k.name) || decomposed[k] || k.name == "aten::detach" {
				continue
			}
			compared += n
			if opc[k] == n {
				equal += n
			}
			assert.InDelta(t, opc[k], n, math.Max(1, 0.02*float64(n)), "iteration %d: %s %s", iter, k.name, k.phase)
		}
		t.Logf("iteration %d: %d of %d ET ops in the compared set, %d with equal counts", iter, compared, len(it.Ops), equal)
		assert.Greater(t, compared, len(it.Ops)/2)
	}

	// Memory: the same peak and curve top.
	o := ot.Iterations[0]
	maxMem := func(ops []trace.Op) (m int64) {
		for _, op := range ops {
			m = max(m, op.Mem)
		}
		return m
	}
	assert.InEpsilon(t, o.PeakBytes, it.PeakBytes, 0.05)
	assert.InEpsilon(t, maxMem(o.Ops), maxMem(it.Ops), 0.05)
	assert.InEpsilon(t, o.Ops[0].Mem, it.Ops[0].Mem, 0.01, "allocated after the embedding")

	// Tensor kinds: the same parameters, optimizer state and inputs.
	kinds := func(ts map[trace.TensorID]*trace.Tensor) (n map[trace.Kind]int, bytes map[trace.Kind]int64) {
		n, bytes = map[trace.Kind]int{}, map[trace.Kind]int64{}
		for _, t := range ts {
			n[t.Kind]++
			bytes[t.Kind] += t.Bytes
		}
		return n, bytes
	}
	on, ob := kinds(o.Tensors)
	en, eb := kinds(it.Tensors)
	for _, k := range []trace.Kind{trace.KindParam, trace.KindOptState, trace.KindInput} {
		assert.Equal(t, on[k], en[k], "%s count", k)
		assert.Equal(t, ob[k], eb[k], "%s bytes", k)
	}

	// Time of the large ops. The optrace dur_us syncs the device after
	// every op, adding a floor of some 40-60 µs here, so only ops well above
	// it compare: the fused AdamW step, and the ranking of the matrix
	// multiplies (the three largest are the lm_head's in both).
	dur := func(ops []trace.Op, name string) float64 {
		s := 0.0
		for _, op := range ops {
			if op.Name == name {
				s += op.DurUS
			}
		}
		return s
	}
	for _, o := range ot.Iterations {
		assert.InEpsilon(t, dur(o.Ops, "aten::_fused_adamw_"), dur(it.Ops, "aten::_fused_adamw_"), 0.2)
	}
	largestMM := func(it *trace.Iteration) []int64 {
		var ops []trace.Op
		for _, op := range it.Ops {
			if op.Name == "aten::mm" || op.Name == "aten::linear" {
				ops = append(ops, op)
			}
		}
		sort.Slice(ops, func(i, j int) bool { return ops[i].DurUS > ops[j].DurUS })
		var big []int64
		for _, op := range ops[:3] {
			m := int64(0)
			for _, id := range op.In {
				m = max(m, it.Tensors[id].Bytes)
			}
			big = append(big, m)
		}
		return big
	}
	lmHead := int64(32000 * 1024 * 2)
	assert.Equal(t, []int64{lmHead, lmHead, lmHead}, largestMM(it))
	assert.Equal(t, []int64{lmHead, lmHead, lmHead}, largestMM(o))
}

// base folds an in-place variant into its operator: aten::add_ -> aten::add.
func base(name string) string {
	if len(name) > 1 && name[len(name)-1] == '_' && name[len(name)-2] != '_' {
		return name[:len(name)-1]
	}
	return name
}
